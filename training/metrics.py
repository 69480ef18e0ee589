"""What a run measures and leaves behind: metrics.jsonl, loss.png, throughput and MFU.

Design:
- `metrics.jsonl` holds one JSON object per line, appended and flushed as it happens (a killed run
  keeps everything up to its last line):
      {"type": "train", "step", "loss", "lr", "tokens", "elapsed_s", "tokens_per_s", "mfu"?}  every log_interval
      {"type": "eval", "step", "train_loss", "val_loss", "lr", "tokens", "elapsed_s"}         every eval
      {"type": "summary", "best_val_loss", "best_step", "tokens", "wall_s", "mean_tokens_per_s", ...}  at the end
  "train" losses are the mean over the steps since the previous reading; `tokens` counts training
  tokens consumed so far (all processes; carried in the checkpoint, so it stays right when a resume
  changes the batch or the process count); `elapsed_s` is training time (survives resume).
- On resume the file is rewritten (atomically) to the records up to the checkpoint's step, so an
  interrupted-and-resumed run ends with the same records as an uninterrupted one.
- `plot_loss` draws train and val curves with matplotlib's Agg canvas directly (no pyplot, no global
  backend switch), written atomically.
- MFU (model FLOPs utilisation) uses nanoGPT's estimate of training FLOPs per token,
  6·N + 12·L·H·Q·T (N parameters, L layers, H heads, Q head size, T context), against the GPU's peak
  from training/device.py.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable, Optional


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, block_size: int) -> float:
    """Training FLOPs per token (forward + backward): 6N for the weights + 12·L·H·Q·T for attention."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * block_size


def mfu(tokens_per_s: float, flops_per_tok: float, peak: Optional[float]) -> Optional[float]:
    """Achieved / peak FLOP/s as a fraction, or None when the peak is unknown."""
    if not peak or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / peak


def _clean(value):
    """JSON has no NaN/inf: write them as strings so the file stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    """Appends JSON records to metrics.jsonl (flushed per record). A no-op when path is None (rank != 0)."""

    def __init__(self, path: Optional[Path]):
        self.path = Path(path) if path is not None else None
        self._f = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        if self._f is None:
            return
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_metrics(path: Path) -> list[dict]:
    """Records from a metrics.jsonl (a torn last line from a killed run is skipped)."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return records


def write_records_atomic(path: Path, records: Iterable[dict]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def records_up_to(records: list[dict], step: int) -> list[dict]:
    """The train/eval records of steps <= step (what a run resumed at `step` keeps); summaries dropped."""
    return [r for r in records if r.get("type") in ("train", "eval") and int(r.get("step", -1)) <= step]


def plot_loss(records: list[dict], path: Path, title: str = "") -> Optional[Path]:
    """Train (per log interval) and val/train (per eval) loss against step, as a PNG. None if nothing to plot."""
    train = [(r["step"], r["loss"]) for r in records
             if r.get("type") == "train" and isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    evals = [r for r in records if r.get("type") == "eval"]
    ev_train = [(r["step"], r["train_loss"]) for r in evals
                if isinstance(r.get("train_loss"), (int, float)) and math.isfinite(r["train_loss"])]
    ev_val = [(r["step"], r["val_loss"]) for r in evals
              if isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])]
    if not (train or ev_val):
        return None
    import logging
    mpl_log = logging.getLogger("matplotlib")
    if mpl_log.getEffectiveLevel() < logging.WARNING:  # its INFO lines ("generated new fontManager") are noise
        mpl_log.setLevel(logging.WARNING)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
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
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def format_count(n: float) -> str:
    """12345678 -> '12.35M' (tokens, parameters)."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def format_duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
