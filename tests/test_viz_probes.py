"""viz/probes.py: the probe snapshot files: safetensors with JSON metadata (no pickle), half precision, each standing alone (its probe
and loss in it: val, train or none), atomic, listed by step in order, and a resumed run's later steps dropped."""
from __future__ import annotations

import json

import torch
from safetensors import safe_open

from viz import probes


def snapshot(seed: int, L: int = 2, H: int = 3, T: int = 5, V: int = 50) -> dict:
    """write_snapshot's fields for a random snapshot of L layers, H heads, T tokens of a V-token vocabulary."""
    g = torch.Generator().manual_seed(seed)
    return {"text": "ROMEO"[:T], "ids": list(range(T)), "val_loss": 4.0 - seed / 100,
            "attention": torch.rand(L, H, T, T, generator=g).tril().softmax(-1),
            "lens_probs": torch.rand(L + 1, T, probes.TOP, generator=g),
            "lens_ids": torch.randint(0, V, (L + 1, T, probes.TOP), generator=g)}


def test_snapshots_round_trip_as_plain_half_precision_tensors(tmp_path):
    assert probes.steps(tmp_path) == [] and probes.read_snapshot(tmp_path, 0) is None
    for step in (1_000_000, 250, 0):
        probes.write_snapshot(tmp_path, step, **snapshot(step))
    assert probes.steps(tmp_path) == [0, 250, 1_000_000]  # by number, not by name
    want = snapshot(250)
    with safe_open(tmp_path / "probes" / "step_000250.safetensors", "pt") as f:  # tensors and JSON: no pickle
        snap = {**json.loads(f.metadata()["probe"]), **{k: f.get_tensor(k) for k in f.keys()}}
    assert (snap["step"], snap["text"], snap["ids"], snap["val_loss"]) == (250, "ROMEO", [0, 1, 2, 3, 4], 1.5)
    assert snap["attention"].dtype == snap["lens_probs"].dtype == torch.float16
    assert torch.equal(snap["attention"], want["attention"].half()) and snap["lens_ids"].dtype == torch.int32
    assert torch.equal(snap["lens_ids"], want["lens_ids"].int())
    assert probes.read_snapshot(tmp_path, 250)["lens_probs"].equal(want["lens_probs"].half())
    assert "attention" not in probes.read_snapshot(tmp_path, 250, tensors=False)  # the metadata alone
    assert probes.read_snapshot(tmp_path, 251) is None
    probes.write_snapshot(tmp_path, 250, **snapshot(7))  # a step recorded again: rewritten whole
    assert torch.equal(probes.read_snapshot(tmp_path, 250)["attention"], snapshot(7)["attention"].half())
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == [  # no temp file left behind
        "step_000000.safetensors", "step_000250.safetensors", "step_1000000.safetensors"]


def test_drop_after_keeps_the_steps_a_resumed_run_continues_from(tmp_path):
    for step in (0, 3, 6, 9):
        probes.write_snapshot(tmp_path, step, **snapshot(step))
    probes.drop_after(tmp_path, 6)
    assert probes.steps(tmp_path) == [0, 3, 6]
    probes.drop_after(tmp_path, -1)  # a new run: none
    assert probes.steps(tmp_path) == []


def test_a_snapshot_says_which_loss_it_holds(tmp_path):
    """val_loss at an evaluation, else train_loss (the step's), else neither; a file written before train_loss reads
    as having none; a NaN is refused (strict JSON: the page's parser would reject the file's listing)."""
    import pytest
    from safetensors.torch import save_file
    probes.write_snapshot(tmp_path, 7, **{**snapshot(7), "val_loss": None, "train_loss": 2.5})
    probes.write_snapshot(tmp_path, 0, **{**snapshot(0), "val_loss": None})
    assert [(s["val_loss"], s["train_loss"]) for s in (probes.read_snapshot(tmp_path, 7, tensors=False),
                                                       probes.read_snapshot(tmp_path, 0, tensors=False))] == [
        (None, 2.5), (None, None)]
    old = {"step": 9, "text": "R", "ids": [0], "val_loss": 1.5}
    save_file({"attention": torch.zeros(1, 1, 1, 1).half()}, tmp_path / "probes" / "step_000009.safetensors",
              metadata={"probe": json.dumps(old)})
    assert probes.read_snapshot(tmp_path, 9, tensors=False) == {**old, "train_loss": None}
    with pytest.raises(ValueError):
        probes.write_snapshot(tmp_path, 8, **{**snapshot(8), "val_loss": None, "train_loss": float("nan")})
    assert probes.steps(tmp_path) == [0, 7, 9]
