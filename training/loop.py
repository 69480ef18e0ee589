"""The training loop: `train(cfg, run_dir)`, a plain function (train.py is a thin Hydra wrapper around it).
Why it syncs with the host once per log interval and resumes exactly wherever a stop lands: docs/design.md.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import signal
import sys
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch

from checkpoint.manager import CheckpointManager
from model.device import resolve_compile
from runtime.console import progress_bar
from runtime.ranks import Ranks
from runtime.signals import SIGPIPE, StopRequest, closing_line, run_under_way
from training.config import Config, train_keys
from training.metrics import RunLog
from training.optim import build_optimizer, schedule, set_lr
from training.precision import setup_precision
from training.probe import ProbeRecorder, probe_steps
from training.state import LossWindow, RNGState, TrainResult, TrainState, seed_all
from training.step import (CompileGuard, EvalInterrupted, TrainingDiverged, compile_regions, eval_stats,
                           train_step)

if TYPE_CHECKING:
    from training.init_from import Source

log = logging.getLogger(__name__)


class Trainer:
    """One run: setup() builds every part, run() trains, finish() writes the summary (also after errors)."""

    def __init__(self, c: Config, run_dir: Path, ranks: Ranks, resume_command: Callable[[], str],
                 source: Optional[Source], device: torch.device):
        t, m = c.train, c.model
        self.c, self.run_dir, self.ranks, self.resume_command, self.source = c, run_dir, ranks, resume_command, source
        self.device = device  # resolved once, where the run was set up
        self.stop = StopRequest(ranks)
        self.report = RunLog(t.max_iters)  # metrics.jsonl, wandb, log lines (rank 0 starts it)
        self.tokens_per_step = t.batch_size * t.grad_accum_steps * ranks.world_size * m.block_size
        self.state = TrainState(tokens_per_step=self.tokens_per_step)
        self.lr_at = schedule(c.optim, t.max_iters)  # step -> learning rate (a pure function: exact on resume)
        self.resumed, self.compiled, self.early_stopped, self.first_step = False, False, False, None  # first: run()'s
        self.t_start, self.session_tokens, self.train_seconds, self.t_mark = time.perf_counter(), 0, 0.0, 0.0  # session

    def setup(self) -> None:
        from data.loader import BatchLoader
        from data.prepare import prepare
        from data.tokenizer import describe_tokenizer, token_bytes
        from model.gpt import GPT
        c, ranks, t, m, o, device = self.c, self.ranks, self.c.train, self.c.model, self.c.optim, self.device
        self.precision = setup_precision(device, t.dtype, ranks.parallel)
        with ranks.main_first():  # local rank 0 fills the cache, the other ranks then find it there
            self.prepared = prepare(c.data, progress=ranks.is_main, log=log.info)
        self.tokenizer = self.prepared.tokenizer
        if self.source is not None:
            from training import init_from
            init_from.check_tokenizer(self.source, self.tokenizer.to_dict())
        if t.hellaswag:  # a row this model cannot score is refused now, not at the first evaluation
            from training import eval_hellaswag
            eval_hellaswag.check(t.hellaswag, self.tokenizer, m.block_size)
        self.token_bytes = token_bytes(self.tokenizer).to(device)  # for bits per byte
        self.gpt_config = m.with_vocab(self.tokenizer.vocab_size)
        seed_all(t.seed)
        self.model = GPT(self.gpt_config) if self.source is None else \
            init_from.build(GPT, self.gpt_config, self.source, t.resume)
        self.model.to(device)  # the same on every rank
        if ranks.rank:
            torch.manual_seed(t.seed + ranks.rank)  # different dropout masks per process
        # what the steps call: DDP(model), or the model itself (FSDP2 shards it in place)
        self.step_model = ranks.wrap_model(self.model, device, self.precision.dtype)
        self.optimizer = build_optimizer(self.model, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                                         device_type=device.type, name=o.name, muon_lr=o.muon_lr,
                                         muon_momentum=o.muon_momentum, muon_ns_steps=o.muon_ns_steps)
        self.scaler = self.precision.grad_scaler()
        self.loader = BatchLoader(*self.prepared.token_files(), m.block_size, t.batch_size,
                                  seed=t.seed, grad_accum_steps=t.grad_accum_steps, rank=ranks.rank,
                                  world_size=ranks.world_size, device=device)
        self.window, self.rng = LossWindow(t.log_interval, device, ranks), RNGState(ranks, t.seed)
        parts = {"model": self.model, "optimizer": self.optimizer, "scaler": self.scaler, "loader": self.loader,
                 "loss_window": self.window, "rng": self.rng, "train_state": self.state}
        meta = {"model_config": self.gpt_config.to_dict(), "tokenizer": self.tokenizer.to_dict(),
                "config": dataclasses.asdict(c)}
        self.ckpt = CheckpointManager(self.run_dir, parts, meta, describe_tokenizer, ranks=ranks,
                                      sharded=ranks.parallel == "fsdp")
        self.resumed = self.ckpt.resume(t.resume) is not None
        self.probe = t.probe and ProbeRecorder.start(self.run_dir, t.probe_text, self.tokenizer,
                                                     self.prepared.token_files()[1], m.block_size, ranks,
                                                     self.state.step, self.resumed,
                                                     probe_steps(t.max_iters, t.probe_steps))
        self.window.start(self.state.step)
        self.compiled = resolve_compile(t.compile, device)
        if self.compiled:  # its blocks and output, as regions (training/step.py): the steps still call step_model
            compile_regions(self.model)
        self.guard = CompileGuard(self.compiled, self._to_eager, rewound=[self.loader])  # a failing compiler: eager
        if ranks.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if c.logger.name == "wandb":
                self.state.wandb_run_id = self.state.wandb_run_id or secrets.token_hex(4)
            self.report.start(c, self.run_dir, self.state, data=self.prepared, model=self.model,
                              precision=self.precision, compiled=self.compiled, ranks=ranks, source=self.source,
                              resumed_from=self.ckpt.source, config_diff=self.ckpt.config_diff)
            if self.resumed and (old := self.ckpt.source_tokens_per_step) not in (None, self.tokens_per_step):
                log.warning(f"the global batch changes from the checkpoint's {old:,} to {self.tokens_per_step:,} "
                            f"tokens per step: the learning-rate schedule and the step count stay as they were")

    def run(self) -> TrainResult:
        c, t, st = self.c, self.c.train, self.state
        self.rng.restore()  # last: nothing may draw random numbers after this
        st.started = self.t_mark = time.perf_counter()
        self.first_step = st.step
        if (st.step >= t.max_iters or self._out_of_patience()) and not st.eval_pending:
            if self.ranks.is_main:
                self.report.nothing_to_train(st, t)
            return self._result()
        self.stop.install()
        try:
            with progress_bar(t.max_iters, st.step, show=self.ranks.is_main and sys.stderr.isatty()) as self.report.bar:
                if st.eval_pending or (t.eval_at_start and not self.resumed):  # pending: a stop cut it short
                    self._eval_and_save(save=st.eval_pending and st.step > 0)  # as the straight run did it
                elif self.probe and not self.resumed and 0 in self.probe.steps:
                    self._probe()  # the model before training (or the one fine-tuning starts from)
                while st.step < t.max_iters and not self.early_stopped and not self.stop.agreed():
                    set_lr(self.optimizer, self.lr_at(st.step))
                    loss = self.guard.run("train", lambda: train_step(
                        self.step_model, self.optimizer, self.loader.next_batch, accum=t.grad_accum_steps,
                        autocast=self.precision.autocast, scaler=self.scaler, grad_clip=c.optim.grad_clip,
                        grad_sync=partial(self.ranks.grad_sync, self.step_model)))
                    self.window.add(loss)  # a device tensor: read (one sync) at the log interval
                    st.step += 1
                    st.tokens += self.tokens_per_step
                    self.session_tokens += self.tokens_per_step
                    self.report.bar.update(1)
                    if st.step == self.first_step + 1 and self.ranks.is_main:  # a slow device: a word before the log's
                        self.report.first_step(st.step, time.perf_counter() - self.t_mark, t.log_interval)
                    if st.step % t.log_interval == 0 or st.step == t.max_iters:
                        self._log_train()
                    if st.step % t.eval_interval == 0 or st.step == t.max_iters:
                        self._eval_and_save()
                    elif self.probe and st.step in self.probe.steps:
                        self._probe(loss)
                self.stop.finish()  # the stop all-reduce still in flight (every rank has one)
                if self.window.n or self.stop.signum is not None:
                    self._log_train(write=self.stop.signum is None)
                if self.ckpt.last_step != st.step and st.step > self.first_step:  # stopped before step 1: nothing
                    self._save(st.step)  # to save (a step-0 last.pt would only block rerunning the command)
        finally:
            self.stop.restore()
        if self.early_stopped and self.ranks.is_main:
            log.info(f"early stop at step {st.step}: val loss has not improved for train.patience={t.patience} "
                     f"evaluations (best {st.best_val_loss:.4f} at step {st.best_step})")
        return self._result()

    def _out_of_patience(self) -> bool:  # patience x eval_interval steps since the best: known to every checkpoint
        t, st = self.c.train, self.state
        return t.patience is not None and st.best_step is not None and \
            st.step - st.best_step >= t.patience * t.eval_interval

    def _evaluate(self) -> dict[str, dict]:
        plan = self.ranks.eval_plan(self.c.train.eval_iters)  # this rank's share of the batches
        stop = lambda: self.stop.signum is not None and not self.ranks.distributed  # noqa: E731
        return {split: eval_stats(self.step_model, partial(self.loader.eval_batch, split), plan, stop=stop,
                                  autocast=self.precision.autocast, reduce_sum=self.ranks.all_reduce_sum,
                                  token_bytes=self.token_bytes) for split in ("train", "val")}

    def _to_eager(self) -> None:  # the compile guard's fallback (it then runs the steps with compiling off)
        self.compiled = False
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()  # (a no-op where CUDA is not in use)

    def _eval_and_save(self, save: bool = True) -> None:
        st, step = self.state, self.state.step
        self.window.read(self._diverged)  # NaN check before evaluating (and before any save)
        t0 = time.perf_counter()
        try:
            stats = self.guard.run("eval", self._evaluate)
        except EvalInterrupted:
            st.eval_pending = True  # saved with the stop's checkpoint: the resumed run redoes it
            if self.ranks.is_main:
                log.info(f"evaluation at step {step} skipped: stopping")
            return
        st.eval_pending = False
        for split in ("train", "val"):
            if not math.isfinite(stats[split]["loss"]):
                self._diverged(step, stats[split]["loss"])
        improved, before = save and stats["val"]["loss"] < st.best_val_loss, (st.best_val_loss, st.best_step)
        if improved:
            st.best_val_loss, st.best_step = stats["val"]["loss"], step
        self.report.eval(step, stats, self.lr_at(step - 1), st.tokens, st.elapsed(), improved)
        if save:
            try:
                self._save(step, best=improved)
            except BaseException:  # no best recorded without its best.pt
                st.best_val_loss, st.best_step = before
                raise
            self.early_stopped = step < self.c.train.max_iters and self._out_of_patience()  # same on every rank
        if self.c.train.hellaswag:  # after the save: a failing benchmark never costs the checkpoint
            from training import eval_hellaswag
            eval_hellaswag.at_eval(self.c.train.hellaswag, step, self.step_model, self.tokenizer,
                                   self.precision.autocast, self.ranks, self.report)
        if self.probe:  # what the model does with the probe text now (training/probe.py)
            self.probe.record(self.model, step, stats["val"]["loss"])
        self.t_mark += time.perf_counter() - t0  # evals and saves do not count as training time

    def _probe(self, loss: Optional[torch.Tensor] = None) -> None:
        """A probe snapshot between evaluations, with this step's train loss (`loss`: every rank, a collective)."""
        train_loss = None if loss is None else self.ranks.all_reduce_mean(loss.detach().clone()).item()  # (a sync)
        t0 = time.perf_counter()
        self.probe.record(self.model, self.state.step, train_loss=train_loss)
        self.t_mark += time.perf_counter() - t0  # as an evaluation's: not training time

    def _save(self, step: int, best: bool = False) -> None:  # every rank calls it (collectives); never diverged weights
        if not self.ranks.weights_finite(self.model.parameters()):
            self._diverged(step, float("nan"))
        self.ckpt.save(step, best)

    def _diverged(self, step: int, value: float) -> None:
        raise TrainingDiverged.at(step, value, self.lr_at(step - 1), self.c.optim.lr, self.ckpt.last,
                                  self.ckpt.last_step)

    def _log_train(self, write: bool = True) -> None:
        """Read the window (NaN check, every rank), time it; a stop's (`write` False) stays unlogged, for last.pt."""
        st, vals = self.state, self.window.read(self._diverged)
        now = time.perf_counter()
        dt, timed = now - self.t_mark, len(vals) - self.window.restored  # restored: timed before the resume
        self.t_mark, self.train_seconds = now, self.train_seconds + dt
        if write:
            self.window.clear(st.step)
        if vals and write:
            tps = timed * self.tokens_per_step / dt if dt > 0 else 0.0
            self.report.train(st.step, sum(vals) / len(vals), self.lr_at(st.step - 1), st.tokens, st.elapsed(), tps)

    def _result(self, aborted: bool = False) -> TrainResult:
        stopped = aborted or self.stop.signum is not None
        return TrainResult(self.stop.status if stopped else "completed", self.state.step, self.state.best_val_loss,
                           self.run_dir, self.stop.exit_code(aborted) if stopped else 0, self.early_stopped)

    def closing(self, result: Optional[TrainResult]) -> TrainResult:
        """The last line of a run a signal or closed pipe stopped (`result`), or aborted mid-step (None: 130, 141)."""
        if result is not None and not (result.exit_code and self.ranks.is_main):
            return result  # (ran to its end: nothing to say)
        ckpt = getattr(self, "ckpt", None)
        if self.ranks.is_main:
            log.info(closing_line(self.stop.name, self.state.step, self.run_dir, ckpt and ckpt.last,
                                  ckpt and ckpt.last_step, self.resume_command(),
                                  aborted=result is None, stepped=self.state.step != self.first_step))
        return result or self._result(aborted=True)

    def finish(self, status: str) -> None:
        """Rank 0's summary record, loss.png, wandb.finish: also after errors (best effort)."""
        if self.report.started:  # (rank 0 only)
            self.report.finish(status, self.state, wall=time.perf_counter() - self.t_start, train_s=self.train_seconds,
                               session_tokens=self.session_tokens, compiled=self.compiled,
                               early_stopped=self.early_stopped, stopped_by=self.stop.name)


