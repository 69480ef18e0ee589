"""A run's probe snapshots: what the model did with one fixed text at a step, written by training/probe.py and read
by the explorer's timeline; the format lives here, below training/ and beside the explorer, for both.
RUN/probes/step_000250.safetensors holds that step's attention weights (layer, head, query, key) and logit lens (each
row's and position's top ids and probabilities) in half precision, and in its JSON metadata the step, the probe
(text, ids) and the loss: `val_loss` at an evaluation, else `train_loss` (that step's batch), else neither (null:
step 0 without an evaluation; files from before train_loss have only val_loss). No pickle; written atomically; each
file stands alone.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from common.files import atomic_write, remove_quietly

TOP = 5  # tokens kept per layer and position: the page's hover


def probe_dir(run_dir) -> Path:
    return Path(run_dir) / "probes"


def _path(run_dir, step: int) -> Path:
    return probe_dir(run_dir) / f"step_{step:06d}.safetensors"


def steps(run_dir) -> list[int]:
    """The steps with a snapshot, in order."""
    found = (re.fullmatch(r"step_(\d+)\.safetensors", p.name) for p in probe_dir(run_dir).glob("step_*"))
    return sorted(int(m.group(1)) for m in found if m)


def write_snapshot(run_dir, step: int, *, text: str, ids: list[int], val_loss: float | None, attention: torch.Tensor,
                   lens_probs: torch.Tensor, lens_ids: torch.Tensor, train_loss: float | None = None) -> None:
    """attention (n_layer, n_head, T, T); lens_probs and lens_ids (n_layer + 1, T, TOP), most likely first; the
    losses finite or None (strict JSON)."""
    tensors = {"attention": attention.half(), "lens_probs": lens_probs.half(), "lens_ids": lens_ids.int()}
    losses = {"val_loss": val_loss, "train_loss": train_loss}
    meta = {"probe": json.dumps({"step": step, "text": text, "ids": ids,
                                 **{k: None if v is None else float(v) for k, v in losses.items()}}, allow_nan=False)}
    data = save({k: v.cpu().contiguous() for k, v in tensors.items()}, metadata=meta)
    with atomic_write(_path(run_dir, step)) as f:
        f.write(data)


def read_snapshot(run_dir, step: int, tensors: bool = True) -> dict | None:
    """A step's snapshot (None: that step has none): the metadata's fields (`train_loss` None in older files), and
    with `tensors` the tensors'."""
    path = _path(run_dir, step)
    if not path.is_file():
        return None
    with safe_open(path, "pt") as f:
        return {"train_loss": None, **json.loads(f.metadata()["probe"]),
                **({k: f.get_tensor(k) for k in f.keys()} if tensors else {})}


def drop_after(run_dir, step: int) -> None:
    """Remove the snapshots of steps after `step`: a run resumed from there records them again (-1: all)."""
    for s in steps(run_dir):
        if s > step:
            remove_quietly(_path(run_dir, s))
