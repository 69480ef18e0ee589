"""The training loop, read top to bottom as nanoGPT's: `Trainer.setup()` builds a run's parts, `Trainer.fit()` trains
them; Ctrl-C, the closing line and the summary are the edge's (launch/run.py). Why it syncs once per log interval
and resumes exactly wherever a stop lands: docs/design.md.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch

from checkpoint.manager import CheckpointManager
from common import startup
from model.device import resolve_compile
from runtime.console import progress_bar
from runtime.ranks import Ranks
from runtime.signals import StopRequest, closing_line
from training.config import Config
from training.metrics import RunLog
from training.optim import build_optimizer, schedule, set_lr
from training.precision import setup_precision
from training.probe import ProbeRecorder, probe_steps
from training.state import MetricsWindow, RNGState, TrainResult, TrainState, seed_all
from training.step import (CompileGuard, EvalInterrupted, TrainingDiverged, compile_regions, eval_stats,
                           forward_backward, optimizer_step)

if TYPE_CHECKING:
    from training.init_from import Source

log = logging.getLogger(__name__)


class Trainer:
    """One run: setup() builds every part, fit() trains; finish() and closing() are the edge's (launch/run.py)."""

    def __init__(self, config: Config, run_dir: Path, ranks: Ranks, device: torch.device,
                 source: Optional[Source] = None):
        self.config, self.run_dir, self.ranks, self.device, self.source = config, Path(run_dir), ranks, device, source
        train = config.train
        self.stop, self.report = StopRequest(ranks), RunLog(train.max_iters)  # (rank 0 starts the report)
        self.batch_tokens = train.batch_size * train.grad_accum_steps * ranks.world_size * config.model.block_size
        self.state = TrainState(batch_tokens=self.batch_tokens)
        self.lr_schedule = schedule(config.optim, train.max_iters)  # step -> lr: a pure function (resumes)
        self.resumed = self.compiled = self.early_stopped = False
        self.session_start, self.train_seconds, self.first_step = time.perf_counter(), 0.0, 0

    def setup(self) -> None:
        startup.mark("run dir claimed, logging, notes")
        from data.chat_loader import build_loader
        from data.prepare import prepare
        from data.tokenizer import describe_tokenizer, token_bytes
        from model.gpt import GPT
        config, ranks, train, device = self.config, self.ranks, self.config.train, self.device
        self.precision = setup_precision(device, train.dtype, ranks.parallel)
        startup.mark("precision")
        with ranks.main_first():  # local rank 0 fills the cache, the other ranks then find it there
            self.prepared = prepare(config.data, progress=ranks.is_main, log=log.info)
        self.tokenizer = self.prepared.tokenizer
        if self.source is not None:
            from training import init_from
            init_from.check_tokenizer(self.source, self.tokenizer.to_dict())
        if train.hellaswag:  # a row this model cannot score is refused now, not at the first evaluation
            from training import eval_hellaswag
            eval_hellaswag.check(train.hellaswag, self.tokenizer, config.model.block_size)
        self.token_bytes = token_bytes(self.tokenizer).to(device)  # for bits per byte
        startup.mark("data")
        self.gpt_config = config.model.with_vocab(self.tokenizer.vocab_size)
        seed_all(train.seed)
        self.model = GPT(self.gpt_config) if self.source is None else \
            init_from.build(GPT, self.gpt_config, self.source, train.resume)
        self.model.to(device)  # the same on every rank
        startup.mark("model built")
        if ranks.rank:
            torch.manual_seed(train.seed + ranks.rank)  # different dropout masks per process
        # what the steps call: DDP(model), or the model itself (FSDP2 shards it in place)
        self.step_model = ranks.wrap_model(self.model, device, self.precision.dtype)
        optim = config.optim
        self.optimizer = build_optimizer(self.model, lr=optim.lr, weight_decay=optim.weight_decay,
                                         betas=(optim.beta1, optim.beta2), device_type=device.type, name=optim.name,
                                         muon_lr=optim.muon_lr, muon_momentum=optim.muon_momentum,
                                         muon_ns_steps=optim.muon_ns_steps)
        self.scaler = self.precision.grad_scaler()
        self.loader = build_loader(self.prepared, config.model.block_size, train.batch_size,
                                   seed=train.seed, grad_accum_steps=train.grad_accum_steps, rank=ranks.rank,
                                   world_size=ranks.world_size, device=device)
        self.window, self.rng = MetricsWindow(train.log_interval, device, ranks), RNGState(ranks, train.seed)
        parts = {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler, "loader": self.loader,
                 "loss_window": self.window, "rng": self.rng, "train_state": self.state}
        meta = {"model_config": self.gpt_config.to_dict(), "tokenizer": self.tokenizer.to_dict(),
                "config": dataclasses.asdict(config)}
        self.ckpt = CheckpointManager(self.run_dir, parts, meta, describe_tokenizer, ranks=ranks,
                                      sharded=ranks.parallel == "fsdp")
        self.resumed = self.ckpt.resume(train.resume) is not None
        self.first_step = self.state.step
        self.probe = train.probe and ProbeRecorder.start(self.run_dir, train.probe_text, self.tokenizer,
                                                         self.prepared.token_files()[1], config.model.block_size,
                                                         ranks, self.state.step, self.resumed,
                                                         probe_steps(train.max_iters, train.probe_steps))
        self.window.start(self.state.step)
        self.compiled = resolve_compile(train.compile, device)
        if self.compiled:  # its blocks and output, as regions (training/step.py): the steps still call step_model
            compile_regions(self.model)
        self.guard = CompileGuard(self.compiled, self._to_eager, rewound=[self.loader])  # a failing compiler: eager
        startup.mark("optimizer, loader, resume, compile set-up")
        if ranks.is_main:  # the run directory, the wandb run's id (kept across resumes), the report's opening lines
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if config.logger.name == "wandb":
                self.state.wandb_run_id = self.state.wandb_run_id or secrets.token_hex(4)
            self.report.start(config, self.run_dir, self.state, data=self.prepared, model=self.model,
                              precision=self.precision, compiled=self.compiled, ranks=ranks, source=self.source,
                              resumed_from=self.ckpt.source, config_diff=self.ckpt.config_diff)
            if self.resumed and (old := self.ckpt.source_batch_tokens) not in (None, self.batch_tokens):
                log.warning(f"the global batch changes from the checkpoint's {old:,} to {self.batch_tokens:,} tokens "
                            f"per step: the learning-rate schedule and the step count stay as they were")
        startup.mark("config printed")

    def fit(self) -> TrainResult:
        """Train from the state's step to train.max_iters, an early stop or a stop every rank agreed on: a log line
        each train.log_interval steps, an evaluation and a checkpoint each train.eval_interval steps."""
        state, train = self.state, self.config.train
        self.rng.restore()  # last: nothing may draw random numbers after this
        state.started = self.interval_start = time.perf_counter()
        if (state.step >= train.max_iters or self._out_of_patience()) and not state.eval_pending:
            if self.ranks.is_main:
                self.report.nothing_to_train(state, train)
            return self._result()
        self.stop.install()
        try:
            with progress_bar(train.max_iters, state.step, show=self.ranks.is_main and sys.stderr.isatty()) as bar:
                self.report.bar = bar
                if state.eval_pending or (train.eval_at_start and not self.resumed):  # pending: a stop cut it short
                    self._eval_and_save(save=state.eval_pending and state.step > 0)  # as the straight run did it
                elif self.probe and not self.resumed and 0 in self.probe.steps:
                    self._probe()  # the model before training (or the one fine-tuning starts from)
                startup.mark("before step 1 (a step-0 probe or evaluation)")
                while state.step < train.max_iters and not self.early_stopped and not self.stop.agreed():
                    set_lr(self.optimizer, self.lr_schedule(state.step))
                    metrics = self.guard.run("train", lambda: forward_backward(
                        self.step_model, self.loader.next_batch, accum=train.grad_accum_steps,
                        autocast=self.precision.autocast, scaler=self.scaler,
                        grad_sync=partial(self.ranks.grad_sync, self.step_model)))
                    metrics["grad_norm"] = optimizer_step(self.model, self.optimizer, scaler=self.scaler,
                                                          grad_clip=self.config.optim.grad_clip)
                    self.window.add(metrics)  # device tensors: read with one host sync at the log interval
                    state.step += 1
                    state.tokens += self.batch_tokens
                    bar.update(1)
                    if state.step == self.first_step + 1:  # a slow device: a word before the first log line
                        startup.mark("first step", wait=metrics["loss"].item)  # (a GPU's queue waited for)
                        self.report.first_step(state.step, time.perf_counter() - self.interval_start,
                                               train.log_interval)
                    if state.step % train.log_interval == 0 or state.step == train.max_iters:
                        self._log_train()
                    if state.step % train.eval_interval == 0 or state.step == train.max_iters:
                        self._eval_and_save()
                    elif self.probe and state.step in self.probe.steps:
                        self._probe(metrics["loss"])
                self._end_of_loop()  # the last window read, a stop's checkpoint
        finally:
            self.stop.restore()
        if self.early_stopped and self.ranks.is_main:
            log.info(f"early stop at step {state.step}: val loss has not improved for train.patience="
                     f"{train.patience} evaluations (best {state.best_val_loss:.4f} at step {state.best_step})")
        return self._result()

    def _log_train(self, write: bool = True) -> None:
        """Read the window (NaN check, every rank), time it; a stop's (`write` False) stays unlogged, for last.pt."""
        state, values, now = self.state, self.window.read(self._diverged), time.perf_counter()
        seconds, self.interval_start = now - self.interval_start, now
        self.train_seconds += seconds
        if write and values:
            steps = len(values["loss"]) - self.window.restored  # (restored: trained and timed before the resume)
            self.report.log_train(state.step, {name: sum(v) / len(v) for name, v in values.items()},
                                  self.lr_schedule(state.step - 1), state.tokens, state.elapsed(),
                                  steps * self.batch_tokens / seconds if seconds > 0 else 0.0)
            startup.mark("first logged step", end=True)
        if write:
            self.window.clear(state.step)

    def _eval_and_save(self, save: bool = True) -> None:
        state, step, t0 = self.state, self.state.step, time.perf_counter()
        self.window.read(self._diverged)  # NaN check before evaluating (and before any save)
        try:
            stats = self.guard.run("eval", self._evaluate)
        except EvalInterrupted:
            state.eval_pending = True  # saved with the stop's checkpoint: the resumed run redoes it
            if self.ranks.is_main:
                log.info(f"evaluation at step {step} skipped: stopping")
            return
        state.eval_pending = False
        for split in ("train", "val"):
            if not math.isfinite(stats[split]["loss"]):
                self._diverged(step, stats[split]["loss"])
        improved, before = save and stats["val"]["loss"] < state.best_val_loss, (state.best_val_loss, state.best_step)
        if improved:
            state.best_val_loss, state.best_step = stats["val"]["loss"], step
        self.report.log_eval(step, stats, self.lr_schedule(step - 1), state.tokens, state.elapsed(), improved)
        if save:
            try:
                self._save(step, best=improved)
            except BaseException:  # no best recorded without its best.pt
                state.best_val_loss, state.best_step = before
                raise
            self.early_stopped = step < self.config.train.max_iters and self._out_of_patience()  # (every rank)
        if self.config.train.hellaswag:  # after the save: a failing benchmark never costs the checkpoint
            from training import eval_hellaswag
            eval_hellaswag.at_eval(self.config.train.hellaswag, step, self.step_model, self.tokenizer,
                                   self.precision.autocast, self.ranks, self.report)
        if self.probe:  # what the model does with the probe text now (training/probe.py)
            self.probe.record(self.model, step, stats["val"]["loss"])
        self.interval_start += time.perf_counter() - t0  # evals and saves do not count as training time

    def _evaluate(self) -> dict[str, dict]:
        plan = self.ranks.eval_plan(self.config.train.eval_iters)  # this rank's share of the batches
        stop = lambda: self.stop.signum is not None and not self.ranks.distributed  # noqa: E731
        return {split: eval_stats(self.step_model, partial(self.loader.eval_batch, split), plan, stop=stop,
                                  autocast=self.precision.autocast, reduce_sum=self.ranks.all_reduce_sum,
                                  token_bytes=self.token_bytes) for split in ("train", "val")}

    def _probe(self, loss: Optional[torch.Tensor] = None) -> None:
        """A probe snapshot between evaluations, with this step's train loss (`loss`: every rank, a collective)."""
        train_loss = None if loss is None else self.ranks.all_reduce_mean(loss.detach().clone()).item()  # (a sync)
        t0 = time.perf_counter()
        self.probe.record(self.model, self.state.step, train_loss=train_loss)
        self.interval_start += time.perf_counter() - t0  # as an evaluation's: not training time

    def _save(self, step: int, best: bool = False) -> None:  # every rank calls it (collectives); never diverged weights
        if not self.ranks.weights_finite(self.model.parameters()):
            self._diverged(step, float("nan"))
        self.ckpt.save(step, best)

    def _end_of_loop(self) -> None:
        """A stop's window kept for its last.pt, saved unless this session took no step (nothing worth resuming)."""
        self.stop.finish()  # the stop all-reduce still in flight (every rank has one)
        if self.window.values or self.stop.signum is not None:
            self._log_train(write=self.stop.signum is None)
        if self.ckpt.last_step != self.state.step and self.state.step > self.first_step:
            self._save(self.state.step)

    def _out_of_patience(self) -> bool:  # patience x eval_interval steps since the best: known to every checkpoint
        train, state = self.config.train, self.state
        return train.patience is not None and state.best_step is not None and \
            state.step - state.best_step >= train.patience * train.eval_interval

    def _diverged(self, step: int, value: float) -> None:
        raise TrainingDiverged.at(step, value, self.lr_schedule(step - 1), self.config.optim.lr, self.ckpt.last,
                                  self.ckpt.last_step)

    def _to_eager(self) -> None:  # the compile guard's fallback (it then runs the steps with compiling off)
        self.compiled = False
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()  # (a no-op where CUDA is not in use)

    def _result(self, aborted: bool = False) -> TrainResult:
        stopped = aborted or self.stop.signum is not None
        return TrainResult(self.stop.status if stopped else "completed", self.state.step, self.state.best_val_loss,
                           self.run_dir, self.stop.exit_code(aborted) if stopped else 0, self.early_stopped)

    def closing(self, result: Optional[TrainResult], resume_command: Callable[[], str]) -> TrainResult:
        """The last line of a run a signal or closed pipe stopped (`result`), or aborted mid-step (None: 130, 141);
        `resume_command()`: the command that continues it."""
        if result is not None and not (result.exit_code and self.ranks.is_main):
            return result  # (ran to its end: nothing to say)
        ckpt = getattr(self, "ckpt", None)
        if self.ranks.is_main:
            log.info(closing_line(self.stop.name, self.state.step, self.run_dir, ckpt and ckpt.last,
                                  ckpt and ckpt.last_step, resume_command(), aborted=result is None,
                                  stepped=self.state.step != self.first_step))
        return result or self._result(aborted=True)

    def finish(self, status: str) -> None:
        """Rank 0's summary record, loss.png, wandb.finish: also after errors (best effort)."""
        if self.report.started:  # (rank 0 only)
            session_tokens = (self.state.step - self.first_step) * self.batch_tokens
            self.report.finish(status, self.state, wall=time.perf_counter() - self.session_start,
                               train_s=self.train_seconds, session_tokens=session_tokens, compiled=self.compiled,
                               early_stopped=self.early_stopped, stopped_by=self.stop.name)
