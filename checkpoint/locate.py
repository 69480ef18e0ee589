"""Which checkpoint the user means (inference CLIs, fine-tuning, resumes), read by the one reader. torch, model/
and checkpoint.file are imported lazily: sample.py checks its arguments first.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

RUN_ROOTS = ("outputs", "multirun")          # Hydra's default output dirs, relative to the cwd
CHECKPOINT_NAMES = ("best.pt", "last.pt")     # in order of preference
DCP_META = "tinygpt.pt"  # the plain metadata file inside a sharded checkpoint directory
LAST_DCP = "last_dcp"
BEST_DCP = "best_dcp"
HF_CONFIG = "config.json"  # what makes a directory a Hugging Face model directory


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file() and (p / DCP_META).is_file()


def read_checkpoint(path: str | os.PathLike, *, model: bool = False, run_dir: bool = False,
                    mmap: bool = False) -> tuple[Path, dict]:
    """(its path, the checkpoint) that `path` names, checked: a file, or a sharded directory's metadata unless
    `model` (then weights and a tokenizer are required); `run_dir`: a run directory's best.pt, else last.pt."""
    from checkpoint.file import CheckpointError, load_checkpoint
    p = Path(os.path.expanduser(str(path)))
    if run_dir and p.is_dir():
        p = checkpoint_in_run(p)
    ckpt = load_checkpoint(p / DCP_META if not model and is_sharded_checkpoint(p) else p, mmap=mmap)
    if model and ckpt.get("model") is None:
        raise CheckpointError(f"checkpoint {p} holds no model weights (a sharded checkpoint's metadata?): use the "
                              "run's last.pt or best.pt")
    if model and not isinstance(ckpt.get("tokenizer"), dict):
        raise CheckpointError(f"checkpoint {p} has no tokenizer: it was not written by train.py; use a last.pt or "
                              "best.pt from a training run")
    return p, ckpt


def add_checkpoint_options(parser, required: bool = False):
    """--run DIR | --checkpoint FILE, mutually exclusive; returns the group, for a CLI's other source (--init)."""
    src = parser.add_mutually_exclusive_group(required=required)
    src.add_argument("--run", metavar="DIR", help="training run directory (uses best.pt, else last.pt)")
    src.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (.pt)")
    return src


def checkpoint_in_run(run_dir, other: str | None = None) -> Path:
    """best.pt, else last.pt, of a run directory; FileNotFoundError (one line) when it has neither, which says
    so when it is a Hugging Face directory: use `other` (the CLI's option for those, e.g. "--init HF_DIR")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist: pass a directory containing best.pt "
                                "or last.pt")
    for name in CHECKPOINT_NAMES:
        if (run_dir / name).is_file():
            return run_dir / name
    if (run_dir / HF_CONFIG).is_file():
        use = f"use {other.split()[0]} {run_dir}" if other else "pass a training run's directory"
        raise FileNotFoundError(f"run directory {run_dir} is a Hugging Face directory ({HF_CONFIG}, no best.pt or "
                                f"last.pt), not a training run: {use}")
    raise FileNotFoundError(f"run directory {run_dir} has no best.pt or last.pt: has its training saved a "
                            "checkpoint yet? (or pass --checkpoint FILE)")


def find_newest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """best.pt (else last.pt) of the run whose checkpoint was written most recently, under `roots`."""
    found = [f for root in map(Path, roots) if root.is_dir()
             for name in CHECKPOINT_NAMES for f in root.rglob(name) if f.is_file()]
    newest = max(found, key=lambda f: (f.stat().st_mtime, str(f.parent)), default=None)
    return checkpoint_in_run(newest.parent) if newest else None


def check_hf_dir(path, option: str) -> None:
    """FileNotFoundError (one line) unless `path`, given with `option` (--init, --hf), is a Hugging Face
    directory; a tinygpt run directory or checkpoint there gets the hint to pass it with --run/--checkpoint."""
    p = Path(path).expanduser()
    if (p / HF_CONFIG).is_file():
        return
    if p.is_file():
        raise FileNotFoundError(f"{option} {path} is a file, not a Hugging Face directory: a tinygpt checkpoint "
                                f"goes with --checkpoint {path}")
    if p.is_dir() and any((p / name).exists() for name in (*CHECKPOINT_NAMES, LAST_DCP)):
        raise FileNotFoundError(f"{option} {path} is a tinygpt training run, not a Hugging Face directory: "
                                f"use --run {path}")
    if not p.exists():
        raise FileNotFoundError(f"{option} {path} does not exist: check the path")
    raise FileNotFoundError(f"{option} {path} has no {HF_CONFIG}: pass a local Hugging Face GPT-2 directory "
                            "(written by export.py --hf, or save_pretrained)")


def resolve_checkpoint(run=None, checkpoint=None, other: str = "--init HF_DIR") -> Path:
    """--checkpoint FILE, else --run DIR's, else the newest run's (on stderr); `other`: the CLI's other source."""
    if checkpoint is not None:
        return Path(checkpoint)
    path = checkpoint_in_run(Path(run), other) if run is not None else find_newest_checkpoint()
    if path is None:
        raise FileNotFoundError(f"no trained model found under ./{RUN_ROOTS[0]} or ./{RUN_ROOTS[1]} in {Path.cwd()}: "
                                f"train one with `python train.py`, or pass --run DIR, --checkpoint FILE or {other}")
    print(f"using {path}" + (" (newest run)" if run is None else ""), file=sys.stderr)
    return path


def model_from_checkpoint(ckpt: dict, source: Any = "the checkpoint"):
    """The GPT a checkpoint describes (on CPU, float32, in eval mode); ValueError if the weights do not fit."""
    from model import GPT, GPTConfig
    from model.weights import model_with_weights
    return model_with_weights(GPT, GPTConfig.from_dict(dict(ckpt["model_config"])), ckpt["model"], source).eval()


def load_for_inference(path, device="cpu"):
    """(float32 eval-mode model on `device`, tokenizer dict, checkpoint dict) of a checkpoint file (FSDP runs' too)."""
    _, ckpt = read_checkpoint(path, model=True)
    try:
        model = model_from_checkpoint(ckpt)
    except ValueError as e:  # bad model_config, or weights that do not fit it: say which file
        raise ValueError(f"checkpoint {path}: {e}") from None
    return model.to(device), ckpt["tokenizer"], ckpt


def resume_checkpoint(spec: Any, run_dir: str | os.PathLike) -> Optional[tuple[Path, dict]]:
    """(path, checkpoint) that `train.resume` names, or None: true means the run dir's freshest resumable one
    (last.pt with optimizer state vs last_dcp/, by step); a path is a file, a sharded dir or a run dir."""
    from checkpoint.file import CheckpointError
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


def overwrite_refusal(run_dir: str | os.PathLike) -> Optional[str]:
    """Why a new run (train.resume=false) must not start in `run_dir`: it holds an earlier run's last.pt."""
    if (Path(run_dir) / "last.pt").exists():
        return (f"{run_dir} already holds last.pt from an earlier run: continue it with train.resume=true, or "
                f"choose another hydra.run.dir (nothing was overwritten)")
    return None


def check_vocab(tokenizer_vocab_size: int, model) -> None:
    """ValueError unless the model has a row for every token (more rows are padding: fine)."""
    if tokenizer_vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer_vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}: model and tokenizer do not belong together")
