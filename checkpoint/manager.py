"""Resume and save a run: the one place that knows which files a checkpoint is and what goes into them
(torchtitan's pattern, docs/design.md): one file, or a sharded directory under FSDP, always format 1.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional

from checkpoint.file import (BEST_DCP, FORMAT, LAST_DCP, VERSION, CheckpointError, instead, is_sharded_checkpoint,
                             link_checkpoint, read_checkpoint, remove_stale_temp_files, save_checkpoint, batch_tokens)
from checkpoint.fit import check_fits
from checkpoint.locate import RUN_ROOTS
from common.files import remove_quietly, replace, temp_path
from model.gpt import check_weights, clean_state_dict

LATEST = Path(RUN_ROOTS[0]) / "latest"  # outputs/latest: the newest run with a checkpoint (cwd-relative)
TOP_LEVEL = ("train_state", "rng")  # parts whose state_dicts are spread over the top level (format 1 has them there)
_DIFF_IGNORED = ("train.resume", "train.device", "train.dtype", "train.compile", "train.parallel", "logger.")


class CheckpointManager:
    """`states`: name -> Stateful, saved under its name ("model" and "optimizer" required; None saved as None).
    `meta`: what every checkpoint records and a resume must match (model_config, tokenizer, config);
    `describe(tokenizer dict)`: its name in messages (the data package's). `sharded`: an FSDP run. Every rank
    calls resume() and save() (collectives); `ranks` (runtime.ranks.Ranks) says which one writes (`is_main`) and
    has them meet (`barrier()`)."""

    def __init__(self, run_dir: str | os.PathLike, states: dict[str, Any], meta: dict,
                 describe: Callable[[dict], str], *, ranks: Any, sharded: bool = False):
        self.run_dir = Path(run_dir)
        self.states, self.meta, self.describe, self.ranks, self.sharded = states, meta, describe, ranks, sharded
        self.source: Optional[Path] = None  # the checkpoint resume() loaded
        self.last: Optional[Path] = None  # the last good checkpoint: resumed from, or written since
        self.last_step: Optional[int] = None
        self.config_diff: list[str] = []  # settings that differ from the resumed checkpoint's ("key old -> new")
        self.source_batch_tokens: Optional[int] = None  # the resumed checkpoint's global batch, when recorded
        self._linked = False  # outputs/latest points here once this session has saved

    def resume(self, spec: Any) -> Optional[int]:
        """Load what `train.resume` names (False; True: this run dir; a file, sharded dir or run dir) into
        the states. Returns the checkpoint's step, or None when the run starts afresh."""
        fresh = spec is False or spec is None  # (a fresh run into a directory holding last.pt: refused at set-up)
        if self.ranks.is_main and self.run_dir.is_dir():
            remove_stale_temp_files(self.run_dir)  # of saves a kill cut short
            if not fresh and any(self.run_dir.glob(".*_dcp.*")):  # a sharded save that a kill interrupted
                from checkpoint.sharded import recover_sharded  # (imported only by runs that have sharded files)
                recover_sharded(self.run_dir)
        if fresh:
            return None
        self.ranks.barrier()
        path, ckpt = resume_checkpoint(spec, self.run_dir)  # last.pt or last_dcp/, whichever is newer
        check_fits(ckpt, path, self.meta, self.describe)
        if is_sharded_checkpoint(path):  # DCP: weights + optimizer, resharded onto this world size
            from checkpoint import sharded
            sharded.load_sharded(path, self.states["model"], self.states["optimizer"])
        else:
            self._load_file_weights(ckpt, path)
        for name, part in self.states.items():
            value = ckpt if name in TOP_LEVEL else ckpt.get(name)
            if name not in ("model", "optimizer") and part is not None and value:
                part.load_state_dict(value)
        self.source, self.last, self.last_step = path, path, int(ckpt["step"])
        loader_step = self.states["loader"].state_dict()["step"] if self.states.get("loader") else self.last_step
        if loader_step != self.last_step:
            raise ValueError(f"checkpoint {path} is inconsistent (step {self.last_step}, loader at step "
                             f"{loader_step}): it is corrupt; {instead(path)}")
        self.config_diff = _config_diff(ckpt.get("config") or {}, self.meta["config"])
        self.source_batch_tokens = batch_tokens(ckpt)
        return self.last_step

    def _load_file_weights(self, ckpt: dict, path: Path) -> None:
        model, optimizer = self.states["model"], self.states["optimizer"]
        if ckpt.get("optimizer") is None:
            raise ValueError(f"checkpoint {path} has no optimizer state, so it cannot be resumed: start a new run "
                             f"from its weights with model.init_from={path} instead of train.resume")
        if self.sharded:
            from checkpoint import sharded
            sharded.load_full_model_state(model, ckpt["model"], str(path))
        else:
            # its model_config fits this run, so weights that do not are the file's fault, not a
            # setting's
            try:
                weights = check_weights(model, ckpt["model"], str(path))
            except ValueError as e:
                what = str(e).split(": ")[0]
                raise CheckpointError(f"checkpoint {path} holds weights that do not fit its own "
                                      f"model_config ({what}): it is damaged or was edited; "
                                      f"{instead(path)}") from None
            model.load_state_dict(weights)
        try:
            if self.sharded:
                sharded.load_full_optimizer_state(model, optimizer, ckpt["optimizer"])
            else:
                optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"the optimizer state in {path} does not fit this model ({str(e).splitlines()[0]}): "
                             f"resume with the settings it was trained with") from None

    def save(self, step: int, best: bool = False) -> Path:
        """last.pt (+ best.pt, a hard link, when `best`); sharded runs also last_dcp/ (+ best_dcp/)."""
        model, optimizer = self.states["model"], self.states["optimizer"]
        state = {"format": FORMAT, "version": VERSION, "step": step, **self.meta, "model": None, "optimizer": None}
        for name, part in self.states.items():  # on every rank: some state_dicts are collectives
            if name not in ("model", "optimizer"):
                sd = part.state_dict() if part is not None else None
                state.update(sd if name in TOP_LEVEL else {name: sd})
        last = self.run_dir / "last.pt"
        if self.sharded:  # the resumable checkpoint is the DCP one; last.pt holds the weights for sample.py
            from checkpoint import sharded
            state["sharded"] = True
            sharded.save_sharded(self.run_dir / LAST_DCP, model, optimizer, state, ranks=self.ranks,
                                 best_path=self.run_dir / BEST_DCP if best else None)
            state["model"] = sharded.full_model_state_dict(model)  # gathered on rank 0's CPU
        elif self.ranks.is_main:
            state["model"] = clean_state_dict(model.state_dict())
            state["optimizer"] = optimizer.state_dict()
        if self.ranks.is_main:
            save_checkpoint(state, last)
            if best:
                link_checkpoint(last, self.run_dir / "best.pt")
            if not self._linked:
                self._linked = True
                link_latest(self.run_dir)
        self.last, self.last_step = last, step  # once written: a save cut short leaves the previous one the last
        return last


