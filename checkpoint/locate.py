"""Which checkpoint a command means: --run DIR (its best.pt, else last.pt; a nanoGPT out_dir's ckpt.pt), --checkpoint
FILE, else the newest run under ./outputs or ./multirun; and what an --init / --hf argument is when it is not a
Hugging Face directory, so that each CLI answers the same mistake the same way. No torch: arguments are checked first.
"""
from __future__ import annotations

import sys
from pathlib import Path

from checkpoint.file import CHECKPOINT_NAMES, HF_CONFIG, LAST_DCP, checkpoint_in_run

RUN_ROOTS = ("outputs", "multirun")  # Hydra's default output dirs, relative to the cwd


def add_checkpoint_options(parser, required: bool = False):
    """--run DIR | --checkpoint FILE, mutually exclusive; returns the group, for a CLI's other source (--init)."""
    src = parser.add_mutually_exclusive_group(required=required)
    src.add_argument("--run", metavar="DIR", help="training run directory (uses best.pt, else last.pt; a nanoGPT "
                     "out_dir: its ckpt.pt)")
    src.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (.pt)")
    return src


def find_newest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """best.pt (else last.pt) of the run whose checkpoint was written most recently, under `roots`."""
    found = [f for root in map(Path, roots) if root.is_dir()
             for name in CHECKPOINT_NAMES for f in root.rglob(name) if f.is_file()]
    newest = max(found, key=lambda f: (f.stat().st_mtime, str(f.parent)), default=None)
    return checkpoint_in_run(newest.parent) if newest else None


def check_hf_dir(path, option: str) -> None:
    """FileNotFoundError (one line) unless `path`, given with `option` (--init, --hf), is a Hugging Face
    directory; a Hub name (gpt2) gets the command that downloads it, a tinygpt run directory or checkpoint the hint
    to pass it with --run/--checkpoint. Every CLI's check of such an argument (sample.py, eval.py, explore.py)."""
    from model.hub import not_local  # (no torch)
    p = Path(path).expanduser()
    if (p / HF_CONFIG).is_file():
        return
    if p.is_file() and (p.parent / HF_CONFIG).is_file():
        raise FileNotFoundError(f"{option} {path} is a file of the Hugging Face directory "
                                f"{p.parent}: give the directory, {option} {p.parent}")
    if p.is_file():
        raise FileNotFoundError(f"{option} {path} is a file, not a Hugging Face directory: a tinygpt checkpoint "
                                f"goes with --checkpoint {path}")
    from checkpoint.nanogpt import CKPT
    if p.is_dir() and any((p / name).exists() for name in (*CHECKPOINT_NAMES, LAST_DCP, CKPT)):
        kind = "tinygpt" if any((p / name).exists() for name in (*CHECKPOINT_NAMES, LAST_DCP)) else "nanoGPT"
        raise FileNotFoundError(f"{option} {path} is a {kind} training run, not a Hugging Face directory: "
                                f"use --run {path}")
    if not p.exists():
        raise FileNotFoundError(not_local(str(path), f"{option} {{}}"))
    raise FileNotFoundError(f"{option} {path} has no {HF_CONFIG}: pass a local Hugging Face GPT-2 directory "
                            "(written by export.py --hf, or save_pretrained)")


def resolve_checkpoint(run=None, checkpoint=None, other: str = "--init HF_DIR") -> Path:
    """--checkpoint FILE, else --run DIR's, else the newest run's (on stderr); `other`: the CLI's other source."""
    if checkpoint is not None:
        return Path(checkpoint)
    path = checkpoint_in_run(Path(run), other) if run is not None else find_newest_checkpoint()
    if path is None:
        from common.platform import script
        raise FileNotFoundError(f"no trained model found under ./{RUN_ROOTS[0]} or ./{RUN_ROOTS[1]} in {Path.cwd()}: "
                                f"train one with `python {script('train.py')}`, or pass --run DIR, --checkpoint FILE "
                                f"or {other}")
    print(f"using {path}" + (" (newest run)" if run is None else ""), file=sys.stderr)
    return path
