"""What a run measures and leaves behind: metrics.jsonl records, throughput and MFU (loss.png: viz.loss_plot).

Records are appended and flushed as they happen, so a killed run keeps everything up to its last line;
a resumed run first rewrites the file to the records up to its checkpoint's step, so it ends with the
same records as an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from common.files import atomic_write
from training.wandb_run import WandbRun

if TYPE_CHECKING:
    from training.config import Config

log = logging.getLogger(__name__)


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, block_size: int) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT's estimate: 6N for the weights + 12·L·H·Q·T for
    attention (N parameters, L layers, H heads, Q head size, T context)."""
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

    @classmethod
    def resumed(cls, path: Path, source: Optional[Path], step: int) -> "MetricsWriter":
        """`path` started afresh, or (resuming) holding the records of `source` up to `step`."""
        if source is not None:
            records = records_up_to(read_metrics(source), step) if source.is_file() else []
            with atomic_write(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        elif path.exists():
            path.unlink()  # a run that died before its first checkpoint: start the file afresh
        return cls(path)

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
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):  # also blank lines
                records.append(json.loads(line))
    return records


def records_up_to(records: list[dict], step: int) -> list[dict]:
    """The train/eval records of steps <= step (what a run resumed at `step` keeps); summaries dropped."""
    return [r for r in records if r.get("type") in ("train", "eval") and int(r.get("step", -1)) <= step]


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