@train_keys()  # the data and model libraries' errors, told in this config's keys (data.path, model.block_size)
def train(c: Config, run_dir: Path, *, ranks: Ranks, device: torch.device, source: Optional[Source] = None,
          resume_command: Callable[[], str] = lambda: "", on_start: Optional[Callable[[], None]] = None) -> TrainResult:
    """Train a run set up by the edge (launch/run.py: config validated, `source` opened, job joined, `device` resolved,
    `run_dir` claimed) into `run_dir`. `on_start`: called once the run is set up (a resume accepted), before its
    first step. `resume_command()`: the command that continues it, for its closing line."""
    trainer, status, result, under_way = None, "failed", None, ExitStack()
    with under_way:  # undone last: from on_start to the closing line, a Ctrl-C is the run's (runtime/signals.py)
        try:
            trainer = Trainer(c, Path(run_dir), ranks, resume_command, source, device)
            trainer.setup()
            if on_start is not None:
                on_start()
            under_way.enter_context(run_under_way())
            result = trainer.run()
            status, result.clean = result.status, True  # (a Ctrl-C while finishing below unsets result)
        except TrainingDiverged:
            status = "diverged"
            raise
        except (KeyboardInterrupt, BrokenPipeError) as e:  # a second Ctrl-C (or one before the handlers were in),
            if trainer is None:  # or a write past the console (a library's) that met the closed pipe: no more saving
                raise
            trainer.stop.signum = SIGPIPE if isinstance(e, BrokenPipeError) else signal.SIGINT
            status = trainer.stop.status
        finally:
            try:
                if trainer is not None:
                    trainer.finish(status)
            except KeyboardInterrupt:  # a Ctrl-C while finishing (every file is written atomically)
                result = None
        return trainer.closing(result)