def resume_checkpoint(spec: Any, run_dir: str | os.PathLike) -> Optional[tuple[Path, dict]]:
    """(path, checkpoint) that `train.resume` names, or None: true means the run dir's freshest resumable one
    (last.pt with optimizer state vs last_dcp/, by step); a path is a file, a sharded dir or a run dir."""
    if spec is False or spec is None:
        return None
    d = Path(run_dir) if spec is True else Path(os.path.expanduser(str(spec)))
    last, shard = d / "last.pt", d / LAST_DCP
    if (spec is not True and not d.is_dir()) or is_sharded_checkpoint(d):
        path = d
    elif is_sharded_checkpoint(shard):
        file_step = _step(last, resumable=True) if last.is_file() else -1
        path = last if file_step >= 0 and file_step >= _step(shard) else shard
    elif last.is_file():
        path = last
    elif _step(d / "best.pt", resumable=True) >= 0:  # a run kept without its last.pt: its best.pt resumes
        raise CheckpointError(f"{'train.resume=true: ' * (spec is True)}{d} has no last.pt, but its best.pt "
                              f"(step {_step(d / 'best.pt')}) can be resumed: give train.resume={d / 'best.pt'}")
    elif spec is True:
        raise ValueError(f"train.resume=true but {d} has no last.pt (every run gets a new directory): pass the "
                         f"earlier run's directory with hydra.run.dir=<run dir> train.resume=true, or give "
                         f"train.resume=<path to last.pt>")
    else:
        raise CheckpointError(f"{d} is a directory without last.pt or last_dcp/: point at a run directory that "
                              f"has one, or at a checkpoint file")
    path, ckpt = read_checkpoint(path)
    if ckpt.get("optimizer") is None and ckpt.get("sharded") and not is_sharded_checkpoint(path):
        raise ValueError(f"{path} is the weights-only export of an FSDP run: resume from its sharded "
                         f"checkpoint with train.resume={path.parent / LAST_DCP}")
    return path, ckpt


