"""Scale-out on PyTorch's own engine: torchrun + torch.distributed (DDP), FSDP2 and distributed checkpoints.

Nothing here is home-made machinery: process launch, rendezvous and failure handling are torchrun's;
gradient averaging is DistributedDataParallel's or FSDP2's (`fully_shard`); sharded checkpoints are
`torch.distributed.checkpoint` (DCP). This module only decides how tinygpt uses them.

Design:
- Launch: `torchrun ... train.py` sets RANK / WORLD_SIZE / LOCAL_RANK (and MASTER_ADDR/PORT); `init()`
  reads them and starts the default process group: NCCL when training on CUDA (device cuda:LOCAL_RANK,
  bound with `device_id`), gloo on CPU. A second, CPU-only gloo group carries the control plane (the
  stop flag, per-rank RNG states, barriers; 60-minute timeout, so rank 0 may prepare a large dataset
  while the others wait), so it never touches the GPU stream. `destroy()` ends the group
  (`destroy_process_group`); callers run it in a `finally`, so errors and signals end it too. A plain
  `python train.py` never starts a process group: the single-process path is unchanged. train.py
  starts the group before Hydra (so every rank runs in rank 0's run directory); `init()` is
  idempotent, so `training.loop.train()` reuses it, or starts (and ends) one when called directly.
- `train.parallel`: `none` (default: DDP when WORLD_SIZE > 1, else a single process), `ddp`, `fsdp`.
  DDP: `DistributedDataParallel(model, device_ids=[local_rank] on CUDA, forward_sync_buffers=False)`;
  its constructor broadcasts rank 0's weights. FSDP2: `fully_shard` on every transformer Block, then on
  the root (embeddings, final norm, tied head); on CUDA with bf16 the `MixedPrecisionPolicy` gathers
  parameters in bf16 and reduces gradients in fp32; weights and optimizer state stay fp32 shards.
  fp16 (GradScaler) is refused with FSDP: its inf checks would differ per shard. The optimizer is built
  after sharding (its parameters are the DTensor shards).
- Gradient accumulation: `grad_sync(model, last)` is DDP's `no_sync()` on all but the last micro-step,
  and for FSDP2 `set_requires_gradient_sync(False)` on those steps (gradients accumulate unsharded and
  are reduce-scattered once); a null context in a single process.
- Numbers that must agree across ranks are all-reduced where they are read, never in the hot loop: the
  train-loss window at log steps, the eval sums (rank r evaluates batches i % world_size == r; with FSDP
  every rank runs the same number of forwards, padding with uncounted ones, because each forward is a
  collective), the finite-weights check before a save.
- Stopping: SIGINT/SIGTERM may reach one rank or all of them at slightly different steps (torchrun
  forwards a signal to every worker, then waits 30 s before SIGKILL). `StopAgreement` posts each rank's
  signal number in an asynchronous MAX all-reduce on the CPU gloo group at every step boundary and reads
  the result at the next one, so every rank stops after the same step (at most one step after the
  signal), with no GPU synchronisation; then rank 0 writes last.pt.
- RNG: the model is initialised from `train.seed` on every rank (identical weights), then rank r
  reseeds torch with `seed + rank`, so dropout masks differ per rank and are reproducible; a single
  process keeps exactly the old stream. Checkpoints keep rank 0's states under "rng" (as single-process
  ones) plus every rank's under "rng_ranks" (a list of the same plain dicts). Resuming on the same world
  size restores each rank's own state (bitwise continuation); on a different world size rank 0 takes
  "rng" and rank r > 0 a torch stream seeded from (seed, rank, step): deterministic, though with dropout
  > 0 not identical to the uninterrupted run (the masks are drawn per rank anyway).
- Checkpoints. DDP: the weights are identical on every rank, so rank 0 writes the ordinary single-file
  last.pt (optimizer included); the loader state is global (step, micro), so it resumes on any world
  size. FSDP: every save writes a DCP checkpoint `<run_dir>/last_dcp/` (model + optimizer via
  `get_state_dict`, each rank writing its shards in parallel, plus `tinygpt.pt` with the plain
  metadata: step, loader, RNGs, config, tokenizer...) into a temp dir that is then swapped in, and
  `best_dcp/` as hard links on val improvement. DCP reshards on load, so a sharded checkpoint resumes
  on any world size, and also in DDP or a single process. Each FSDP save also exports `last.pt`: the
  full weights gathered to rank 0's CPU (`get_model_state_dict(full_state_dict=True,
  cpu_offload=True)`), optimizer omitted, so `sample.py` reads it like any checkpoint. Cost: one
  all-gather of the weights plus writing model-size bytes per save (no optimizer state: 1/3 of a full
  checkpoint). `python -m training.distributed export RUN_DIR` turns last_dcp into a complete
  single-file checkpoint (optimizer included, resumable anywhere) offline, without a process group.
  With several machines the run directory must be on a filesystem every node sees (each rank writes
  its own shards; every rank reads the checkpoint it resumes from).
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from training.optim import with_impl_flags

PARALLEL_MODES = ("none", "ddp", "fsdp")
DCP_META = "tinygpt.pt"  # the plain metadata file inside a sharded checkpoint directory
LAST_DCP = "last_dcp"
BEST_DCP = "best_dcp"


# ------------------------------------------------------------------------------------------- the process

@dataclass
class DistInfo:
    """This process's place in the job. A single process is rank 0 of 1 with parallel="none"."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    parallel: str = "none"  # resolved: none | ddp | fsdp
    backend: Optional[str] = None  # nccl | gloo | None (no process group)
    owns_group: bool = False  # init() started the process group, so destroy() ends it
    control_group: Any = None  # CPU gloo group for the stop flag and RNG gathering

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group is in use (parallel is ddp or fsdp)."""
        return self.parallel != "none"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a whole number: launch with torchrun, "
                         f"which sets it (torchrun --standalone --nproc_per_node=N train.py ...)") from None


def env_info() -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) from torchrun's environment (0, 1, 0, 1 without)."""
    ws = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_ws = _env_int("LOCAL_WORLD_SIZE", ws)
    if ws < 1 or not 0 <= rank < ws:
        raise ValueError(f"RANK={rank} / WORLD_SIZE={ws} are inconsistent: launch with torchrun "
                         f"(torchrun --standalone --nproc_per_node=N train.py ...)")
    return rank, ws, local_rank, local_ws