class RunLog:
    """What rank 0 reports as a run goes: metrics.jsonl records, wandb and the log lines (the train line also
    on the progress bar). On the other ranks (`enabled` False) every report is a no-op."""

    def __init__(self, max_iters: int, enabled: bool = True):
        self.max_iters, self.enabled = max_iters, enabled
        self.metrics, self.wandb, self.bar = MetricsWriter(None), WandbRun(), None

    def open(self, c: "Config", run_dir: Path, wandb_id: Optional[str], resumed_from: Optional[Path],
             step: int) -> None:
        """wandb first (a missing API key must not leave files behind), then metrics.jsonl: afresh, or the
        records of the checkpoint's run up to `step`."""
        if c.logger.name == "wandb":
            self.wandb.start(c, dataclasses.asdict(c), run_dir, wandb_id)
        source = resumed_from.parent / "metrics.jsonl" if resumed_from is not None else None
        self.metrics = MetricsWriter.resumed(run_dir / "metrics.jsonl", source, step)

    @contextlib.contextmanager
    def progress(self, total: int, initial: int, show: bool):
        """A tqdm bar of the steps (on a terminal, rank 0), closed when the block ends."""
        from tqdm import tqdm
        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, disable=not show,
                        file=sys.stderr, smoothing=0.05, leave=True)
        try:
            yield self.bar
        finally:
            self.bar.close()

    @property
    def started(self) -> bool:
        return self.metrics.path is not None or self.wandb.run is not None

    def train(self, step: int, loss: float, lr: float, tokens: int, elapsed: float, tps: float,
              util: Optional[float]) -> None:
        if not self.enabled:
            return
        self.metrics.write({"type": "train", "step": step, "loss": loss, "lr": lr, "tokens": tokens,
                            "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tps, 1),
                            **({"mfu": round(util, 4)} if util is not None else {})})
        self.wandb.log({"train/loss": loss, "lr": lr, "tokens": tokens, "tokens_per_s": tps,
                        **({"mfu": util} if util is not None else {})}, step=step)
        line = f"loss {loss:.4f} | lr {lr:.2e} | {tps / 1e3:.1f}k tok/s" + \
            (f" | mfu {util * 100:.1f}%" if util is not None else "")
        if self.bar is not None and not self.bar.disable:
            self.bar.set_postfix_str(line, refresh=False)
        log.info(f"step {step}/{self.max_iters}: {line}", extra={"progress": True})  # train.log only, under a bar

    def eval(self, step: int, stats: dict, lr: float, tokens: int, elapsed: float, improved: bool) -> None:
        """`stats`: {"train"|"val": {"loss": nats per token, "bpb": bits per byte or None}}."""
        if not self.enabled:
            return
        tr, va = stats["train"], stats["val"]
        bpb = {f"{split}_bpb": stats[split]["bpb"] for split in ("train", "val") if stats[split]["bpb"] is not None}
        self.metrics.write({"type": "eval", "step": step, "train_loss": tr["loss"], "val_loss": va["loss"], **bpb,
                            "lr": lr, "tokens": tokens, "elapsed_s": round(elapsed, 3)})
        self.wandb.log({"eval/train_loss": tr["loss"], "eval/val_loss": va["loss"],
                        **{f"eval/{k}": v for k, v in bpb.items()}}, step=step)
        val_bpb = f" ({va['bpb']:.3f} bpb)" if va["bpb"] is not None else ""
        log.info(f"step {step}/{self.max_iters}: train loss {tr['loss']:.4f}, val loss {va['loss']:.4f}{val_bpb}"
                 f"{' (best)' if improved else ''} | {format_count(tokens)} tokens | {format_duration(elapsed)}")

    def log_start(self, tr) -> None:
        """The lines that open a run: run dir, data, model, device, global batch, resume (`tr`: the Trainer)."""
        c, m, dev, rt, n = tr.c, tr.c.model, tr.dev, tr.rt, tr.tokens_per_step
        togo, files = c.train.max_iters - tr.state.step, tr.loader.files
        log.info(f"run dir: {tr.run_dir}")
        log.info(f"data: {c.data.name}, {tr.tokenizer.describe()}, {format_count(len(files['train']))} train / "
                 f"{format_count(len(files['val']))} val tokens ({tr.prepared.dir})")
        log.info(f"model: {tr.num_params / 1e6:.2f}M parameters ({m.n_layer} layers, {m.n_head} heads, "
                 f"{m.n_embd} wide, context {m.block_size}, vocab {tr.gpt_config.vocab_size}, dropout {m.dropout:g})")
        if tr.source is not None and not tr.resumed:
            log.info(f"init from {tr.source.describe(m.block_size)}")
        log.info(f"device: {dev.device} ({dev.name}), {dev.dtype_name}{' + GradScaler' if tr.scaler else ''}, "
                 + ("torch.compile on" if tr.compiled else "eager (no torch.compile)"))
        if rt.distributed:
            from training.distributed import describe
            log.info(f"parallel: {describe(rt)}")
        log.info(f"global batch: {n:,} tokens per step ({c.train.batch_size} sequences x {m.block_size} tokens x "
                 f"{c.train.grad_accum_steps} accumulation x {rt.world_size} process"
                 f"{'es' if rt.world_size > 1 else ''}); {togo} steps to go = {format_count(togo * n)} tokens")
        best, diff = tr.state.best_val_loss, "; ".join(tr.ckpt.config_diff)
        if tr.resumed:
            log.info(f"resumed from {tr.ckpt.source} at step {tr.state.step} "
                     f"({f'best val loss {best:.4f}' if math.isfinite(best) else 'no eval yet'})")
        if diff:
            log.warning(f"resuming with settings that differ from the checkpoint's: {diff}")

    def finish_run(self, tr, status: str, wall: float) -> None:
        """`finish` with the summary of the Trainer `tr`, whose run ended with `status` after `wall` seconds."""
        st, dev, m = tr.state, tr.dev, tr.c.model
        self.finish({
            "type": "summary", "status": status, "step": st.step, "best_step": st.best_step,
            "best_val_loss": st.best_val_loss if math.isfinite(st.best_val_loss) else None, "tokens": st.tokens,
            "wall_s": round(wall, 3), "train_s": round(tr.train_seconds, 3),
            "mean_tokens_per_s": round(tr.session_tokens / tr.train_seconds, 1) if tr.train_seconds else None,
            "num_params": tr.num_params, "device": dev.name if dev else None, "dtype": dev.dtype_name if dev else None,
            "compiled": tr.compiled, "early_stopped": tr.early_stopped},
            f"{tr.run_dir}  ({m.n_layer}L/{m.n_head}H/{m.n_embd}, ctx {m.block_size}; best val {st.best_val_loss:.4f})")

    def finish(self, summary: dict, plot_title: str) -> None:
        """The summary record and loss.png (best effort: a full disk is a warning), wandb.finish, the done line."""
        try:
            if self.metrics.path is not None:
                self.metrics.write(summary)
                self.metrics.close()
                from viz.loss_plot import plot_loss
                plot_loss(read_metrics(self.metrics.path), self.metrics.path.with_name("loss.png"), title=plot_title)
        except OSError as e:
            log.warning(f"could not write the run summary or loss.png: {e}")
        finally:
            self.wandb.finish(exit_code=0 if summary["status"] == "completed" else 1)
        if summary["status"] == "completed":
            s = summary
            best = f"best val loss {s['best_val_loss']:.4f} at step {s['best_step']}" if s["best_step"] is not None \
                else "no evaluation"
            log.info(f"done: {s['step']} steps, {format_count(s['tokens'])} tokens in {format_duration(s['wall_s'])}, "
                     f"{best}; sample with: python sample.py --run {shlex.quote(str(self.metrics.path.parent))}")
