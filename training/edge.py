"""A real run's hooks (training/hooks.py), kept out of the loop: resume and random state, the
metrics window and the progress bar, the report (console, metrics.jsonl, wandb), probes, the best
checkpoint and early stop, HellaSwag, checkpoints, the compile fallback, the start-up trace and stop
signals. The loop calls them at fixed points; launch/run.py makes one per run and closes it,
whatever happened.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from checkpoint.manager import CheckpointManager
from common import startup
from model.device import resolve_compile
from runtime.console import progress_bar
from runtime.ranks import Ranks
from runtime.signals import StopRequest, closing_line
from training.hooks import Hooks, Run
from training.loop import evaluate
from training.metrics import RunLog
from training.probe import ProbeRecorder, probe_steps
from training.state import MetricsWindow, RNGState, TrainResult
from training.step import CompileGuard, EvalInterrupted, TrainingDiverged, compile_regions

log = logging.getLogger(__name__)


class Edge(Hooks):
    """One run's guarantees around the loop; `close()` always, `closing()` and `finish()` by
    launch/run.py."""

    def __init__(self, config, run_dir: Path, ranks: Ranks, source=None):
        self.config, self.run_dir, self.ranks, self.source = config, Path(run_dir), ranks, source
        self.stop_request, self.report = StopRequest(ranks), RunLog(config.train.max_iters)
        self.run: Optional[Run] = None
        # what train() returned (launch/run.py sets it); said once the run is set up and accepted
        self.outcome: Optional[TrainResult] = None
        self.on_start: Callable[[], None] = lambda: None
        self.resumed = self.compiled = self.early_stopped = self.idle = False
        self.session_start, self.train_seconds, self.first_step = time.perf_counter(), 0.0, 0
        self.closer = contextlib.ExitStack()
        startup.mark("run dir claimed, logging, notes")

    # the loop's hooks, in the order it calls them

    def start(self, run: Run) -> None:
        """Resume into the built parts, compile, open the report; then the step-0 evaluation or
        probe."""
        startup.mark("data, model and optimizer built")
        from data.tokenizer import describe_tokenizer
        self.run, config, ranks, state = run, self.config, self.ranks, run.state
        train = config.train
        # a row this model cannot score is refused now, not at the first evaluation
        if train.hellaswag:
            from training import eval_hellaswag
            eval_hellaswag.check(train.hellaswag, run.data.tokenizer, config.model.block_size)
        self.window = MetricsWindow(train.log_interval, run.precision.device, ranks)
        self.rng = RNGState(ranks, train.seed)
        parts = {"model": run.model, "optimizer": run.optimizer, "scaler": run.scaler,
                 "loader": run.loader, "loss_window": self.window, "rng": self.rng,
                 "train_state": state}
        meta = {"model_config": run.model.config.to_dict(),
                "tokenizer": run.data.tokenizer.to_dict(), "config": dataclasses.asdict(config)}
        self.ckpt = CheckpointManager(self.run_dir, parts, meta, describe_tokenizer, ranks=ranks,
                                      sharded=ranks.parallel == "fsdp")
        self.resumed = self.ckpt.resume(train.resume) is not None
        self.first_step = state.step
        self.probe = train.probe and ProbeRecorder.start(
            self.run_dir, train.probe_text, run.data.tokenizer, run.data.token_files()[1],
            config.model.block_size, ranks, state.step, self.resumed,
            probe_steps(train.max_iters, train.probe_steps))
        self.window.start(state.step)
        self.compiled = resolve_compile(train.compile, run.precision.device)
        # its blocks and output, as regions (training/step.py): the steps still call step_model
        if self.compiled:
            compile_regions(run.model)
        # a failing compiler: the step or evaluation is redone eagerly, with the batches it drew
        self.compile_guard = CompileGuard(self.compiled, self._to_eager, rewound=[run.loader])
        startup.mark("resume, compile set-up")
        if ranks.is_main:
            self._open_report()
        startup.mark("config printed")
        self.on_start()
        self._begin()

    def stop(self, run: Run) -> bool:
        return self.idle or self.early_stopped or self.stop_request.agreed()

    def guard(self, kind, fn, *args):
        try:
            return self.compile_guard.run(kind, lambda: fn(*args))
        except EvalInterrupted:
            return None

    def eval_stop(self) -> bool:
        # (under torchrun a rank cannot leave an evaluation alone: the collectives wait for it)
        return self.stop_request.signum is not None and not self.ranks.distributed

    def eval_progress(self, split):
        return self.report.eval_progress(split)

    def stepped(self, run: Run, metrics) -> None:
        state, train = run.state, self.config.train
        # device tensors: read with one host sync at the log interval
        self.window.add(metrics)
        self.bar.update(1)
        # a slow device: a word before the first log line (a GPU's queue waited for)
        if state.step == self.first_step + 1:
            startup.mark("first step", wait=metrics["loss"].item)
            self.report.first_step(state.step, time.perf_counter() - self.interval_start,
                                   train.log_interval)
        if state.step % train.log_interval == 0 or state.step == train.max_iters:
            self._log_train()
        evaluating = state.step % train.eval_interval == 0 or state.step == train.max_iters
        if self.probe and not evaluating and state.step in self.probe.steps:
            self._probe(metrics["loss"])

    def evaluated(self, run: Run, stats, save: bool = True) -> None:
        """Report, keep the best, save (every rank: collectives), HellaSwag, the probe; `stats`
        None: a stop."""
        state, step, t0 = run.state, run.state.step, time.perf_counter()
        if stats is None:
            # saved with the stop's checkpoint: the resumed run redoes it
            state.eval_pending = True
            if self.ranks.is_main:
                log.info(f"evaluation at step {step} skipped: stopping")
            return
        state.eval_pending = False
        for split in ("train", "val"):
            if not math.isfinite(stats[split]["loss"]):
                self._diverged(step, stats[split]["loss"])
        before = (state.best_val_loss, state.best_step)
        improved = save and stats["val"]["loss"] < state.best_val_loss
        if improved:
            state.best_val_loss, state.best_step = stats["val"]["loss"], step
        self.report.log_eval(step, stats, run.lr_at(step - 1), state.tokens, state.elapsed(),
                             improved)
        if save:
            try:
                self._save(step, best=improved)
            except BaseException:
                # no best recorded without its best.pt
                state.best_val_loss, state.best_step = before
                raise
            self.early_stopped = step < self.config.train.max_iters and self._out_of_patience()
        # after the save: a failing benchmark never costs the checkpoint
        if self.config.train.hellaswag:
            from training import eval_hellaswag
            eval_hellaswag.at_eval(self.config.train.hellaswag, step, run.step_model,
                                   run.data.tokenizer, run.precision.autocast, self.ranks,
                                   self.report)
        if self.probe:
            self.probe.record(run.model, step, stats["val"]["loss"])
        # evaluations and saves do not count as training time
        self.interval_start += time.perf_counter() - t0

    def end(self, run: Run) -> TrainResult:
        """A stop's window kept for its last.pt, saved unless this session took no step; the
        early-stop line."""
        if not self.idle:
            self.stop_request.finish()
            if self.window.values or self.stop_request.signum is not None:
                self._log_train(write=self.stop_request.signum is None)
            if self.ckpt.last_step != run.state.step and run.state.step > self.first_step:
                self._save(run.state.step)
        self.close()
        if self.early_stopped and self.ranks.is_main:
            state = run.state
            log.info(f"early stop at step {state.step}: val loss has not improved for "
                     f"train.patience={self.config.train.patience} evaluations (best "
                     f"{state.best_val_loss:.4f} at step {state.best_step})")
        return self.result()

    # what launch/run.py calls around the loop

    def close(self) -> None:
        """The progress bar closed and the signal handlers put back (also after an error)."""
        self.closer.close()

    def result(self, aborted: bool = False) -> TrainResult:
        stop, state = self.stop_request, self.run.state if self.run else None
        stopped = aborted or stop.signum is not None
        return TrainResult(stop.status if stopped else "completed", state.step if state else 0,
                           state.best_val_loss if state else math.inf, self.run_dir,
                           stop.exit_code(aborted) if stopped else 0, self.early_stopped)

    def closing(self, result: Optional[TrainResult], resume_command) -> TrainResult:
        """The last line of a run a signal or closed pipe stopped (`result`), or aborted mid-step
        (None: 130, 141); `resume_command()`: the command that continues it."""
        if result is not None and not (result.exit_code and self.ranks.is_main):
            return result
        ckpt, step = getattr(self, "ckpt", None), self.run.state.step if self.run else 0
        if self.ranks.is_main:
            log.info(closing_line(self.stop_request.name, step, self.run_dir, ckpt and ckpt.last,
                                  ckpt and ckpt.last_step, resume_command(), aborted=result is None,
                                  stepped=step != self.first_step))
        return result or self.result(aborted=True)

    def finish(self, status: str) -> None:
        """Rank 0's summary record, loss.png, wandb.finish: also after errors (best effort)."""
        if self.report.started and self.run is not None:
            state = self.run.state
            self.report.finish(status, state, wall=time.perf_counter() - self.session_start,
                               train_s=self.train_seconds,
                               session_tokens=(state.step - self.first_step) * state.batch_tokens,
                               compiled=self.compiled, early_stopped=self.early_stopped,
                               stopped_by=self.stop_request.name)

    # the parts of the hooks above

    def _open_report(self) -> None:
        """The run directory, the wandb run's id (kept across resumes), the report's opening lines.
        """
        run, state = self.run, self.run.state
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.config.logger.name == "wandb":
            state.wandb_run_id = state.wandb_run_id or secrets.token_hex(4)
        self.report.start(self.config, self.run_dir, state, data=run.data, model=run.model,
                          precision=run.precision, compiled=self.compiled, ranks=self.ranks,
                          source=self.source, resumed_from=self.ckpt.source,
                          config_diff=self.ckpt.config_diff)
        old = self.ckpt.source_batch_tokens
        if self.resumed and old not in (None, state.batch_tokens):
            log.warning(f"the global batch changes from the checkpoint's {old:,} to "
                        f"{state.batch_tokens:,} tokens per step: the learning-rate schedule and "
                        f"the step count stay as they were")

    def _begin(self) -> None:
        """Random state restored (last: nothing may draw after it), the clock, the bar, the signal
        handlers; a resume with nothing left to train says so and the loop takes no step."""
        state, train, run = self.run.state, self.config.train, self.run
        self.rng.restore()
        state.started = self.interval_start = time.perf_counter()
        if (state.step >= train.max_iters or self._out_of_patience()) and not state.eval_pending:
            if self.ranks.is_main:
                self.report.nothing_to_train(state, train)
            self.idle = True
            return
        self.stop_request.install()
        self.closer.callback(self.stop_request.restore)
        show = self.ranks.is_main and sys.stderr.isatty()
        self.bar = self.report.bar = self.closer.enter_context(
            progress_bar(train.max_iters, state.step, show=show))
        # pending: a stop cut it short, redone as the straight run did it
        if state.eval_pending or (train.eval_at_start and not self.resumed):
            self.evaluated(run, self.guard("eval", evaluate, run, self),
                           save=state.eval_pending and state.step > 0)
        elif self.probe and not self.resumed and 0 in self.probe.steps:
            # the model before training (or the one fine-tuning starts from)
            self._probe()
        startup.mark("before step 1 (a step-0 probe or evaluation)")

    def _log_train(self, write: bool = True) -> None:
        """Read the window (NaN check, every rank), time it; a stop's (`write` False) stays
        unlogged."""
        state, values, now = self.run.state, self.window.read(self._diverged), time.perf_counter()
        seconds, self.interval_start = now - self.interval_start, now
        self.train_seconds += seconds
        if write and values:
            # restored: trained and timed before the resume
            steps = len(values["loss"]) - self.window.restored
            self.report.log_train(state.step, {name: sum(v) / len(v) for name, v in values.items()},
                                  self.run.lr_at(state.step - 1), state.tokens, state.elapsed(),
                                  steps * state.batch_tokens / seconds if seconds > 0 else 0.0)
            startup.mark("first logged step", end=True)
        if write:
            self.window.clear(state.step)

    def _probe(self, loss: Optional[torch.Tensor] = None) -> None:
        """A probe snapshot between evaluations, with this step's train loss (every rank: a
        collective)."""
        train_loss = None
        if loss is not None:
            train_loss = self.ranks.all_reduce_mean(loss.detach().clone()).item()
        t0 = time.perf_counter()
        self.probe.record(self.run.model, self.run.state.step, train_loss=train_loss)
        self.interval_start += time.perf_counter() - t0

    def _save(self, step: int, best: bool = False) -> None:
        """Every rank calls it (collectives); never diverged weights."""
        if not self.ranks.weights_finite(self.run.model.parameters()):
            self._diverged(step, float("nan"))
        self.ckpt.save(step, best)

    def _out_of_patience(self) -> bool:
        """patience x eval_interval steps since the best: known to every checkpoint."""
        train, state = self.config.train, self.run.state
        return train.patience is not None and state.best_step is not None and \
            state.step - state.best_step >= train.patience * train.eval_interval

    def _diverged(self, step: int, value: float) -> None:
        raise TrainingDiverged.at(step, value, self.run.lr_at(step - 1), self.config.optim.lr,
                                  self.ckpt.last, self.ckpt.last_step)

    def _to_eager(self) -> None:
        """The compile guard's fallback (it then runs the steps with compiling off)."""
        self.compiled = False
        self.run.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
