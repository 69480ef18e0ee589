"""common/rng.py: derived seeds, the same on every machine."""
from __future__ import annotations

from common.rng import seed_for


def test_seed_for_is_reproducible():
    assert seed_for(1, "train", 3) == seed_for(1, "train", 3) != seed_for(1, "train", 4)
    assert 0 <= seed_for("x") < 1 << 63
