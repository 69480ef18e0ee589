"""What rank 0 reports as a run goes: metrics.jsonl records, wandb, the log lines and the closing
summary, and the MFU in them (training/mfu.py). Records are flushed as they happen (a killed run
keeps them); a resumed run first cuts the file back to its checkpoint's step, so it ends with the
same records as an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from common.cli import count
from common.files import atomic_write
from common.platform import command_line, script
from model.device import device_name
from runtime.console import Progress
from training.mfu import flops_per_token, mfu, mfu_peak

if TYPE_CHECKING:
    from data.cache import Prepared
    from model.gpt import GPT
    from runtime.ranks import Ranks
    from training.config import Config
    from training.init_from import Source
    from training.precision import Precision
    from training.state import TrainState

log = logging.getLogger(__name__)


def open_metrics(path: Path, source: Optional[Path] = None, step: int = 0):
    """metrics.jsonl opened for appending: afresh, or (resuming) holding `source`'s train/eval
    records up to `step`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [r for r in read_metrics(source) if r.get("type") in ("train", "eval")
            and int(r.get("step", -1)) <= step] \
        if source is not None else []
    with atomic_write(path, "w", encoding="utf-8") as f:  # (also a dead run's file, started afresh)
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return open(path, "a", encoding="utf-8")


def read_metrics(path: Path) -> list[dict]:
    """Records from a metrics.jsonl (a torn last line from a killed run is skipped)."""
    records = []
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):  # also blank lines
                records.append(json.loads(line))
    return records