def launched_by_torchrun() -> bool:
    """True under torchrun (or any launcher that sets the env:// variables), even with one process."""
    return "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ


def resolve_parallel(spec: str, world_size: int, launched: bool) -> str:
    """`train.parallel` -> the mode this process runs: none | ddp | fsdp."""
    if spec not in PARALLEL_MODES:
        raise ValueError(f"train.parallel={spec!r} is not valid: use none (DDP under torchrun), ddp or fsdp")
    if world_size > 1 and not launched:
        raise ValueError(f"WORLD_SIZE={world_size} is set but MASTER_ADDR/MASTER_PORT are not: launch with "
                         f"torchrun (torchrun --standalone --nproc_per_node={world_size} train.py ...)")
    if spec == "fsdp":
        if not launched:
            raise ValueError("train.parallel=fsdp needs a torchrun launch: torchrun --standalone "
                             "--nproc_per_node=N train.py train.parallel=fsdp ... (N = number of GPUs)")
        return "fsdp"
    if spec == "ddp":
        return "ddp" if launched else "none"
    return "ddp" if world_size > 1 else "none"


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(device: torch.device, parallel: str = "none", timeout_s: Optional[float] = None) -> DistInfo:
    """Join the torchrun job (idempotent: reuses a process group that is already running).

    Single process (no torchrun, or torchrun with one process and parallel=none): no process group.
    """
    rank, ws, local_rank, local_ws = env_info()
    mode = resolve_parallel(parallel, ws, launched_by_torchrun())
    info = DistInfo(rank=rank, world_size=ws, local_rank=local_rank, local_world_size=local_ws, parallel=mode)
    if mode == "none":
        return info
    if device.type == "mps":
        raise ValueError("multi-process training does not support Apple's MPS device: use train.device=cpu "
                         "(gloo) or CUDA GPUs (NCCL)")
    if device.type == "cuda" and device.index != local_rank % max(1, torch.cuda.device_count()):
        raise ValueError(f"train.device={device} but this process is LOCAL_RANK={local_rank}: use "
                         f"train.device=cuda (or auto) so each process takes cuda:LOCAL_RANK")
    if not dist.is_initialized():
        backend = backend_for(device)
        kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        if device.type == "cuda":
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        dist.init_process_group(backend=backend, **kwargs)
        info.owns_group = True
    info.backend = dist.get_backend()
    if (dist.get_rank(), dist.get_world_size()) != (rank, ws):
        raise ValueError(f"the running process group (rank {dist.get_rank()} of {dist.get_world_size()}) does not "
                         f"match RANK={rank} WORLD_SIZE={ws}: launch with torchrun")
    info.control_group = _control_group()
    return info


