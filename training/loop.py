"""The training loop: `train(cfg, run_dir=None)`, a plain function (train.py is a thin Hydra wrapper).

Design, in the order train() runs:
1. Config: `to_dataclass(cfg)` validates the composed config; from here on only dataclasses.
2. Process and device: `setup_device` (CUDA > MPS > CPU; bf16/fp16/fp32 autocast; TF32) and, under
   torchrun, `training.distributed` (its docstring has the design): a process group (NCCL on CUDA, gloo
   on CPU), DDP or FSDP2 (`train.parallel`), the loader's rank/world_size share of the global batch,
   no gradient all-reduce on all but the last micro-step, losses all-reduced only where they are read
   (log and eval steps), every rank stopping after the same step on a signal. Only rank 0 writes files,
   logs, draws the bar and talks to wandb. A plain `python train.py` starts no process group.
3. Resume: `train.resume=true` -> <run_dir>/last.pt; `train.resume=PATH` -> that file (or run dir's
   last.pt). The checkpoint must match the model shape and the prepared data's vocabulary (one-line
   ValueError otherwise); other differing settings are listed in one warning. Without resume, a run dir
   that already holds last.pt is refused rather than overwritten.
4. Data (`data.prepare.prepare`, cached) -> tokenizer and token files -> `BatchLoader`.
5. Model, seeded; AdamW (optim.py); GradScaler for fp16; optional torch.compile. State, RNGs and the
   loader position are restored from the checkpoint last, so a resumed run continues bitwise exactly
   (CPU): same weights, optimizer state, dropout masks and batches as an uninterrupted run.
6. The loop. The hot path never synchronises with the host: each step's loss goes into a small device
   buffer, the learning rate is a Python float, `zero_grad(set_to_none=True)`; `.tolist()` happens once
   per `log_interval` (loss, NaN check, tokens/s, MFU) and at evals. A non-finite loss stops the run
   naming the first bad step; weights are checked finite before every save, so a checkpoint never holds
   a diverged state.
7. Every `eval_interval` steps and at the end: mean train/val loss over `eval_iters` fixed batches,
   last.pt (atomic), best.pt on improvement (a hard link to the same bytes), metrics.jsonl records.
8. SIGINT/SIGTERM set a flag: the current step finishes, last.pt is written, and train() returns with
   exit code 130/143 (a second Ctrl-C aborts at once; atomic saves keep the files intact). Every
   checkpoint also holds the losses logged since the last log line and whether a stop cut its evaluation
   short, so a resumed run writes the same metrics.jsonl as an uninterrupted one (the loss window is
   restored, the evaluation redone) wherever the stop or kill landed.
9. At exit (also on error): a summary record, loss.png, wandb.finish().

torch.compile (on by default on CUDA) compiles lazily, so the first train step and the first eval run
under a guard: if compilation fails, the RNG and loader state are rolled back, one warning is logged and
the step is redone eagerly. Progress is a tqdm bar on terminals; console log lines go through
tqdm.write while it is shown, and the per-interval train lines (always in train.log) are hidden from a
console that shows the bar.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import torch

from checkpoint import file as ckpt_lib
from training import distributed as dist_lib
from training.config import Config, to_dataclass
from training.console import console_with_bar
from training.device import DeviceSetup, resolve_compile, resolve_device, setup_device
from training.metrics import (MetricsWriter, flops_per_token, format_count, format_duration, mfu as compute_mfu,
                              plot_loss, read_metrics, records_up_to, write_records_atomic)
from training.optim import build_optimizer, load_optimizer_state, lr_at, set_lr
from training.signals import EXIT_CODES, StopRequest
from training.wandb_run import WandbRun

log = logging.getLogger(__name__)

class _EvalInterrupted(BaseException):  # not Exception: the compile guard must not catch it
    """A stop signal arrived during an evaluation (internal)."""


class TrainingDiverged(ValueError):
    """The loss became NaN/inf; the message names the step and the last good checkpoint."""


@dataclass
class TrainResult:
    status: str  # "completed" | "interrupted"
    step: int
    best_val_loss: float
    run_dir: Path
    exit_code: int = 0  # 0, or 130 (SIGINT) / 143 (SIGTERM)
    last_checkpoint: Optional[Path] = None


Runtime = dist_lib.DistInfo  # this process's place in the job: rank 0 of 1 without torchrun


# ------------------------------------------------------------------------------------------- helpers

def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


_DIFF_IGNORED = ("train.resume", "train.device", "train.dtype", "train.compile", "train.parallel", "logger.")


def _config_diff(old: dict, new: dict) -> list[str]:
    a, b = _flatten(old or {}), _flatten(new)
    keys = sorted(set(a) | set(b))
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys
            if a.get(k) != b.get(k) and not k.startswith(_DIFF_IGNORED)]


def _padded_vocab(vocab_size: int, multiple: int) -> int:
    return ((vocab_size + multiple - 1) // multiple) * multiple


def _default_run_dir() -> Path:
    now = datetime.now()
    return Path("outputs") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")


def _resume_command(run_dir: Path, cli_overrides: Optional[list[str]], rt: Optional[Runtime] = None) -> str:
    keep = [o for o in (cli_overrides or []) if not o.startswith(("train.resume=", "hydra.run.dir=", "hydra.sweep."))]
    launch = ["python"]
    if rt is not None and rt.distributed:
        nodes = max(1, rt.world_size // max(1, rt.local_world_size))
        launch = ["torchrun", "--standalone", f"--nproc_per_node={rt.local_world_size}"] if nodes == 1 else \
            ["torchrun", f"--nnodes={nodes}", "--node-rank=NODE_RANK", f"--nproc_per_node={rt.local_world_size}",
             "--rdzv-backend=c10d", "--rdzv-endpoint=HOST:PORT"]
    parts = [*launch, "train.py", *keep, f"hydra.run.dir={run_dir}", "train.resume=true"]
    return " ".join(shlex.quote(p) for p in parts)


# ------------------------------------------------------------------------------------------- the trainer

class _Trainer:
    """One training run's state. train() below is its only user; split into methods for readability."""

    def __init__(self, c: Config, run_dir: Path, rt: Runtime, cli_overrides: Optional[list[str]]):
        self.c = c
        self.run_dir = run_dir
        self.rt = rt
        self.cli_overrides = cli_overrides
        self.resolved = dataclasses.asdict(c)
        self.t_start = time.perf_counter()
        self.stop = StopRequest()
        self.stop_agreement = dist_lib.StopAgreement(rt)
        self.wandb = WandbRun()
        self.metrics = MetricsWriter(None)
        self.bar = None
        self.step = 0
        self.start_step = 0
        self.best_val_loss = math.inf
        self.best_step: Optional[int] = None
        self.last_saved_step: Optional[int] = None
        self.last_checkpoint: Optional[Path] = None
        self.elapsed_before = 0.0  # training seconds of earlier sessions (resume)
        self.train_seconds = 0.0  # this session, steps only (no evals/saves)
        self.session_tokens = 0
        self.tokens = 0  # training tokens so far, all sessions (a resume may change the global batch)
        self.compiled = False
        self.compile_verified = {"train": False, "eval": False}
        self.wandb_run_id: Optional[str] = None
        self.num_params = 0
        self.eval_skipped_step: Optional[int] = None  # an evaluation a stop signal cut short (redone on resume)
        self.eval_pending = False  # resumed from a checkpoint whose evaluation was cut short
        self.win_restored = 0  # losses in the window that came from the checkpoint (not timed this session)

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        c, rt = self.c, self.rt
        self.dev: DeviceSetup = setup_device(c.train.device, c.train.dtype, rt.local_rank)
        device = self.dev.device
        dist_lib.check_dtype(rt, self.dev.dtype)
        self.peak_flops = self.dev.peak_flops * rt.world_size if self.dev.peak_flops else None  # MFU of all GPUs

        ckpt = self._load_resume_checkpoint()
        self.ckpt_path: Optional[Path] = self._ckpt_path

        from data.prepare import prepare
        with dist_lib.main_first(rt):  # local rank 0 fills the cache, the other ranks then find it there
            prepared = prepare(c.data, progress=rt.is_main, log=log.info)  # notes into train.log too
        self.tokenizer = prepared.tokenizer
        if ckpt is not None and ckpt.get("tokenizer") is not None and ckpt["tokenizer"] != self.tokenizer.to_dict():
            old = ckpt["tokenizer"]
            raise ValueError(f"the prepared data's vocabulary ({self.tokenizer.describe()}) differs from the "
                             f"checkpoint's ({old.get('type', '?')}, {_vocab_len(old)}): resume with the data "
                             f"settings the checkpoint was trained with ({_data_settings(ckpt)})")

        from model import GPT, GPTConfig
        m = c.model
        self.gpt_config = GPTConfig(vocab_size=_padded_vocab(self.tokenizer.vocab_size, m.pad_vocab_to),
                                    block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                                    dropout=m.dropout, bias=m.bias, tie_weights=m.tie_weights, attention=m.attention)
        if ckpt is not None:
            self._check_model_matches(ckpt)

        torch.manual_seed(c.train.seed)
        import random
        import numpy as np
        random.seed(c.train.seed)
        np.random.seed(c.train.seed)
        model = GPT(self.gpt_config)
        if ckpt is not None and self.resume_sharded is None:
            ckpt_lib.load_model_weights(model, ckpt["model"], source=str(self.ckpt_path))
        self.model = model.to(device)
        self.model.train()
        if rt.rank:
            torch.manual_seed(c.train.seed + rt.rank)  # different dropout masks per process
        # DDP(model), or the model sharded in place by FSDP2 (before the optimizer: its params become shards)
        self.wrapped = dist_lib.wrap_model(self.model, rt, device, self.dev.dtype)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.num_params = self.model.num_params()

        o = c.optim
        self.optimizer = build_optimizer(self.model, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                                         device_type=device.type, name=o.name, muon_lr=o.muon_lr,
                                         muon_momentum=o.muon_momentum, muon_ns_steps=o.muon_ns_steps)
        self.scaler = torch.amp.GradScaler(device.type, enabled=True) if self.dev.use_grad_scaler else None

        from data.loader import BatchLoader
        t = c.train
        self.loader = BatchLoader(prepared.train_path, prepared.val_path, m.block_size, t.batch_size, seed=t.seed,
                                  grad_accum_steps=t.grad_accum_steps, rank=rt.rank, world_size=rt.world_size,
                                  device=device)
        self.tokens_per_step = t.batch_size * t.grad_accum_steps * rt.world_size * m.block_size
        self.decay_iters = o.decay_iters if o.decay_iters is not None else t.max_iters
        self.flops_per_token = flops_per_token(self.num_params, m.n_layer, m.n_head, m.n_embd // m.n_head,
                                               m.block_size)

        if ckpt is not None:
            self._restore_training_state(ckpt)

        self.step = self.start_step
        self.want_compile = resolve_compile(t.compile, device)
        self.compiled = self.want_compile  # compile(DDP(model)): DDP's graph breaks overlap its all-reduces
        self.model_c = torch.compile(self._wrap(self.model)) if self.want_compile else self._wrap(self.model)

        if rt.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt_lib.remove_stale_temp_files(self.run_dir)
            if c.logger.name == "wandb":  # first: a missing API key must not leave files behind
                if self.wandb_run_id is None:
                    self.wandb_run_id = secrets.token_hex(4)
                self.wandb.start(c, self.resolved, self.run_dir, self.wandb_run_id)
            self._init_metrics(resumed=ckpt is not None)
        self._log_start(prepared, ckpt)
        # the window of per-step losses read at each log interval (one host sync per interval)
        self.win = torch.zeros(max(1, t.log_interval), device=device, dtype=torch.float32)
        self.win_n = 0
        self.win_first_step = self.step
        if ckpt is not None:
            self._restore_loss_window(ckpt.get("loss_window"))
        self.rng_restore = dist_lib.rank_rng_state(ckpt, rt, c.train.seed) if ckpt is not None else None

    def _load_resume_checkpoint(self) -> Optional[dict]:
        r = self.c.train.resume
        self._ckpt_path = None
        self.resume_sharded: Optional[Path] = None  # a DCP checkpoint directory (FSDP runs write them)
        last = self.run_dir / "last.pt"
        if r is False:
            if last.exists():
                raise ValueError(f"{self.run_dir} already holds last.pt from an earlier run: continue it with "
                                 f"train.resume=true, or choose another hydra.run.dir (nothing was overwritten)")
            return None
        if self.rt.is_main and self.run_dir.is_dir():
            dist_lib.recover_sharded(self.run_dir)  # finish a sharded-checkpoint swap that a kill interrupted
        dist_lib.barrier(self.rt)
        kind, path = dist_lib.resume_source(r, self.run_dir)  # last.pt or last_dcp/, whichever is newer
        if r is True and kind == "file" and not last.is_file():
            raise ValueError(f"train.resume=true but {self.run_dir} has no last.pt (every run gets a new "
                             f"directory): pass the earlier run's directory with hydra.run.dir=<run dir> "
                             f"train.resume=true, or give train.resume=<path to last.pt>")
        if kind == "sharded":
            ckpt = dist_lib.read_sharded_meta(path)
            self.resume_sharded = path
        else:
            ckpt = ckpt_lib.load_checkpoint(path, map_location="cpu")
            if ckpt.get("optimizer") is None and ckpt.get("sharded"):
                raise ValueError(f"{path} is the weights-only export of an FSDP run: resume from its sharded "
                                 f"checkpoint with train.resume={path.parent / dist_lib.LAST_DCP}")
        self._ckpt_path = path
        return ckpt

    def _check_model_matches(self, ckpt: dict) -> None:
        mine = self.gpt_config.to_dict()
        theirs = dict(ckpt["model_config"])
        diffs = [k for k in mine if k != "dropout" and theirs.get(k) != mine[k]]
        if diffs:
            here = ", ".join(f"{k}={mine[k]}" for k in diffs)
            there = ", ".join(f"model.{k}={theirs.get(k)}" for k in diffs if k != "vocab_size")
            fix = f"resume with the checkpoint's model settings ({there})" if there else \
                "resume with the data the checkpoint was trained on"
            raise ValueError(f"the model does not match the checkpoint {self.ckpt_path}: here {here}, in the "
                             f"checkpoint " + ", ".join(f"{k}={theirs.get(k)}" for k in diffs) + f": {fix}")

    def _restore_training_state(self, ckpt: dict) -> None:
        opt_state = ckpt.get("optimizer")
        if opt_state is None and self.resume_sharded is None:
            raise ValueError(f"checkpoint {self.ckpt_path} has no optimizer state, so it cannot be resumed: "
                             f"start a new run")
        if self.resume_sharded is not None:  # DCP: weights + optimizer, resharded onto this world size
            dist_lib.load_sharded(self.resume_sharded, self.model, self.optimizer, self.rt)
        try:
            if self.resume_sharded is not None:
                pass
            elif self.rt.parallel == "fsdp":  # a single-file checkpoint (weights loaded before sharding)
                dist_lib.load_full_optimizer_state(self.model, self.optimizer, opt_state, self.rt)
            else:
                load_optimizer_state(self.optimizer, opt_state)
        except (ValueError, KeyError, RuntimeError) as e:
            raise ValueError(f"the optimizer state in {self.ckpt_path} does not fit this model "
                             f"({str(e).splitlines()[0]}): resume with the settings it was trained with") from None
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        if ckpt.get("loader") is not None:
            self.loader.load_state_dict(ckpt["loader"])
        self.start_step = int(ckpt["step"])
        if self.loader.step != self.start_step:
            raise ValueError(f"checkpoint {self.ckpt_path} is inconsistent (step {self.start_step}, loader at step "
                             f"{self.loader.step}): it is corrupt; use another checkpoint")
        bv = ckpt.get("best_val_loss")
        self.best_val_loss = float(bv) if bv is not None else math.inf
        self.best_step = ckpt.get("best_step")
        self.elapsed_before = float(ckpt.get("elapsed_s") or 0.0)
        self.tokens = _checkpoint_tokens(ckpt, self.tokens_per_step)
        self.wandb_run_id = ckpt.get("wandb_run_id")
        self.last_saved_step = self.start_step
        self.last_checkpoint = self.ckpt_path  # the last good checkpoint, until this run writes one
        self.eval_pending = bool(ckpt.get("eval_pending"))
        self.resume_diff = _config_diff(ckpt.get("config") or {}, self.resolved)

    def _restore_loss_window(self, window: Optional[dict]) -> None:
        """Put back the losses of the steps since the checkpoint's last log line (exact metrics on resume).
        Skipped when train.log_interval changed so that they no longer fit one window."""
        if not window or not window.get("losses"):
            return
        losses, first = [float(v) for v in window["losses"]], int(window["first_step"])
        interval = self.c.train.log_interval
        if first + len(losses) != self.step or first % interval or len(losses) >= interval:
            return
        self.win[: len(losses)] = torch.tensor(losses, dtype=self.win.dtype)
        self.win_n = self.win_restored = len(losses)
        self.win_first_step = first

    def _init_metrics(self, resumed: bool) -> None:
        path = self.run_dir / "metrics.jsonl"
        if resumed:
            # keep the records up to the checkpoint's step (from wherever the checkpoint came from)
            src = self.ckpt_path.parent / "metrics.jsonl"
            records = records_up_to(read_metrics(src), self.start_step) if src.is_file() else []
            write_records_atomic(path, records)
        elif path.exists():
            path.unlink()  # a run that died before its first checkpoint: start the file afresh
        self.metrics = MetricsWriter(path)

    def _log_start(self, prepared, ckpt) -> None:
        if not self.rt.is_main:
            return
        c, m, t = self.c, self.c.model, self.c.train
        log.info(f"run dir: {self.run_dir}")
        log.info(f"data: {c.data.name}, {self.tokenizer.describe()}, {format_count(len(self.loader.files['train']))} "
                 f"train / {format_count(len(self.loader.files['val']))} val tokens ({prepared.dir})")
        log.info(f"model: {self.num_params / 1e6:.2f}M parameters ({m.n_layer} layers, {m.n_head} heads, "
                 f"{m.n_embd} wide, context {m.block_size}, vocab {self.gpt_config.vocab_size}, "
                 f"dropout {m.dropout:g})")
        comp = "torch.compile on" if self.compiled else "eager (no torch.compile)"
        log.info(f"device: {self.dev.device} ({self.dev.name}), {self.dev.dtype_name}"
                 f"{' + GradScaler' if self.scaler else ''}, {comp}")
        if self.rt.distributed:
            log.info(f"parallel: {dist_lib.describe(self.rt)}")
        total = (t.max_iters - self.start_step) * self.tokens_per_step
        log.info(f"global batch: {self.tokens_per_step:,} tokens per step ({t.batch_size} sequences x "
                 f"{m.block_size} tokens x {t.grad_accum_steps} accumulation x {self.rt.world_size} process"
                 f"{'es' if self.rt.world_size > 1 else ''}); {t.max_iters - self.start_step} steps to go = "
                 f"{format_count(total)} tokens")
        if ckpt is not None:
            best = f"best val loss {self.best_val_loss:.4f}" if math.isfinite(self.best_val_loss) else "no eval yet"
            log.info(f"resumed from {self.ckpt_path} at step {self.start_step} ({best})")
            if self.resume_diff:
                log.warning("resuming with settings that differ from the checkpoint's: "
                            + "; ".join(self.resume_diff))

    # -- the pieces of a step --------------------------------------------------------------------------
    def _no_sync(self, micro: int):
        """Gradients are reduced across ranks only on the last micro-step (DDP no_sync / FSDP2)."""
        return dist_lib.grad_sync(self.wrapped, self.rt, last=micro == self.c.train.grad_accum_steps - 1)

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the steps call: DDP(model) or the FSDP2-sharded model (built once in setup, before the
        optimizer), or `model` itself in a single process. The compile fallback calls it with the eager module."""
        return self.wrapped if model is self.model else model

    def _should_stop(self) -> bool:
        """Whether a stop signal arrived: this rank's or, under torchrun, any rank's, agreed through an
        asynchronous all-reduce so that every rank stops after the same step (training/distributed.py)."""
        agreed = self.stop_agreement.poll(self.stop.signum)  # single process: just the local flag, no sync
        if agreed and self.stop.signum is None:
            self.stop.signum = agreed  # another rank was signalled: stop (and exit) the same way
        return bool(agreed)

    def _lr_at(self, step: int) -> float:
        o = self.c.optim
        return lr_at(step, lr=o.lr, min_lr=o.min_lr, warmup_iters=o.warmup_iters, decay_iters=self.decay_iters,
                     schedule=o.schedule, cooldown_frac=o.cooldown_frac)

    def _train_step(self, step: int) -> torch.Tensor:
        """One optimizer step (all micro-steps). Returns the step's mean loss as a device tensor (no sync)."""
        lr = self._lr_at(step)
        set_lr(self.optimizer, lr)
        accum = self.c.train.grad_accum_steps
        total = None
        for micro in range(accum):
            x, y = self.loader.next_batch()
            with self._no_sync(micro):
                with self.dev.autocast():
                    _, loss = self.model_c(x, y)
                if accum > 1:
                    loss = loss / accum
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.c.optim.grad_clip > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.c.optim.grad_clip, foreach=True)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._lr = lr
        return total

    @torch.no_grad()
    def _evaluate(self) -> dict:
        """Mean loss over eval_iters fixed batches per split (this rank's share; summed across ranks)."""
        self.model.eval()
        out = {}
        try:
            for split in ("train", "val"):
                plan = dist_lib.eval_plan(self.c.train.eval_iters, self.rt)  # [(i, counted)]: i % world == rank
                losses = torch.zeros(len(plan), device=self.dev.device)
                for j, (i, counted) in enumerate(plan):
                    if self.stop.signum is not None and not self.rt.distributed:  # (torchrun: all ranks must
                        raise _EvalInterrupted  # finish the eval's collectives; they stop at the next step)
                    x, y = self.loader.eval_batch(split, i)
                    with self.dev.autocast():
                        _, loss = self.model_c(x, y)
                    if counted:  # FSDP pads with uncounted forwards so every rank runs as many (collectives)
                        losses[j] = loss.float()
                n = sum(1 for _, counted in plan if counted)
                stats = torch.stack([losses.sum(), torch.tensor(float(n), device=losses.device)])
                dist_lib.all_reduce_sum(stats, self.rt)
                s, n = stats.tolist()
                out[split] = s / max(n, 1.0)
        finally:
            self.model.train()
        return out

    def _guarded(self, kind: str, fn):
        """Run fn(); on its first compiled run, fall back to eager if compilation fails."""
        if not self.compiled or self.compile_verified[kind]:
            return fn()
        rng = ckpt_lib.capture_rng_state()
        loader_state = self.loader.state_dict()
        try:
            result = fn()
            self.compile_verified[kind] = True
            return result
        except torch.OutOfMemoryError:
            raise  # not a compile failure: eager needs more memory, not less
        except Exception as e:  # noqa: BLE001 - any compile failure: eager will surface real errors again
            first = (str(e).strip().splitlines() or [""])[0][:200]
            log.warning(f"torch.compile failed ({type(e).__name__}: {first}): continuing without compilation "
                        f"(train.compile=false skips the attempt)")
        # the retry runs here, not in the except block, whose traceback would keep the failed step's
        # activations alive
        self.model_c = self._wrap(self.model)
        self.compiled = False
        self.optimizer.zero_grad(set_to_none=True)
        if self.dev.device.type == "cuda":
            torch.cuda.empty_cache()
        ckpt_lib.restore_rng_state(rng)
        self.loader.load_state_dict(loader_state)
        return fn()

    # -- reading the loss window ------------------------------------------------------------------------
    def _read_window(self) -> list[float]:
        """The losses of the steps since the last reading (one host sync); raises on NaN/inf."""
        if self.win_n == 0:
            return []
        window = self.win[: self.win_n]
        if self.rt.distributed:  # the mean over ranks: one all-reduce per reading, none per step
            window = dist_lib.all_reduce_mean(window.clone(), self.rt)
        vals = window.tolist()
        for i, v in enumerate(vals):
            if not math.isfinite(v):
                self._diverged(self.win_first_step + i + 1, v)
        return vals

    def _diverged(self, step: int, value: float) -> None:
        if self.last_checkpoint is not None:
            kept = f"the last good checkpoint {self.last_checkpoint} (step {self.last_saved_step}) is intact"
        else:
            kept = "no checkpoint had been written yet"
        lr = self._lr_at(step - 1)
        self.status = "diverged"
        raise TrainingDiverged(f"the loss became {value} at step {step} (lr {lr:.3g}): training stopped and {kept}: "
                               f"lower optim.lr (now {self.c.optim.lr:g}) or keep optim.grad_clip > 0, then "
                               f"start again or resume from the last good checkpoint")

    def _log_train(self, step: int) -> None:
        vals = self._read_window()
        now = time.perf_counter()
        dt = now - self.t_mark
        steps = len(vals)
        timed = steps - self.win_restored  # restored losses were trained (and timed) before the resume
        self.win_restored = 0
        self.win_n = 0
        self.win_first_step = step
        self.t_mark = now
        self.train_seconds += dt
        if not self.rt.is_main or steps == 0:
            return
        loss = sum(vals) / steps
        tps = timed * self.tokens_per_step / dt if dt > 0 else 0.0
        mfu = compute_mfu(tps, self.flops_per_token, self.peak_flops)
        rec = {"type": "train", "step": step, "loss": loss, "lr": self._lr, "tokens": self.tokens,
               "elapsed_s": round(self._elapsed(), 3), "tokens_per_s": round(tps, 1)}
        if mfu is not None:
            rec["mfu"] = round(mfu, 4)
        self.metrics.write(rec)
        self.wandb.log({"train/loss": loss, "lr": self._lr, "tokens": rec["tokens"], "tokens_per_s": tps,
                        **({"mfu": mfu} if mfu is not None else {})}, step=step)
        mfu_s = f" | mfu {mfu * 100:.1f}%" if mfu is not None else ""
        if self.bar is not None and not self.bar.disable:
            self.bar.set_postfix_str(f"loss {loss:.4f} | lr {self._lr:.2e} | {tps / 1e3:.1f}k tok/s{mfu_s}",
                                     refresh=False)
        log.info(f"step {step}/{self.c.train.max_iters}: loss {loss:.4f} | lr {self._lr:.2e} | "
                 f"{tps / 1e3:.1f}k tok/s{mfu_s}", extra={"progress": True})

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.t_loop)

    # -- evaluation + checkpoints -----------------------------------------------------------------------
    def _eval_and_save(self, step: int, save: bool = True) -> None:
        self._read_window()  # NaN check before evaluating (and before any save)
        t0 = time.perf_counter()
        try:
            losses = self._guarded("eval", self._evaluate)
        except _EvalInterrupted:
            self.eval_skipped_step = step
            if self.rt.is_main:
                log.info(f"evaluation at step {step} skipped: stopping")
            return
        improved = False
        for split in ("train", "val"):
            if not math.isfinite(losses[split]):
                self._diverged(step, losses[split])
        if save and losses["val"] < self.best_val_loss:
            self.best_val_loss, self.best_step, improved = losses["val"], step, True
        lr = getattr(self, "_lr", None)
        if lr is None:
            lr = self._lr_at(max(0, step - 1))
        if self.rt.is_main:
            self.metrics.write({"type": "eval", "step": step, "train_loss": losses["train"], "val_loss": losses["val"],
                                "lr": lr, "tokens": self.tokens,
                                "elapsed_s": round(self._elapsed(), 3)})
            self.wandb.log({"eval/train_loss": losses["train"], "eval/val_loss": losses["val"]}, step=step)
            log.info(f"step {step}/{self.c.train.max_iters}: train loss {losses['train']:.4f}, val loss "
                     f"{losses['val']:.4f}{' (best)' if improved else ''} | "
                     f"{format_count(self.tokens)} tokens | {format_duration(self._elapsed())}")
        if save:
            self._save(step, best=improved)
        self.t_mark += time.perf_counter() - t0  # evals and saves do not count as training time

    def _save(self, step: int, best: bool = False) -> None:
        """last.pt (+ best.pt); with FSDP also last_dcp/ (+ best_dcp/). Every rank calls it (collectives)."""
        if not dist_lib.weights_finite(self.params, self.rt):
            self._diverged(step, float("nan"))
        rng_ranks = dist_lib.gather_rng_states(self.rt)  # every rank's dropout stream (None: one process)
        state = {
            "format": ckpt_lib.FORMAT, "version": ckpt_lib.VERSION, "step": step,
            "best_val_loss": self.best_val_loss, "best_step": self.best_step,
            "model": None, "model_config": self.gpt_config.to_dict(), "tokenizer": self.tokenizer.to_dict(),
            "optimizer": None, "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "config": self.resolved, "rng": ckpt_lib.capture_rng_state(), "loader": self.loader.state_dict(),
            "wandb_run_id": self.wandb_run_id, "elapsed_s": self._elapsed(), "tokens": self.tokens,
            # exact metrics on resume: the losses logged since the last log line, and an evaluation to redo
            "loss_window": {"first_step": self.win_first_step, "losses": self._read_window()},
            "eval_pending": self.eval_skipped_step == step,
        }
        if rng_ranks is not None:
            state["rng_ranks"] = rng_ranks
        if self.rt.parallel == "fsdp":  # sharded, resumable checkpoint + a weights-only single-file export
            state["sharded"] = True
            dist_lib.save_sharded(self.run_dir / dist_lib.LAST_DCP, self.model, self.optimizer, state, self.rt,
                                  best_path=self.run_dir / dist_lib.BEST_DCP if best else None)
            state["model"] = dist_lib.full_model_state_dict(self.model, self.rt)  # gathered on rank 0's CPU
        elif self.rt.is_main:
            state["model"] = ckpt_lib.clean_state_dict(self.model.state_dict())
            state["optimizer"] = self.optimizer.state_dict()
        self.last_saved_step = step
        self.last_checkpoint = self.run_dir / "last.pt"
        if not self.rt.is_main:
            return
        last = ckpt_lib.save_checkpoint(state, self.run_dir / "last.pt")
        if best:
            ckpt_lib.link_checkpoint(last, self.run_dir / "best.pt")

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        t = self.c.train
        self.status = "completed"
        resumed = self.rng_restore is not None
        if resumed:
            ckpt_lib.restore_rng_state(self.rng_restore)  # last: nothing may draw random numbers after this
        self.t_loop = time.perf_counter()
        self.t_mark = self.t_loop
        if self.start_step >= t.max_iters and not self.eval_pending:
            if self.rt.is_main:
                log.info(f"the checkpoint is at step {self.start_step} >= train.max_iters={t.max_iters}: nothing "
                         f"to train (raise train.max_iters to continue)")
            return self._result()
        from tqdm import tqdm
        show_bar = self.rt.is_main and sys.stderr.isatty()
        self.stop.install()
        try:
            with console_with_bar(show_bar):
                self.bar = tqdm(total=t.max_iters, initial=self.start_step, unit="step", dynamic_ncols=True,
                                disable=not show_bar, file=sys.stderr, smoothing=0.05, leave=True)
                if resumed and self.eval_pending:  # the evaluation the stop cut short, as the straight run did it
                    self._eval_and_save(self.start_step, save=self.start_step > 0)
                if not resumed and t.eval_at_start:
                    self._eval_and_save(0, save=False)
                while self.step < t.max_iters:
                    if self._should_stop():
                        break
                    step = self.step
                    loss = self._guarded("train", lambda: self._train_step(step))
                    self.win[self.win_n] = loss
                    self.win_n += 1
                    self.step = step + 1
                    self.session_tokens += self.tokens_per_step
                    self.tokens += self.tokens_per_step
                    self.bar.update(1)
                    if self.step % t.log_interval == 0 or self.step == t.max_iters:
                        self._log_train(self.step)
                    if self.step % t.eval_interval == 0 or self.step == t.max_iters:
                        self._eval_and_save(self.step)
                self.stop_agreement.finish()  # the stop all-reduce still in flight (every rank has one)
                if self.win_n and self.stop.signum is None:
                    self._log_train(self.step)
                if self.stop.signum is not None:
                    self.status = "interrupted"
                    # no partial log line: the window's losses go into last.pt and the resumed run logs them
                    # where an uninterrupted run would (exact metrics); still checked for NaN on every rank
                    self._read_window()
                    now = time.perf_counter()
                    self.train_seconds += now - self.t_mark
                    self.t_mark = now
                    if self.last_saved_step != self.step:
                        self._save(self.step)
                    if self.rt.is_main:
                        log.info(f"stopped by {self.stop.name} after step {self.step}: saved {self.last_checkpoint}; "
                                 f"resume with: {_resume_command(self.run_dir, self.cli_overrides, self.rt)}")
                elif self.last_saved_step != self.step:
                    self._save(self.step)
        finally:
            self.stop.restore()
            if self.bar is not None:
                self.bar.close()
        return self._result()

    def _result(self) -> TrainResult:
        code = EXIT_CODES.get(self.stop.signum, 128 + int(self.stop.signum)) if self.stop.signum else 0
        return TrainResult(status=self.status if self.stop.signum is None else "interrupted", step=self.step,
                           best_val_loss=self.best_val_loss, run_dir=self.run_dir, exit_code=code,
                           last_checkpoint=self.last_checkpoint)

    def finish(self, status: str) -> None:
        """Summary record, loss.png, wandb.finish: also after errors (best effort)."""
        if not self.rt.is_main:
            return
        wall = time.perf_counter() - self.t_start
        summary = {"type": "summary", "status": status, "step": self.step,
                   "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
                   "best_step": self.best_step, "tokens": self.tokens, "wall_s": round(wall, 3),
                   "train_s": round(self.train_seconds, 3),
                   "mean_tokens_per_s": (round(self.session_tokens / self.train_seconds, 1)
                                         if self.train_seconds else None),
                   "num_params": self.num_params,
                   "device": getattr(getattr(self, "dev", None), "name", None),
                   "dtype": self.dev.dtype_name if hasattr(self, "dev") else None, "compiled": self.compiled}
        try:
            if self.metrics.path is not None:
                self.metrics.write(summary)
                self.metrics.close()
                m = self.c.model
                title = (f"{self.run_dir}  ({m.n_layer}L/{m.n_head}H/{m.n_embd}, ctx {m.block_size}; "
                         f"best val {self.best_val_loss:.4f})")
                plot_loss(read_metrics(self.run_dir / "metrics.jsonl"), self.run_dir / "loss.png", title=title)
        except OSError as e:
            log.warning(f"could not write the run summary or loss.png: {e}")
        finally:
            self.wandb.finish(exit_code=0 if status == "completed" else 1)
        if status == "completed":
            best = (f"best val loss {self.best_val_loss:.4f} at step {self.best_step}"
                    if self.best_step is not None else "no evaluation")
            log.info(f"done: {self.step} steps, {format_count(self.tokens)} tokens in {format_duration(wall)}, {best}; "
                     f"sample with: python sample.py --run {shlex.quote(str(self.run_dir))}")