def format_count(n: float) -> str:
    """12345678 -> '12.35M' (tokens, parameters)."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def format_duration(s: float) -> str:
    """Seconds as '1h02m03s', '2m03s', '3s'; never negative (a clock stepped back reads as 0s)."""
    h, rem = divmod(max(0, int(round(s))), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def format_stats(stats: dict[str, dict], improved: bool) -> str:
    """An evaluation's statistics split by split, each in its dict's order (None: left out),
    "(best)" after a val loss that improved:
    'train loss 1.6994, bpb 2.4517 | val loss 1.8555, bpb 2.6769 (best)'."""
    parts = []
    for split, named in stats.items():
        shown = ", ".join(f"{name} {v:.4f}" for name, v in named.items() if v is not None)
        parts.append(f"{split} {shown}" + (" (best)" if split == "val" and improved else ""))
    return " | ".join(parts)


class RunLog:
    """The records, wandb data and log lines of a run, each from the values it is given: `start`
    once rank 0 has set the run up, `log_train`/`log_eval` per interval, `finish` at the end. Off
    rank 0 (never started) a no-op."""

    def __init__(self, max_iters: int):
        self.max_iters = max_iters
        self.file = None  # metrics.jsonl, once started (rank 0)
        # wandb: a training.wandb_run.WandbRun, with logger=wandb only
        self.wandb, self.bar = None, None

    def start(self, c: "Config", run_dir: Path, st: "TrainState", *, data: "Prepared", model: "GPT",
              precision: "Precision", compiled: bool, ranks: "Ranks", source: Optional["Source"],
              resumed_from: Optional[Path], config_diff: list[str]) -> None:
        """wandb first (a missing API key must not leave files behind), then metrics.jsonl, then the
        opening lines."""
        # for the summary
        self.model, self.num_params, self.precision = c.model, model.num_params(), precision
        self.device_name, self.peak = device_name(precision.device), mfu_peak(precision,
                                                                              ranks.world_size)
        g = model.config  # (its head_dim: not always n_embd / n_head)
        self.flops_per_token = flops_per_token(self.num_params, g.n_layer, g.n_head, g.head_size,
                                               g.block_size)
        if c.logger.name == "wandb":
            from training.wandb_run import WandbRun
            self.wandb = WandbRun()
            self.wandb.start(c, run_dir, st.wandb_run_id)
        source_metrics = resumed_from.parent / "metrics.jsonl" if resumed_from is not None else None
        self.file = open_metrics(run_dir / "metrics.jsonl", source_metrics, st.step)
        m, n, togo = c.model, st.batch_tokens, c.train.max_iters - st.step
        train, val = data.token_files()
        log.info(f"run dir: {run_dir}")
        log.info(f"data: {c.data.name}, {data.tokenizer.describe()}, {format_count(len(train))} "
                 f"train / {format_count(len(val))} val tokens ({data.dir})")
        log.info(f"model: {self.num_params / 1e6:.2f}M parameters ({count(m.n_layer, 'layer')}, "
                 f"{count(m.n_head, 'head')}, {m.n_embd} wide, context {m.block_size}, vocab "
                 f"{g.vocab_size}, dropout {m.dropout:g})")
        if source is not None and resumed_from is None:
            log.info(f"init from {source.describe(m.block_size)}")
        log.info(f"device: {precision.device} ({self.device_name}), {precision.dtype_name}"
                 f"{' + GradScaler' if precision.use_grad_scaler else ''}, "
                 + ("torch.compile on" if compiled else "eager (no torch.compile)"))
        if ranks.distributed:
            log.info(f"parallel: {ranks.describe()}")
        # a resume at or past train.max_iters has no steps to go, never a negative count
        # (nothing_to_train then says why)
        left = (f"{togo} step{'s' if togo != 1 else ''} to go = {format_count(togo * n)} tokens"
                if togo > 0 else
                f"no steps to go (step {st.step} of train.max_iters={c.train.max_iters})")
        log.info(f"global batch: {n:,} tokens per step ({c.train.batch_size} sequences x "
                 f"{m.block_size} tokens x {c.train.grad_accum_steps} accumulation x "
                 f"{ranks.world_size} process{'es' if ranks.world_size > 1 else ''}); {left}")
        if resumed_from is not None:
            best = st.best_val_loss
            log.info(f"resumed from {resumed_from} at step {st.step} "
                     f"({f'best val loss {best:.4f}' if math.isfinite(best) else 'no eval yet'})")
        if config_diff:
            log.warning("resuming with settings that differ from the checkpoint's: "
                        f"{'; '.join(config_diff)}")

    def write(self, record: dict) -> None:  # JSON has no NaN/inf: they are written as strings
        self.file.write(json.dumps({k: str(v) if isinstance(v, float) and not math.isfinite(v)
                                    else v
                                    for k, v in record.items()}) + "\n")
        self.file.flush()

    def track(self, data: dict, step: int) -> None:
        if self.wandb is not None:
            self.wandb.log(data, step=step)

    @property
    def started(self) -> bool:
        return self.file is not None or (self.wandb is not None and self.wandb.run is not None)

    def log_train(self, step: int, means: dict[str, float], lr: float, tokens: int, elapsed: float,
                  tps: float) -> None:
        """A train line, record and wandb point from the window's means (`means`: "loss",
        "grad_norm", ...)."""
        if self.file is None:
            return
        util = mfu(tps, self.flops_per_token, self.peak)
        self.write({"type": "train", "step": step, **means, "lr": lr, "tokens": tokens,
                    "elapsed_s": round(elapsed, 3), "tokens_per_s": round(tps, 1),
                    **({"mfu": round(util, 4)} if util is not None else {})})
        self.track({**{f"train/{k}": v for k, v in means.items()}, "lr": lr, "tokens": tokens,
                    "tokens_per_s": tps,
                    **({"mfu": util} if util is not None else {})}, step=step)
        line = " | ".join([*(f"{k} {v:.4f}" for k, v in means.items()), f"lr {lr:.2e}",
                           f"{tps / 1e3:.1f}k tok/s",
                           *([f"mfu {util * 100:.1f}%"] if util is not None else [])])
        on_bar = self.bar is not None and not self.bar.disable
        if on_bar:
            self.bar.set_postfix_str(line, refresh=False)
        # on the bar: train.log only
        log.info(f"step {step}/{self.max_iters}: {line}", extra={"on_bar": on_bar})

    def eval_progress(self, split: str) -> Optional[Callable[[int, int], None]]:
        """eval_stats's `progress` for one split's batches (runtime.console.Progress); None off
        rank 0."""
        if self.file is None:
            return None
        return Progress(f"evaluating the {split} split", self.bar, log.info)

    def first_step(self, step: int, seconds: float, log_interval: int) -> None:
        """A session's first step, when the first train line is half a minute or more away (a CPU
        given a GPU-sized run, a compile): how long it took, so that a run never sits silent for
        minutes."""
        waits = seconds * (log_interval - 1) >= 30
        if self.file and log_interval > 1 and step < self.max_iters and waits:
            # (a bar shows it)
            log.info(f"step {step}/{self.max_iters}: took {seconds:.1f} s; the train loss is "
                     f"logged every {log_interval} steps (train.log_interval)",
                     extra={"on_bar": self.bar is not None and
                                                                          not self.bar.disable})

    def nothing_to_train(self, st: "TrainState", t) -> None:
        """A resumed run with no step left: why, and which setting continues it."""
        if st.step >= t.max_iters:
            log.info(f"the checkpoint is at step {st.step} >= train.max_iters={t.max_iters}: "
                     f"nothing to train (raise train.max_iters to continue)")
        else:
            log.info(f"the checkpoint's val loss has not improved since step {st.best_step}, for "
                     f"train.patience={t.patience} evaluations: nothing to train (raise "
                     f"train.patience to continue)")

    def log_eval(self, step: int, stats: dict, lr: float, tokens: int, elapsed: float,
                 improved: bool) -> None:
        """`stats`: each split's statistics by name, {"train"|"val": {"loss": nats per token,
        "bpb": bits per byte or None, ...}}. Each one (None: left out) is `<split>_<name>` in
        metrics.jsonl, `eval/<split>_<name>` in wandb and on the line, in the dict's order: a new
        statistic is one line where it is computed."""
        if self.file is None:
            return
        values = {f"{split}_{name}": v for split, named in stats.items()
                  for name, v in named.items() if v is not None}
        self.write({"type": "eval", "step": step, **values, "lr": lr, "tokens": tokens,
                    "elapsed_s": round(elapsed, 3)})
        self.track({f"eval/{k}": v for k, v in values.items()}, step=step)
        log.info(f"step {step}/{self.max_iters}: {format_stats(stats, improved)} | "
                 f"{format_count(tokens)} tokens | {format_duration(elapsed)}")

    def finish(self, status: str, st: "TrainState", *, wall: float, train_s: float,
               session_tokens: int,
               compiled: bool, early_stopped: bool, stopped_by: str = "") -> None:
        """The summary record and loss.png (best effort: a full disk is a warning), wandb.finish,
        the done line; `wall`: this session's seconds, `train_s`/`session_tokens`: its training time
        and tokens; `stopped_by`: what stopped a run that did not complete, in words (a signal's
        name, a closed output pipe)."""
        m, best = self.model, st.best_val_loss
        run_dir = Path(self.file.name).parent if self.file else None
        try:
            if self.file is not None:
                self.write({
                    "type": "summary", "status": status,
                    **({"stopped_by": stopped_by} if stopped_by else {}),
                    "step": st.step, "best_step": st.best_step,
                    "best_val_loss": best if math.isfinite(best) else None, "tokens": st.tokens,
                    "wall_s": round(wall, 3), "train_s": round(train_s, 3),
                    "mean_tokens_per_s": round(session_tokens / train_s, 1) if train_s else None,
                    "num_params": self.num_params, "device": self.device_name,
                    "dtype": self.precision.dtype_name,
                    "compiled": compiled, "early_stopped": early_stopped})
                self.file.close()
                from viz.loss_plot import plot_loss
                plot_loss(read_metrics(self.file.name), run_dir / "loss.png",
                          title=f"{run_dir}  ({m.n_layer}L/"
                          f"{m.n_head}H/{m.n_embd}, ctx {m.block_size}; best val {best:.4f})")
        except OSError as e:
            log.warning(f"could not write the run summary or loss.png: {e}")
        finally:
            if self.wandb is not None:
                self.wandb.finish(exit_code=0 if status == "completed" else 1)
        # the whole run's time, as its step lines count it (+ this session's, resumed)
        if status == "completed":
            done = (f"best val loss {best:.4f} at step {st.best_step}" if st.best_step is not None
                    else "no evaluation")
            run_s = format_duration(round(st.elapsed_s + wall, 3))
            session = f" ({format_duration(round(wall, 3))} this session)" if st.elapsed_s else ""
            sample = command_line(["python", script("sample.py"), "--run", str(run_dir)])
            log.info(f"done: {st.step} steps, {format_count(st.tokens)} tokens in "
                     f"{run_s}{session}, {done}; sample with: {sample}")