def _step(path: Path, resumable: bool = False) -> int:
    """A checkpoint's step (mmap: weights stay on disk); -1 if unreadable, or `resumable` and no optimizer state."""
    try:
        ckpt = read_checkpoint(path, mmap=True)[1]
        return -1 if resumable and ckpt.get("optimizer") is None else int(ckpt.get("step", -1))
    except (ValueError, TypeError, OSError):
        return -1


RUN_OUTPUTS = ("metrics.jsonl", "loss.png", "probes")  # what a run writes besides checkpoints (training.metrics,
# viz.probes), all replaced by a new run; .hydra/, train.log and .lock are not: the run's own (Hydra made them for it)


def _earlier_run(run_dir: str | os.PathLike) -> list[str]:
    """What in `run_dir` a new run would overwrite: its checkpoints (last.pt, best.pt, any *.pt, sharded dirs),
    metrics.jsonl, loss.png and probe snapshots; [] for a new or empty directory, or one of a run stopped before
    its first step (it trained nothing: rerunning its command must work)."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    pts = sorted((p.name for p in d.glob("*.pt")), key=lambda n: (n != "last.pt", n != "best.pt", n))
    dirs = [f"{n}/" for n in (LAST_DCP, BEST_DCP, RUN_OUTPUTS[2]) if (d / n).is_dir() and any((d / n).iterdir())]
    found = pts + [n for n in RUN_OUTPUTS[:2] if (d / n).exists()] + dirs
    return [] if found and set(found) <= {*RUN_OUTPUTS[:2], f"{RUN_OUTPUTS[2]}/"} and _before_step_1(d) else found


def _before_step_1(d: Path) -> bool:
    """Whether `d`'s metrics.jsonl is a tinygpt run's that stopped before step 1: every record at step 0 (a torn
    last line aside), or none (killed before its first); its loss.png and probes/ (step 0) are then that run's too."""
    try:
        lines = [ln for ln in (d / RUN_OUTPUTS[0]).read_text(encoding="utf-8").splitlines() if ln.strip()]
        records = [json.loads(ln) for ln in lines[:-1]]
        with contextlib.suppress(ValueError, IndexError):  # (none at all: a run killed before its first record)
            records.append(json.loads(lines[-1]))
    except (OSError, ValueError):  # none, not text, not JSON lines: not a run's that trained nothing
        return False
    return (bool(records) or not lines) and all(isinstance(r, dict) and r.get("type") in ("train", "eval", "summary")
                                                and r.get("step") == 0 for r in records)