def _checkpoint_tokens(ckpt: dict, tokens_per_step: int) -> int:
    """The training tokens a checkpoint has seen. Checkpoints from before the `tokens` field: its step times
    the global batch of its own config (its process count is len(rng_ranks)), else times this run's."""
    if ckpt.get("tokens") is not None:
        return int(ckpt["tokens"])
    t = (ckpt.get("config") or {}).get("train") or {}
    if isinstance(t.get("batch_size"), int) and isinstance(t.get("grad_accum_steps"), int):
        world_size = len(ckpt.get("rng_ranks") or [None])
        tokens_per_step = t["batch_size"] * t["grad_accum_steps"] * world_size * ckpt["model_config"]["block_size"]
    return int(ckpt["step"]) * tokens_per_step


def _vocab_len(tok: dict) -> str:
    if tok.get("type") == "char":
        return f"{len(tok.get('chars', ''))} characters"
    return "GPT-2 BPE" if tok.get("type") == "gpt2" else "unknown"


def _data_settings(ckpt: dict) -> str:
    d = (ckpt.get("config") or {}).get("data") or {}
    parts = [f"data={d['name']}"] if d.get("name") else []
    for k in ("path", "tokenizer"):
        if d.get(k) is not None:
            parts.append(f"data.{k}={d[k]}")
    return " ".join(parts) or "see the checkpoint's config"


