"""viz.loss_plot: loss.png from metrics records (the same function training.metrics used to hold)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO
from viz.loss_plot import plot_loss


def test_plot_loss_writes_a_png_and_skips_nothing_to_plot(tmp_path):
    tmp_path = tmp_path / "run"
    tmp_path.mkdir()
    recs = [{"type": "train", "step": s, "loss": 3.0 - s / 10} for s in range(10)]
    recs += [{"type": "eval", "step": 5, "train_loss": 2.5, "val_loss": 2.6},
             {"type": "eval", "step": 9, "train_loss": 2.1, "val_loss": float("nan")},  # skipped, not a crash
             {"type": "summary", "best_val_loss": 2.6}]
    path = plot_loss(recs, tmp_path / "loss.png", title="run")
    assert path == tmp_path / "loss.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png"]  # no temp file left behind
    assert plot_loss([], tmp_path / "none.png") is None
    assert plot_loss([{"type": "summary"}], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


@pytest.mark.slow
def test_matplotlib_is_imported_only_when_drawing():
    code = "import sys, viz.loss_plot, model, sample; assert 'matplotlib' not in sys.modules, 'imported too early'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
