"""training/mfu.py: nanoGPT's FLOPs-per-token estimate and model FLOPs utilization."""
from __future__ import annotations

import pytest

from training.mfu import flops_per_token, mfu


def test_flops_and_mfu():
    # nanoGPT's GPT-2 small estimate: 6N + 12*L*H*Q*T
    f = flops_per_token(124_000_000, 12, 12, 64, 1024)
    assert f == 6 * 124e6 + 12 * 12 * 12 * 64 * 1024
    assert mfu(1000.0, f, None) is None
    assert mfu(1e5, f, 312e12) == pytest.approx(1e5 * f / 312e12)