_CONTROL_GROUP = None


CONTROL_TIMEOUT = timedelta(minutes=60)  # rank 0 may prepare a large dataset while the others wait


def _control_group():
    """A CPU gloo group beside the default one (reused while the default group lives)."""
    global _CONTROL_GROUP
    if _CONTROL_GROUP is None:
        _CONTROL_GROUP = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return _CONTROL_GROUP


def destroy(info: Optional[DistInfo]) -> None:
    """End the process group if this DistInfo started it. Safe to call twice and after errors."""
    global _CONTROL_GROUP
    if info is None or not info.owns_group:
        return
    info.owns_group = False
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down after an error must not hide that error
            pass
    _CONTROL_GROUP = None


@contextlib.contextmanager
def process_group(device: torch.device, parallel: str = "none"):
    """`with process_group(device, parallel) as info:` init + destroy in a finally."""
    info = init(device, parallel)
    try:
        yield info
    finally:
        destroy(info)


def barrier(info: DistInfo) -> None:
    """All ranks meet (on the CPU control group: no GPU work, a 60-minute timeout)."""
    if info.distributed:
        dist.barrier(group=info.control_group)


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """In-place sum over ranks (no-op in a single process)."""
    if info.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """In-place mean over ranks (no-op in a single process)."""
    if info.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(info.world_size)
    return t


def broadcast_object(obj: Any, info: DistInfo, src: int = 0) -> Any:
    """Rank `src`'s (picklable) object on every rank, over the CPU control group."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=info.control_group)
    return box[0]


@contextlib.contextmanager
def main_first(info: DistInfo, local: bool = True):
    """Run the body on (local) rank 0 first, then on the others (e.g. preparing a shared cache)."""
    first = (info.local_rank if local else info.rank) == 0
    if not first:
        barrier(info)
    try:
        yield
    finally:
        if first:
            barrier(info)


def describe(info: DistInfo) -> str:
    if not info.distributed:
        return "single process"
    what = {"ddp": "DDP", "fsdp": "FSDP2 (fully_shard per block)"}[info.parallel]
    return f"{what} over {info.world_size} process{'es' if info.world_size > 1 else ''} ({info.backend})"


# ------------------------------------------------------------------------------------------- the model

def check_dtype(info: DistInfo, dtype: torch.dtype) -> None:
    if info.parallel == "fsdp" and dtype == torch.float16:
        raise ValueError("train.parallel=fsdp does not support float16 with a GradScaler: use "
                         "train.dtype=bfloat16 (or float32), or train.parallel=ddp")


def _blocks(model: torch.nn.Module):
    return list(model.transformer.h)


def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device,
               dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The module the training step calls: DDP(model), or `model` itself sharded in place by FSDP2.

    `model` must already be on `device` and hold the starting weights. For FSDP build the optimizer
    after this call (its parameters become DTensor shards); for DDP the parameters stay the same objects.
    """
    if info.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [device.index] if device.type == "cuda" else None
        kw = {}
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # newer torch only
            # buffers are synced once at init; the model has no running statistics to re-broadcast
            kw["forward_sync_buffers"] = False
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True, **kw)
    if info.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        check_dtype(info, dtype)
        # the mesh on the device the run uses: fully_shard's default mesh is CUDA whenever a GPU exists
        kw = {"mesh": init_device_mesh(device.type, (info.world_size,))}
        if device.type == "cuda" and dtype == torch.bfloat16:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in _blocks(model):
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        return model
    return model


def grad_sync(model: torch.nn.Module, info: DistInfo, last: bool):
    """Context for one micro-step's forward+backward: gradients are reduced only when `last`."""
    if info.parallel == "ddp" and not last:
        inner = getattr(model, "_orig_mod", model)  # torch.compile(DDP(...)) -> DDP
        return inner.no_sync()
    if info.parallel == "fsdp":
        return _fsdp_sync(model, last)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_sync(model: torch.nn.Module, last: bool):
    inner = getattr(model, "_orig_mod", model)
    inner.set_requires_gradient_sync(last)
    try:
        yield
    finally:
        if not last:
            inner.set_requires_gradient_sync(True)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def weights_finite(params: list[torch.Tensor], info: DistInfo) -> bool:
    """All weights finite, on every rank (FSDP: each rank checks its shards; one MIN all-reduce)."""
    local = [_local(p.detach()) for p in params]
    local = [t for t in local if t.numel()]
    ok = True
    if local:
        total = torch.nn.utils.get_total_norm(local, foreach=True)
        ok = bool(torch.isfinite(total).item())
    if info.distributed:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=info.control_group)
        ok = bool(flag.item())
    return ok


