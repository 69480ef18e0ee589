"""A run's probe snapshots: what the model did with one fixed text at each evaluation, written by training/probe.py
as the run trains and read by the explorer's timeline. The format lives here, in viz/ (below training/, beside the
explorer), so that writer and reader import one definition of it.

RUN/probes/probe.json holds the text and its ids, once; RUN/probes/step_000250.pt a step's snapshot: its attention
weights (layer, head, query, key) and the logit lens as each row's and position's top ids and probabilities, in
half precision, plain tensors and ints (torch.load with weights_only=True). Every file is written atomically.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from common.files import atomic_write, remove_quietly, write_text_atomic

TOP = 5  # tokens kept per layer and position: the page's hover


def probe_dir(run_dir) -> Path:
    return Path(run_dir) / "probes"


def _snapshot_path(run_dir, step: int) -> Path:
    return probe_dir(run_dir) / f"step_{step:06d}.pt"


def read_probe(run_dir) -> dict | None:
    """{"text", "ids"} of the run's probe, None when it recorded none."""
    path = probe_dir(run_dir) / "probe.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_probe(run_dir, text: str, ids: list[int]) -> None:
    write_text_atomic(probe_dir(run_dir) / "probe.json", json.dumps({"text": text, "ids": ids}))


def steps(run_dir) -> list[int]:
    """The steps with a snapshot, in order."""
    found = (re.fullmatch(r"step_(\d+)\.pt", p.name) for p in probe_dir(run_dir).glob("step_*.pt"))
    return sorted(int(m.group(1)) for m in found if m)


def write_snapshot(run_dir, step: int, attention: torch.Tensor, lens_probs: torch.Tensor,
                   lens_ids: torch.Tensor) -> None:
    """attention (n_layer, n_head, T, T); lens_probs and lens_ids (n_layer + 1, T, TOP), most likely first."""
    snap = {"step": step, "attention": attention.half().cpu(), "lens_probs": lens_probs.half().cpu(),
            "lens_ids": lens_ids.int().cpu()}
    with atomic_write(_snapshot_path(run_dir, step)) as f:
        torch.save(snap, f)


def read_snapshot(run_dir, step: int) -> dict | None:
    """A step's snapshot (tensors as written), None when that step has none."""
    path = _snapshot_path(run_dir, step)
    return torch.load(path, weights_only=True) if path.is_file() else None


def drop_after(run_dir, step: int) -> None:
    """Remove the snapshots of steps after `step`: a run resumed from there records them again (-1: all)."""
    for s in steps(run_dir):
        if s > step:
            remove_quietly(_snapshot_path(run_dir, s))

