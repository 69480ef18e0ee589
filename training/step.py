"""The step in two (forward_backward, then optimizer_step: a rule between them is the loop's alone)
and the evaluation, plain functions the loop and bench.py call. No host sync: the step's metrics are
device tensors, evaluation reads once.
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, ContextManager, Iterable, Optional

import torch

from training.state import capture_rng_state, restore_rng_state
from common.cli import failure_reason

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]


class TrainingDiverged(ValueError):
    """The loss became NaN/inf; the message (`at`) names the step and the last good checkpoint."""
    status = "diverged"  # (a sweep's table)

    @classmethod
    def at(cls, step: int, value: float, lr: float, optim_lr: float, last: Any,
           last_step: Optional[int]):
        kept, then = ((f"the last good checkpoint {last} (step {last_step}) is intact",
                       "then start again or resume from that checkpoint") if last is not None else
                      ("no checkpoint had been written yet", "then start again"))
        return cls(f"the loss became {value} at step {step} (lr {lr:.3g}): training stopped and "
                   f"{kept}: lower optim.lr (now {optim_lr:g}) or keep optim.grad_clip > 0, {then}")


class EvalInterrupted(BaseException):
    """`eval_stats`'s `stop()` said so (not an Exception: a compile-failure guard must not catch
    it)."""


def forward_backward(model: torch.nn.Module, next_batch: Callable[[], Batch], train: Any,
                     autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                     scaler: Optional[torch.amp.GradScaler] = None,
                     grad_sync: Optional[Callable[[bool], ContextManager]] = None,
                     ) -> dict[str, torch.Tensor]:
    """The gradients of `train.grad_accum_steps` micro-batches (`train`: the TrainConfig;
    `grad_sync`: Ranks.grad_sync); the step's metrics as device tensors: its loss."""
    total, accum = None, train.grad_accum_steps
    for micro in range(accum):
        x, y = next_batch()
        with grad_sync(micro == accum - 1) if grad_sync is not None else contextlib.nullcontext():
            with autocast():
                _, loss = model(x, y)
            if accum > 1:
                loss = loss / accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return {"loss": total}


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, optim: Any,
                   scaler: Optional[torch.amp.GradScaler] = None) -> torch.Tensor:
    """Unscale, clip to `optim.grad_clip` (0: none; `optim`: the OptimConfig), step, zero the
    gradients; the norm before clipping (a device tensor)."""
    grad_clip = optim.grad_clip
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0
                                          else math.inf, foreach=True)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # (FSDP2's: a sharded DTensor)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@torch.no_grad()
def eval_stats(model: torch.nn.Module, batch: Callable[[int], Batch],
               plan: Iterable[tuple[int, bool]], *,
               autocast: Callable[[], ContextManager] = contextlib.nullcontext,
               reduce_sum: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
               stop: Optional[Callable[[], bool]] = None,
               token_bytes: Optional[torch.Tensor] = None,
               progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """{"loss", "bpb" (given each id's UTF-8 length `token_bytes`)} over the counted `batch(i)` of
    `plan`; `progress(done, total)` after each batch (runtime.console.Progress: a long evaluation
    shows how far it is)."""
    model.eval()
    try:
        plan = list(plan)
        # loss, nats, bytes per batch
        sums = torch.zeros(len(plan), 3, device=next(model.parameters()).device)
        for j, (i, counted) in enumerate(plan):
            if stop is not None and stop():
                raise EvalInterrupted
            x, y = batch(i)
            with autocast():
                _, loss = model(x, y)
            if counted:
                sums[j, 0] = loss.float()
                if token_bytes is not None:
                    real = y >= 0  # (the loss ignores -1 targets)
                    sums[j, 1] = loss.float() * real.sum()
                    sums[j, 2] = (token_bytes[y.clamp(min=0)] * real).sum()
            if progress is not None:
                progress(j + 1, len(plan))
        n = torch.tensor(float(sum(c for _, c in plan)), device=sums.device)
        stats = torch.cat([sums.sum(0), n[None]])
        s, nats, n_bytes, n = (reduce_sum(stats) if reduce_sum is not None else stats).tolist()
        bpb = nats / math.log(2) / n_bytes if token_bytes is not None and n_bytes > 0 else None
        return {"loss": s / max(n, 1.0), "bpb": bpb}
    finally:
        model.train()


def compile_regions(model: torch.nn.Module) -> None:
    """torch.compile each block and the output (final norm, head, loss) as regions of their own. The
    blocks share their code and shapes, so one compiled graph serves every layer: compiling costs
    about one block's, not the whole model's, and inductor's caches (under the tinygpt cache) make
    the next run's nearly free. The steps keep calling the model itself, so DDP and FSDP2 wrap it as
    before and its state_dict names do not change."""
    for block in model.transformer.h:
        block.compile()
    model.output = torch.compile(model.output)


class CompileGuard:
    """`run(kind, fn)`: the first call of each kind (where torch.compile compiles) is redone eagerly
    if it fails."""

    def __init__(self, enabled: bool, to_eager: Callable[[], None], rewound: Iterable = ()):
        self.enabled, self.to_eager = enabled, to_eager
        self.rewound, self.verified = list(rewound), set()
        self.failed = False

    def run(self, kind: str, fn: Callable[[], Any]) -> Any:
        # the compiled regions run as plain Python (torch's own switch, for these calls only)
        if self.failed:
            with torch.compiler.set_stance("force_eager"):
                return fn()
        if not self.enabled or kind in self.verified:
            return fn()
        rng, states = capture_rng_state(), [part.state_dict() for part in self.rewound]
        try:
            result = fn()
            self.verified.add(kind)
            return result
        except torch.OutOfMemoryError:
            raise
        # any compile failure: eager will surface real errors again
        except Exception as e:  # noqa: BLE001
            log.warning(f"torch.compile failed ({failure_reason(e)}): continuing without "
                        "compilation (train.compile=false skips the attempt)")
        # the retry runs here, not in the except block, whose
        # traceback would keep the failed step's activations
        self.enabled, self.failed = False, True
        self.to_eager()
        restore_rng_state(rng)
        for part, state in zip(self.rewound, states):
            part.load_state_dict(state)
        return self.run(kind, fn)