def eval_plan(n: int, info: DistInfo) -> list[tuple[int, bool]]:
    """This rank's eval batches as (index, counted): i % world_size == rank; with FSDP padded with
    uncounted repeats so every rank runs the same number of forwards (each is a collective)."""
    mine = [(i, True) for i in range(info.rank, n, info.world_size)]
    if info.parallel == "fsdp":
        per_rank = math.ceil(n / info.world_size)
        mine += [(0, False)] * (per_rank - len(mine))
    return mine


# ------------------------------------------------------------------------------------------- stopping

class StopAgreement:
    """Every rank stops after the same step: an async MAX all-reduce of the signal number per step.

    `poll(signum)` at each step boundary returns the agreed signal number (0 = go on). The value posted
    at boundary k is read at boundary k+1, so the all-reduce overlaps a whole step and costs no sync.
    """

    def __init__(self, info: DistInfo):
        self.info = info
        self._work = None
        self._buf = None

    def poll(self, signum: Optional[int]) -> int:
        mine = int(signum or 0)
        if not self.info.distributed:
            return mine
        agreed = 0
        if self._work is not None:
            self._work.wait()
            agreed = int(self._buf.item())
            self._work = None
        if agreed:
            return agreed
        self._buf = torch.tensor([mine], dtype=torch.int64)
        self._work = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self.info.control_group,
                                     async_op=True)
        return 0

    def finish(self) -> None:
        """Wait for the all-reduce in flight (every rank has exactly one), so none is left behind."""
        if self._work is not None:
            try:
                self._work.wait()
            finally:
                self._work = None


# ------------------------------------------------------------------------------------------- RNG

def gather_rng_states(info: DistInfo) -> Optional[list]:
    """Every rank's RNG states (capture_rng_state dicts) on every rank; None in a single process."""
    if not info.distributed:
        return None
    from checkpoint.file import capture_rng_state
    out = [None] * info.world_size
    dist.all_gather_object(out, capture_rng_state(), group=info.control_group)
    return out


def _seed_for(*parts) -> int:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def rank_rng_state(ckpt: dict, info: DistInfo, seed: int) -> Optional[dict]:
    """The RNG state this rank restores when resuming from `ckpt` (see the module docstring)."""
    base = ckpt.get("rng")
    if base is None:
        return None
    ranks = ckpt.get("rng_ranks")
    if ranks and len(ranks) == info.world_size:
        return ranks[info.rank]
    if info.rank == 0:
        return base
    g = torch.Generator()
    g.manual_seed(_seed_for(int(seed), "dropout", info.rank, int(ckpt.get("step", 0))))
    return {**base, "torch": g.get_state(), "cuda": None}


# ------------------------------------------------------------------------------------------- checkpoints

def full_model_state_dict(model: torch.nn.Module, info: DistInfo) -> dict:
    """The complete weights on rank 0's CPU (a collective under FSDP; other ranks get {})."""
    if info.parallel == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    from checkpoint.file import clean_state_dict, unwrap_model
    return clean_state_dict(unwrap_model(model).state_dict())