def train(cfg: Any, run_dir: str | os.PathLike | None = None, *, cli_overrides: Optional[list[str]] = None
          ) -> TrainResult:
    """Train per `cfg` (a composed DictConfig, dict or Config) into `run_dir` (Hydra passes its output dir).

    Returns a TrainResult; its exit_code is 130/143 when a signal stopped the run. User mistakes raise
    ValueError/OSError with one-line messages; a diverged loss raises TrainingDiverged (a ValueError).
    """
    c = to_dataclass(cfg)
    # under torchrun: join the process group (train.py has usually started it already; then this reuses it)
    rt = dist_lib.init(resolve_device(c.train.device, dist_lib.env_info()[2]), c.train.parallel)
    try:
        run_dir = dist_lib.broadcast_object(Path(run_dir) if run_dir is not None else _default_run_dir(), rt)
        return _train(c, rt, run_dir, cli_overrides)
    finally:
        dist_lib.destroy(rt)  # ends the process group if this call started it (also on errors and signals)


def _train(c: Config, rt: Runtime, run_dir: Path, cli_overrides: Optional[list[str]]) -> TrainResult:
    trainer = _Trainer(c, run_dir, rt, cli_overrides)
    status = "failed"
    try:
        trainer.setup()
        result = trainer.run()
        status = result.status
        return result
    except TrainingDiverged:
        status = "diverged"
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if trainer.metrics.path is not None or trainer.wandb.run is not None:
            trainer.finish(status)
