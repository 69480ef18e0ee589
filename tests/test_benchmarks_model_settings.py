"""benchmarks/model_settings.py: the variants it compares, its readers of progress, and its decode timing."""
from __future__ import annotations

import pytest

from benchmarks import model_settings as ms


def test_nanogpt_lines_and_first_crossing():
    text = "step 0: train loss 4.2, val loss 4.1\niter 1: loss 4.0\nstep 250: train loss 1.9500, val loss 1.8790\n"
    assert ms.nanogpt_evals(text, None) == [(0, 4.1), (250, 1.879)]
    evals = [(0, 4.1, 1.0), (250, 1.879, 50.0), (500, 1.7, 90.0)]
    assert ms.first_at_or_below(evals, 1.88) == 50.0 and ms.first_at_or_below(evals, 1.0) is None


def test_timed_stamps_each_evaluation_once(tmp_path):
    cmd = ["sh", "-c", "echo 'step 0: train loss 4, val loss 4.5'; sleep 0.3; "
                       "echo 'step 9: train loss 2, val loss 2.5'"]
    res = ms.timed(cmd, tmp_path, ms.nanogpt_evals, poll=0.05)
    (s0, v0, t0), (s9, v9, t9) = res["evals"]
    assert (s0, v0, s9, v9) == (0, 4.5, 9, 2.5) and 0 <= t0 < t9 <= res["wall_s"]
    with pytest.raises(RuntimeError, match="exited 3"):
        ms.timed(["sh", "-c", "exit 3"], tmp_path, ms.nanogpt_evals)


@pytest.mark.slow  # over ~1 s in all
@pytest.mark.parametrize("name", list(ms.VARIANTS))
def test_every_variant_composes_and_decodes(name):
    assert ms.decode_rate(name, tokens=3, reps=1) > 0