def load_full_optimizer_state(model: torch.nn.Module, optimizer, state: dict, info: DistInfo) -> None:
    """Load an ordinary (index-keyed, unsharded) optimizer state_dict into an FSDP-sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = {id(p): n for n, p in model.named_parameters()}
    index_to_name, i = {}, 0
    for g in optimizer.param_groups:
        for p in g["params"]:
            index_to_name[i] = names[id(p)]
            i += 1
    groups = [dict(g, params=[index_to_name[int(j)] for j in g["params"]])
              for g in with_impl_flags(state["param_groups"], optimizer)]
    fqn_state = {"state": {index_to_name[int(k)]: v for k, v in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, fqn_state, options=StateDictOptions(full_state_dict=True))


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file() and (p / DCP_META).is_file()


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every single-process save/load ("assuming the intent is ..."): that is our intent."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield


def _tmp_dir(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _old_dir(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def recover_sharded(run_dir: str | os.PathLike) -> None:
    """Rank 0 at start: finish a directory swap a kill interrupted, drop half-written temp dirs."""
    for name in (LAST_DCP, BEST_DCP):
        path = Path(run_dir) / name
        old, tmp = _old_dir(path), _tmp_dir(path)
        if not path.exists() and is_sharded_checkpoint(tmp):
            os.rename(tmp, path)  # the new checkpoint was complete: publish it
        elif not path.exists() and old.exists():
            os.rename(old, path)
        for d in (old, tmp):
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)


def _publish_dir(tmp: Path, path: Path) -> None:
    """Replace directory `path` by `tmp` (rename the old one away, rename in, delete the old one)."""
    from data.sources import fsync_dir
    old = _old_dir(path)
    if old.exists():
        shutil.rmtree(old)
    if path.exists():
        os.rename(path, old)
    os.rename(tmp, path)
    fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def _link_dir(src: Path, dst: Path) -> None:
    """`dst` holds the same files as `src` (hard links; copies where links fail), swapped in atomically."""
    tmp = _tmp_dir(dst)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        try:
            os.link(f, tmp / f.name)
        except OSError:
            shutil.copy2(f, tmp / f.name)
    _publish_dir(tmp, dst)


def save_sharded(path: str | os.PathLike, model: torch.nn.Module, optimizer, meta: dict, info: DistInfo,
                 best_path: str | os.PathLike | None = None) -> Path:
    """A DCP checkpoint of model + optimizer (every rank writes its shards) + `meta` (rank 0), swapped in
    whole; `best_path` also gets it (hard links). Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from checkpoint.file import _save_error, save_checkpoint
    path = Path(path)
    tmp = _tmp_dir(path)
    try:
        if info.is_main and tmp.exists():
            shutil.rmtree(tmp)
        barrier(info)
        msd, osd = get_state_dict(model, optimizer)
        with _quiet_single_process():
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(tmp),  # returns once every shard is
                     no_dist=not info.distributed)  # written (its last step gathers every rank's results)
        if info.is_main:
            save_checkpoint(meta, tmp / DCP_META)
            _publish_dir(tmp, path)
            if best_path is not None:
                _link_dir(path, Path(best_path))
    except OSError as e:
        raise _save_error(path, e) from None
    finally:
        barrier(info)
    return path


_GIVE_SHARDED = "give an FSDP run directory (it holds last_dcp/), or its last_dcp/ or best_dcp/"


def read_sharded_meta(path: str | os.PathLike) -> dict:
    """The plain metadata of a sharded checkpoint directory (a tinygpt checkpoint dict without tensors)."""
    from checkpoint.file import CheckpointError, load_checkpoint
    p = Path(path)
    if not is_sharded_checkpoint(p):
        raise CheckpointError(f"{p} is not a sharded tinygpt checkpoint (no .metadata and {DCP_META}): {_GIVE_SHARDED}")
    return load_checkpoint(p / DCP_META)


