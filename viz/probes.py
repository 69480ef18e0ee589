"""A run's probe snapshots: what the model did with one fixed text at each evaluation, written by training/probe.py
and read by the explorer's timeline; the format lives here, below training/ and beside the explorer, for both.
RUN/probes/step_000250.pt holds that step's probe (text, ids), val loss, attention weights (layer, head, query, key)
and logit lens (each row's and position's top ids and probabilities): half precision, plain tensors, numbers and
strings (weights_only), written atomically; each file stands alone.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from common.files import atomic_write, remove_quietly

TOP = 5  # tokens kept per layer and position: the page's hover


def probe_dir(run_dir) -> Path:
    return Path(run_dir) / "probes"


def steps(run_dir) -> list[int]:
    """The steps with a snapshot, in order."""
    found = (re.fullmatch(r"step_(\d+)\.pt", p.name) for p in probe_dir(run_dir).glob("step_*.pt"))
    return sorted(int(m.group(1)) for m in found if m)


def write_snapshot(run_dir, step: int, *, text: str, ids: list[int], val_loss: float, attention: torch.Tensor,
                   lens_probs: torch.Tensor, lens_ids: torch.Tensor) -> None:
    """attention (n_layer, n_head, T, T); lens_probs and lens_ids (n_layer + 1, T, TOP), most likely first."""
    with atomic_write(probe_dir(run_dir) / f"step_{step:06d}.pt") as f:
        torch.save({"step": step, "text": text, "ids": ids, "val_loss": float(val_loss),
                    "attention": attention.half().cpu(), "lens_probs": lens_probs.half().cpu(),
                    "lens_ids": lens_ids.int().cpu()}, f)


def read_snapshot(run_dir, step: int, mmap: bool = False) -> dict | None:
    """A step's snapshot (None: that step has none); `mmap` reads the tensors only when used."""
    path = probe_dir(run_dir) / f"step_{step:06d}.pt"
    return torch.load(path, weights_only=True, mmap=mmap) if path.is_file() else None


def drop_after(run_dir, step: int) -> None:
    """Remove the snapshots of steps after `step`: a run resumed from there records them again (-1: all)."""
    for s in steps(run_dir):
        if s > step:
            remove_quietly(probe_dir(run_dir) / f"step_{s:06d}.pt")