def overwrite_refusal(run_dir: str | os.PathLike, key: str = "hydra.run.dir") -> str | None:
    """Why a new run (train.resume=false) must not start in `run_dir`, given as the setting `key`: it holds an
    earlier run's files (_earlier_run). One line: what is there, and the flag or directory to use instead."""
    found = _earlier_run(run_dir)
    if not found:
        return None
    if _resumable(found):  # go on with it
        last = "last.pt" if "last.pt" in found else f"{LAST_DCP}/"
        return (f"{run_dir} already holds {last} from an earlier run: continue it with train.resume=true, or "
                f"choose another {key} (nothing was overwritten)")
    files = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    ckpt = Path(run_dir) / found[0]
    more = f" (to train on from it: train.resume={ckpt})" if ckpt.suffix == ".pt" and \
        _step(ckpt, resumable=True) >= 0 else ""
    return (f"{run_dir} already holds {files} from an earlier run, which a new run would overwrite: choose another "
            f"{key}{more}, or move {'it' if len(found) == 1 else 'them'} out of {run_dir} (nothing was overwritten)")


def starts_afresh(resume: Any, run_dir: str | os.PathLike) -> bool:
    """Does a run with this `train.resume` write `run_dir` anew (so its earlier files would be overwritten)? Yes for
    false, and for a checkpoint of another directory (a run resumed from elsewhere writes its own files)."""
    if resume is True or resume is None:
        return False
    if resume is False:
        return True
    p = Path(os.path.expanduser(str(resume)))
    source = p if p.is_dir() and not is_sharded_checkpoint(p) else p.parent  # a run dir, or the one holding it
    return not (source.exists() and Path(run_dir).exists() and source.resolve() == Path(run_dir).resolve())


def _resumable(found: list[str]) -> bool:  # what train.resume=true continues
    return "last.pt" in found or f"{LAST_DCP}/" in found


def sweep_refusal(sweep_dir: str | os.PathLike) -> str | None:
    """Why a new sweep must not start in `sweep_dir`: a job directory in it holds an earlier run's files."""
    d = Path(sweep_dir)
    for job in sorted(p for p in d.iterdir() if p.is_dir()) if d.is_dir() else ():
        if found := _earlier_run(job):
            again = ", or resume that sweep with train.resume=true" if _resumable(found) else ""
            return (f"hydra.sweep.dir={sweep_dir} holds an earlier sweep's runs ({job} holds {found[0]}): choose "
                    f"another hydra.sweep.dir{again} (nothing was overwritten)")
    return None


def _flat(d: dict, prefix: str = "") -> dict:
    return {k: v for key, val in d.items() for k, v in
            (_flat(val, f"{prefix}{key}.") if isinstance(val, dict) else {f"{prefix}{key}": val}).items()}


def _config_diff(old: dict, new: dict) -> list[str]:
    a, b = _flat(old), _flat(new)
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.startswith(_DIFF_IGNORED)]


def link_latest(run_dir: str | os.PathLike) -> None:
    """Point outputs/latest at `run_dir` when it is under ./outputs or ./multirun: a symlink (relative), or where
    the filesystem has none a small text file holding the run dir's path. Best effort: a warning on failure."""
    run, cwd = Path(run_dir).absolute(), Path.cwd()
    link = cwd / LATEST
    if not any(run.is_relative_to(cwd / root) for root in RUN_ROOTS) or (link.is_dir() and not link.is_symlink()):
        return  # a run elsewhere, or a directory of the user's called latest
    tmp = temp_path(link)
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.symlink_to(os.path.relpath(run, link.parent), target_is_directory=True)
        except (OSError, NotImplementedError):  # no symlinks here (Windows without the privilege, some mounts)
            tmp.write_text(f"{run}\n", encoding="utf-8")
        replace(tmp, link)  # (retried on Windows while sample.py reads the old one)
    except OSError as e:
        remove_quietly(tmp)
        logging.getLogger(__name__).warning(f"could not update {LATEST}: {e}")
