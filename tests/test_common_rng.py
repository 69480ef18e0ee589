"""common/rng.py: every generator's state captured as plain containers and restored exactly."""
from __future__ import annotations

import random

import numpy as np
import torch

from checkpoint import file as ck
from common.rng import capture_rng_state, restore_rng_state, seed_all, seed_for
from tests.helpers import find_non_plain


def test_rng_state_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # a cached gaussian in numpy's state
    state = capture_rng_state()
    assert find_non_plain(state) is None
    p = ck.save_checkpoint({"format": "tinygpt", "version": 1, "rng": state}, tmp_path / "rng.pt")
    expect = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    seed_all(99)
    restore_rng_state(torch.load(p, weights_only=True)["rng"])
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert got[:3] == expect[:3] and torch.equal(got[3], expect[3])


def test_seed_all_and_seed_for_are_reproducible():
    seed_all(7)
    a = (random.random(), np.random.rand(), torch.rand(2))
    seed_all(7)
    assert (random.random(), np.random.rand()) == a[:2] and torch.equal(torch.rand(2), a[2])
    assert seed_for(1, "train", 3) == seed_for(1, "train", 3) != seed_for(1, "train", 4)
    assert 0 <= seed_for("x") < 1 << 63
