"""Whether a checkpoint fits the run that resumes it: the same vocabulary, optimizer and model.
What differs is told in one line with every setting that makes the run the checkpoint's, each
written as an override would be, so that following it resumes; a nanoGPT ckpt.pt is pointed at
the fine-tune that continues it (model.init_from).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from model.config import GPTConfig


def check_fits(ckpt: dict, path: Path, meta: dict, describe: Callable[[dict], str]) -> None:
    """The same vocabulary, model shape and optimizer as this run (`meta`: what its checkpoints
    record; `describe`: a tokenizer's name): one ValueError line naming what differs and every
    setting that makes this run the checkpoint's (all at once, so that following it resumes)."""
    tok, old = meta["tokenizer"], ckpt.get("tokenizer")
    if ckpt.get("from_nanogpt"):
        data = _group(meta["config"], "data").get("name")
        raise ValueError(_nanogpt_resume(path, old, tok, data))
    problems, fixes, kinds = [], [], []
    if old is not None and old != tok:
        problems.append(f"the prepared data's vocabulary ({describe(tok)}) differs from the "
                        f"checkpoint's ({describe(old)})")
        fixes.append(_data_settings(ckpt))
        kinds.append("data")
    opt = _group(ckpt.get("config"), "optim").get("name")
    here = _group(meta["config"], "optim").get("name")
    if opt and here and opt != here:
        problems.append(f"the optimizer state in {path} does not fit this model (trained with "
                        f"optim={opt}, this run has optim={here})")
        fixes.append(f"optim={opt}")
        kinds.append("optim")
    mine, theirs = meta["model_config"], _model_config(ckpt)
    diffs = [k for k in mine if k != "dropout" and theirs.get(k) != mine[k]]
    if diffs:
        # the vocabulary alone: its padding, since the tokenizers are the same (or the data's fix
        # makes them so)
        pad = _group(ckpt.get("config"), "model").get("pad_vocab_to", 1)
        here_, there = (", ".join(f"{k}={_value(c.get(k))}" for k in diffs) for c in (mine, theirs))
        problems.append(f"the model does not match the checkpoint {path}: here {here_}, in the "
                        f"checkpoint {there}")
        fixes.append(" ".join(f"model.{k}={_value(theirs.get(k))}" if k != "vocab_size" else
                              f"model.pad_vocab_to={pad}" for k in diffs))
        kinds.append("model")
    if not problems:
        return
    fix = " ".join(fixes)
    advice = {("data",): f"resume with the data settings the checkpoint was trained with ({fix})",
              ("optim",): f"resume with the settings it was trained with: {fix}",
              ("model",): f"resume with the checkpoint's model settings ({fix})"}
    every = f"resume with the settings the checkpoint was trained with ({fix})"
    raise ValueError("; ".join(problems) + ": " + advice.get(tuple(kinds), every))


def _group(config: Optional[dict], name: str) -> dict:
    """A config group of a checkpoint's "config" ({} if absent)."""
    return (config or {}).get(name) or {}


def _nanogpt_resume(path: Path, theirs: Optional[dict], ours: dict, data: Optional[str]) -> str:
    """Why a nanoGPT ckpt.pt is not resumed, and the fine-tune that continues it (with the data it
    reads: `theirs`, its tokenizer; `ours`, the prepared data's; `data`, this run's data set)."""
    fix = f"model.init_from={path}"
    if theirs != ours and (theirs or {}).get("type") == "gpt2":
        fix += " data.tokenizer=gpt2" if data == "text" else " data=shakespeare"
    elif theirs != ours:
        fix += " data=text data.path=<the text it was trained on>"
    return (f"{path} is nanoGPT's ckpt.pt, which train.resume cannot continue (it resumes "
            f"tinygpt's own runs, with their optimizer state): continue a nanoGPT run as a "
            f"fine-tune from its weights, with {fix} instead of train.resume")


def _model_config(ckpt: dict) -> dict:
    """A checkpoint's model settings, each one: the keys an older checkpoint lacks at their
    defaults, as it loads."""
    try:
        return GPTConfig.from_dict(dict(ckpt["model_config"])).to_dict()
    except (ValueError, TypeError):
        return dict(ckpt["model_config"])


def _value(v: Any) -> str:
    """A setting's value as an override writes it (null, true, false)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _data_settings(ckpt: dict) -> str:
    """The data settings that make a checkpoint's vocabulary, as overrides."""
    d = _group(ckpt.get("config"), "data")
    parts = [f"data={d['name']}"] if d.get("name") else []
    keys = ("path", "tokenizer", "vocab_size")
    parts += [f"data.{k}={d[k]}" for k in keys if d.get(k) is not None]
    return " ".join(parts) or "see the checkpoint's config"
