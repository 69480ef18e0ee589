"""The loss curves of a training run (loss.png): train per log interval, train/val per eval, against step."""
from __future__ import annotations

import logging
import math
from pathlib import Path

from common.files import atomic_write


def _points(records: list[dict], kind: str, key: str) -> list[tuple]:
    """(step, value) of the `kind` records whose `key` is a finite number (a NaN is skipped, not drawn)."""
    return [(r["step"], r[key]) for r in records
            if r.get("type") == kind and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def plot_loss(records: list[dict], path: Path, title: str = "") -> Path | None:
    """Train (per log interval) and val/train (per eval) loss against step, as a PNG. None if nothing to plot."""
    train, ev_train, ev_val = (_points(records, *k) for k in (("train", "loss"), ("eval", "train_loss"),
                                                               ("eval", "val_loss")))
    if not (train or ev_val):
        return None
    mpl_log = logging.getLogger("matplotlib")
    if mpl_log.getEffectiveLevel() < logging.WARNING:  # its INFO lines ("generated new fontManager") are noise
        mpl_log.setLevel(logging.WARNING)
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="tight")
    ax = fig.add_subplot(1, 1, 1)
    if train:
        ax.plot(*zip(*train), color="tab:blue", alpha=0.35, linewidth=1, label="train (log interval)")
    if ev_train:
        ax.plot(*zip(*ev_train), color="tab:blue", marker="o", markersize=3, label="train (eval)")
    if ev_val:
        ax.plot(*zip(*ev_val), color="tab:orange", marker="o", markersize=3, label="val (eval)")
        best = min(ev_val, key=lambda p: p[1])
        ax.annotate(f"best val {best[1]:.4f}", best, textcoords="offset points", xytext=(-4, 10),
                    ha="right", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    with atomic_write(path) as f:
        fig.savefig(f, format="png")
    return Path(path)
