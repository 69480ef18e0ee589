"""Sharded checkpoints (FSDP runs): torch.distributed.checkpoint (DCP) directories beside the single files.
Every rank writes its shards and DCP reshards on load; a save swaps a temp directory in (docs/design.md).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from checkpoint.file import (BEST_DCP, DCP_META, LAST_DCP, CheckpointError, _save_error,  # noqa: F401
                             is_sharded_checkpoint, read_checkpoint, save_checkpoint)
from checkpoint.meta import write_meta
from common.files import replace, replace_dir
from model.gpt import check_weights, clean_state_dict

_GIVE_SHARDED = "give an FSDP run directory (it holds last_dcp/), or its last_dcp/ or best_dcp/"


@contextlib.contextmanager
def _quiet_single_process():
    """Without a process group DCP saves and loads in this process alone, and warns each time ("assuming the intent
    is ..."): that is our intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield


def _beside(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}")


def recover_sharded(run_dir: str | os.PathLike) -> None:
    """Rank 0 at start: finish a directory swap a kill interrupted, drop half-written temp dirs."""
    for name in (LAST_DCP, BEST_DCP):
        path = Path(run_dir) / name
        old, tmp = _beside(path, "old"), _beside(path, "tmp")
        if not path.exists() and is_sharded_checkpoint(tmp):
            replace(tmp, path)  # the new checkpoint was complete: publish it
        elif not path.exists() and old.exists():
            replace(old, path)
        for d in (old, tmp):
            shutil.rmtree(d, ignore_errors=True)


def _link_dir(src: Path, dst: Path) -> None:
    """`dst` holds the same files as `src` (hard links; copies where links fail), swapped in whole."""
    tmp = _beside(dst, "tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        try:
            os.link(f, tmp / f.name)
        except OSError:
            shutil.copy2(f, tmp / f.name)
    replace_dir(tmp, dst, _beside(dst, "old"))


def save_sharded(path: str | os.PathLike, model: torch.nn.Module, optimizer, meta: dict, *, ranks: Any,
                 best_path: str | os.PathLike | None = None) -> Path:
    """A DCP checkpoint of model + optimizer (every rank writes its shards) + `meta` (rank 0), swapped in
    whole; `best_path` also gets it (hard links). Collective: every rank calls it; `ranks`: runtime.ranks.Ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    path = Path(path)
    tmp = _beside(path, "tmp")
    try:
        if ranks.is_main and tmp.exists():
            shutil.rmtree(tmp)
        ranks.barrier()
        msd, osd = get_state_dict(model, optimizer)
        with _quiet_single_process():  # returns once every rank's shards are written
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(tmp))
        if ranks.is_main:
            write_meta(meta, tmp / DCP_META)
            replace_dir(tmp, path, _beside(path, "old"))
            if best_path is not None:
                _link_dir(path, Path(best_path))
    except OSError as e:
        raise _save_error(path, e) from None
    finally:
        ranks.barrier()
    return path


def load_sharded(path: str | os.PathLike, model: torch.nn.Module, optimizer) -> None:
    """Load a DCP checkpoint into `model` and `optimizer` in their current layout (FSDP shards of any
    world size, DDP or a plain module: DCP reshards). Collective when distributed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optimizer": osd}
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps per-rank failures
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"the sharded checkpoint {path} does not fit this model ({first}): resume with the "
                         f"settings it was trained with") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_model_state_dict(model: torch.nn.Module) -> dict:
    """The complete weights of an FSDP-sharded model on rank 0's CPU (a collective; other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_model_state(model: torch.nn.Module, state_dict: dict, source: str = "the checkpoint") -> None:
    """Complete (single-file) weights into an FSDP-sharded model: each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    sd = check_weights(model, state_dict, source)
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True))


def load_full_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    """An ordinary (index-keyed, unsharded) optimizer state_dict into an FSDP-sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = {id(p): n for n, p in model.named_parameters()}
    index_to_name = dict(enumerate(names[id(p)] for g in optimizer.param_groups for p in g["params"]))
    groups = [dict(g, params=[index_to_name[int(j)] for j in g["params"]]) for g in state["param_groups"]]
    fqn_state = {"state": {index_to_name[int(k)]: v for k, v in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, fqn_state, options=StateDictOptions(full_state_dict=True))


def _export_source(src: Path) -> Path:
    """The sharded directory `export SRC` reads: SRC or SRC/last_dcp; else a CheckpointError saying what to give."""
    if not src.exists():
        raise CheckpointError(f"{src} does not exist: {_GIVE_SHARDED}")
    if src.is_file():
        raise CheckpointError(f"{src} is a file, but export reads a sharded checkpoint directory: {_GIVE_SHARDED} "
                              f"(a .pt file is already a single-file checkpoint: use it as it is)")
    if is_sharded_checkpoint(src):
        return src
    if (src / LAST_DCP).exists():
        src = src / LAST_DCP  # said below if incomplete
    elif (src / "last.pt").is_file():
        raise CheckpointError(f"{src} has no {LAST_DCP}/, so there is nothing to export: only FSDP runs "
                              f"(train.parallel=fsdp) write sharded checkpoints; its last.pt is already a "
                              f"single-file checkpoint (use it as it is)")
    if not is_sharded_checkpoint(src):
        raise CheckpointError(f"{src} is not a sharded tinygpt checkpoint (no .metadata and {DCP_META}): "
                              f"{_GIVE_SHARDED}")
    return src


def export_single_file(src: str | os.PathLike, out: str | os.PathLike | None,
                       make_optimizer: Callable[[torch.nn.Module, dict], torch.optim.Optimizer]) -> Path:
    """Offline, one CPU process: a sharded checkpoint (or run dir with last_dcp/) -> one complete checkpoint.
    `make_optimizer(model, optim_config)` builds the run's optimizer, so the state has the layout a resume expects."""
    from model.config import GPTConfig
    from model.gpt import GPT
    shard = _export_source(Path(src))
    meta = read_checkpoint(shard)[1]
    out = Path(out) if out is not None else shard.parent / f"{shard.name.removesuffix('_dcp')}_full.pt"
    model = GPT(GPTConfig.from_dict(dict(meta["model_config"])))
    optimizer = make_optimizer(model, (meta.get("config") or {}).get("optim") or {})
    load_sharded(shard, model, optimizer)
    state = {k: v for k, v in meta.items() if k != "sharded"}
    state.update(model=clean_state_dict(model.state_dict()), optimizer=optimizer.state_dict())
    return save_checkpoint(state, out)

