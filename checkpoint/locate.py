"""Which checkpoint the user means, and the model in it, for the inference CLIs (sample.py, eval.py, export.py).

One home for the run-directory rule (best.pt, else last.pt), the newest-run lookup under Hydra's output
dirs, and loading a model for inference from the checkpoint alone. Imports model/ and common/ only: the
caller rebuilds the tokenizer (data.tokenizer.tokenizer_from_dict) and checks it with `check_vocab`.
"""
from __future__ import annotations

import sys
from pathlib import Path

RUN_ROOTS = ("outputs", "multirun")          # Hydra's default output dirs, relative to the cwd
CHECKPOINT_NAMES = ("best.pt", "last.pt")     # in order of preference


def add_checkpoint_options(parser, required: bool = False):
    """--run DIR | --checkpoint FILE on an argparse parser, mutually exclusive; the group is returned so that a
    CLI can add its other model source (--init, --hf) to it."""
    src = parser.add_mutually_exclusive_group(required=required)
    src.add_argument("--run", metavar="DIR", help="training run directory (uses best.pt, else last.pt)")
    src.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (.pt)")
    return src


def checkpoint_in_run(run_dir) -> Path:
    """best.pt, else last.pt, of a run directory; FileNotFoundError (one line) when it has neither."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist: pass a directory containing best.pt "
                                "or last.pt")
    for name in CHECKPOINT_NAMES:
        if (run_dir / name).is_file():
            return run_dir / name
    raise FileNotFoundError(f"run directory {run_dir} has no best.pt or last.pt: has its training saved a "
                            "checkpoint yet? (or pass --checkpoint FILE)")


def find_newest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """best.pt (else last.pt) of the run whose checkpoint was written most recently, under `roots`."""
    found = [f for root in map(Path, roots) if root.is_dir()
             for name in CHECKPOINT_NAMES for f in root.rglob(name) if f.is_file()]
    newest = max(found, key=lambda f: (f.stat().st_mtime, str(f.parent)), default=None)
    return checkpoint_in_run(newest.parent) if newest else None


def resolve_checkpoint(run=None, checkpoint=None, other: str = "--init HF_DIR") -> Path:
    """--checkpoint FILE, else --run DIR's checkpoint, else the newest run's (announced on stderr).
    `other` names the CLI's remaining source option in the "nothing found" message."""
    if checkpoint is not None:
        return Path(checkpoint)
    path = checkpoint_in_run(Path(run)) if run is not None else find_newest_checkpoint()
    if path is None:
        raise FileNotFoundError(f"no trained model found under ./{RUN_ROOTS[0]} or ./{RUN_ROOTS[1]} in {Path.cwd()}: "
                                f"train one with `python train.py`, or pass --run DIR, --checkpoint FILE or {other}")
    print(f"using {path}" + (" (newest run)" if run is None else ""), file=sys.stderr)
    return path


def load_for_inference(path, device="cpu"):
    """(float32 model in eval mode on `device`, tokenizer dict, checkpoint dict) from a tinygpt checkpoint
    (weights_only). Works for FSDP runs too: their last.pt/best.pt hold the complete weights."""
    from checkpoint.file import load_checkpoint, model_from_checkpoint
    ckpt = load_checkpoint(path, map_location="cpu")
    if ckpt.get("model") is None:
        raise ValueError(f"checkpoint {path} holds no model weights (a sharded checkpoint's metadata?): use the "
                         "run's last.pt or best.pt")
    try:
        model = model_from_checkpoint(ckpt)
    except ValueError as e:  # bad model_config, or weights that do not fit it: say which file
        raise ValueError(f"checkpoint {path}: {e}") from None
    if "tokenizer" not in ckpt:
        raise ValueError(f"checkpoint {path} has no tokenizer: it was not written by train.py; "
                         "use a last.pt or best.pt from a training run")
    return model.to(device).eval(), ckpt["tokenizer"], ckpt


def check_vocab(tokenizer_vocab_size: int, model) -> None:
    """ValueError unless the model has a row for every token (more rows are padding: fine)."""
    if tokenizer_vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer_vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}: model and tokenizer do not belong together")