def load_sharded(path: str | os.PathLike, model: torch.nn.Module, optimizer, info: DistInfo) -> None:
    """Load a DCP checkpoint into `model` and `optimizer` in their current layout (FSDP shards of any
    world size, DDP or a plain module: DCP reshards). Collective when distributed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": msd, "optimizer": osd} if optimizer is not None else {"model": msd}
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=str(path), no_dist=not info.distributed)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps per-rank failures
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"the sharded checkpoint {path} does not fit this model ({first}): resume with the "
                         f"settings it was trained with") from None
    if optimizer is not None:
        osd = dict(state["optimizer"], param_groups=with_impl_flags(state["optimizer"]["param_groups"], optimizer))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=osd)
    else:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        set_model_state_dict(model, state["model"])


def resume_source(spec: Any, run_dir: str | os.PathLike) -> Optional[tuple[str, Path]]:
    """`train.resume` -> ("file", last.pt) | ("sharded", dir) | None (no resume).

    true: the run dir's freshest resumable checkpoint (last.pt with optimizer state vs last_dcp/, by
    step; an FSDP run's last.pt is a weights-only export, so last_dcp/ wins there). A path: a file, a
    sharded directory, or a run directory (same rule).
    """
    from checkpoint.file import CheckpointError
    if spec is False or spec is None:
        return None
    d = Path(run_dir) if spec is True else Path(os.path.expanduser(str(spec)))
    if spec is not True and not d.is_dir():
        return ("file", d)
    if is_sharded_checkpoint(d):
        return ("sharded", d)
    last, shard = d / "last.pt", d / LAST_DCP
    has_shard = is_sharded_checkpoint(shard)
    if not last.is_file() and not has_shard:
        if spec is True:
            return ("file", last)  # the loop explains what to do
        raise CheckpointError(f"{d} is a directory without last.pt or last_dcp/: point at a run directory that "
                              f"has one, or at a checkpoint file")
    if not has_shard:
        return ("file", last)
    if not last.is_file():
        return ("sharded", shard)
    try:
        file_meta = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        file_ok = file_meta.get("optimizer") is not None
        file_step = int(file_meta.get("step", -1))
    except Exception:  # noqa: BLE001 - an unreadable last.pt: the sharded one is the way on
        return ("sharded", shard)
    try:
        shard_step = int(read_sharded_meta(shard).get("step", -1))
    except (ValueError, OSError):
        return ("file", last)
    return ("file", last) if file_ok and file_step >= shard_step else ("sharded", shard)


# ------------------------------------------------------------------------------------------- export CLI

def _export_source(src: Path) -> Path:
    """The sharded directory `export SRC` reads: SRC itself or SRC/last_dcp; else a one-line CheckpointError
    saying what SRC is (missing, a file, a run without sharded checkpoints) and what to give instead."""
    from checkpoint.file import CheckpointError
    if not src.exists():
        raise CheckpointError(f"{src} does not exist: {_GIVE_SHARDED}")
    if src.is_file():
        raise CheckpointError(f"{src} is a file, but export reads a sharded checkpoint directory: {_GIVE_SHARDED} "
                              f"(a .pt file is already a single-file checkpoint: use it as it is)")
    if is_sharded_checkpoint(src):
        return src
    if (src / LAST_DCP).exists():
        return src / LAST_DCP  # read_sharded_meta says so if it is incomplete
    if (src / "last.pt").is_file():
        raise CheckpointError(f"{src} has no {LAST_DCP}/, so there is nothing to export: only FSDP runs "
                              f"(train.parallel=fsdp) write sharded checkpoints; its last.pt is already a "
                              f"single-file checkpoint (use it as it is)")
    return src  # not a checkpoint of any kind: read_sharded_meta says so


def export_single_file(src: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Offline: a sharded checkpoint (or run dir with last_dcp/) -> one complete tinygpt checkpoint
    (weights + optimizer + metadata), resumable in a single process or DDP and readable by sample.py.
    Runs on CPU without a process group (DCP loads every shard); needs memory for the whole state."""
    from model import GPT, GPTConfig
    from checkpoint import file as ckpt_lib
    from training.optim import build_optimizer
    shard = _export_source(Path(src))
    meta = read_sharded_meta(shard)
    out = Path(out) if out is not None else shard.parent / f"{shard.name.removesuffix('_dcp')}_full.pt"
    model = GPT(GPTConfig.from_dict(dict(meta["model_config"])))
    o = (meta.get("config") or {}).get("optim") or {}
    optimizer = build_optimizer(model, lr=o.get("lr", 1e-3), weight_decay=o.get("weight_decay", 0.0),
                                betas=(o.get("beta1", 0.9), o.get("beta2", 0.99)), device_type="cpu")
    load_sharded(shard, model, optimizer, DistInfo())
    state = dict(meta)
    state["model"] = ckpt_lib.clean_state_dict(model.state_dict())
    state["optimizer"] = optimizer.state_dict()
    state.pop("sharded", None)
    return ckpt_lib.save_checkpoint(state, out)


def main(argv: Optional[list[str]] = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m training.distributed",
                                 description="Tools for distributed (torchrun) runs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="sharded checkpoint (FSDP's last_dcp/) -> one complete .pt file")
    ex.add_argument("src", help="a run directory (uses its last_dcp/) or a sharded checkpoint directory")
    ex.add_argument("-o", "--out", default=None, help="output file (default: <run dir>/last_full.pt)")
    args = ap.parse_args(argv)
    try:
        path = export_single_file(args.src, args.out)
    except (ValueError, OSError) as e:
        msg = " ".join(str(e).split("\n"))
        print(f"error: {msg}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
