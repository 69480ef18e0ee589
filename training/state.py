"""What a run carries into its next session, as Stateful parts of the checkpoint (checkpoint.manager), and the
one home of random state (every generator seeded, captured and restored as plain containers). Their state_dicts
are format 1's keys, so checkpoints of every version resume exactly.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch

from checkpoint.file import tokens_per_step
from common.rng import seed_for

if TYPE_CHECKING:
    from runtime.ranks import Ranks


@dataclass
class TrainResult:
    status: str  # "completed" | "interrupted" (a signal) | "stopped" (a closed output pipe)
    step: int
    best_val_loss: float
    run_dir: Path
    exit_code: int = 0  # 0, or 130 (SIGINT) / 143 (SIGTERM)
    early_stopped: bool = False  # completed because val loss stopped improving (train.patience)
    clean: bool = False  # ran to its end or to a stop every rank agreed on: under torchrun, ranks leave together


def seed_all(seed: int) -> None:
    """Python's, numpy's and torch's generators from one seed: where every run starts."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng_state() -> dict:
    """Every RNG that can influence training, as plain containers (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def restore_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # a different GPU count restores what lines up (exactness is only promised on the same setup)
        for i, s in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)


@dataclass
class TrainState:
    """The counters of a run; `state_dict` keys are top-level checkpoint keys."""
    tokens_per_step: int = 0  # this run's global batch in tokens (not saved)
    step: int = 0
    tokens: int = 0  # training tokens so far, all sessions: counted, since a resume may change the batch
    best_val_loss: float = math.inf
    best_step: Optional[int] = None
    elapsed_before: float = 0.0  # training time of earlier sessions
    wandb_run_id: Optional[str] = None
    eval_pending: bool = False  # a stop cut the evaluation at `step` short: the resumed run redoes it
    started: float = field(default_factory=time.perf_counter)  # this session's clock (the loop restarts it)

    def elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.started)

    def state_dict(self) -> dict:
        return {"step": self.step, "best_val_loss": self.best_val_loss, "best_step": self.best_step,
                "wandb_run_id": self.wandb_run_id, "elapsed_s": self.elapsed(), "tokens": self.tokens,
                "eval_pending": self.eval_pending}

    def load_state_dict(self, ckpt: dict) -> None:
        self.step = int(ckpt["step"])
        self.best_val_loss = float(ckpt["best_val_loss"]) if ckpt.get("best_val_loss") is not None else math.inf
        self.best_step = ckpt.get("best_step")
        self.elapsed_before = float(ckpt.get("elapsed_s") or 0.0)
        self.wandb_run_id = ckpt.get("wandb_run_id")
        self.eval_pending = bool(ckpt.get("eval_pending"))
        tokens = ckpt.get("tokens")  # (older checkpoints: their step times their own global batch)
        self.tokens = int(tokens) if tokens is not None else self.step * (tokens_per_step(ckpt) or self.tokens_per_step)


class LossWindow:
    """The per-step losses since the last log line, on the device; saved, so a resume logs them as a straight run."""

    def __init__(self, size: int, device: torch.device, ranks: Ranks):
        self.buf = torch.zeros(max(1, size), device=device, dtype=torch.float32)
        self.ranks, self.n, self.first_step = ranks, 0, 0
        self.restored = 0  # losses that came from the checkpoint (trained, and timed, before the resume)
        self._saved: dict = {}

    def add(self, loss: torch.Tensor) -> None:
        self.buf[self.n] = loss
        self.n += 1

    def read(self, on_bad: Optional[Callable[[int, float], None]] = None) -> list[float]:
        """The losses since the last clear(), averaged over ranks; `on_bad(step, value)` for the first NaN/inf."""
        window = self.buf[: self.n]
        vals = self.ranks.all_reduce_mean(window.clone()).tolist() if self.n else []
        bad = next((i for i, v in enumerate(vals) if not math.isfinite(v)), None)
        if bad is not None and on_bad is not None:
            on_bad(self.first_step + bad + 1, vals[bad])
        return vals

    def clear(self, step: int) -> None:
        self.n = self.restored = 0
        self.first_step = step

    def state_dict(self) -> dict:
        return {"first_step": self.first_step, "losses": self.read()}

    def load_state_dict(self, sd: dict) -> None:
        self._saved = sd  # start() takes it once the run's step is known

    def start(self, step: int) -> None:
        """Begin at `step` with the checkpoint's unlogged losses if they end there and fit (same log_interval)."""
        losses, first = [float(v) for v in self._saved.get("losses") or []], int(self._saved.get("first_step", -1))
        self.clear(step)
        if losses and first + len(losses) == step and first % self.buf.numel() == 0 and len(losses) < self.buf.numel():
            self.buf[: len(losses)] = torch.tensor(losses, dtype=self.buf.dtype)
            self.n = self.restored = len(losses)
            self.first_step = first


def rank_rng_state(ckpt: dict, ranks: Ranks, seed: int) -> Optional[dict]:
    """The RNG state this rank restores from `ckpt` (another world size: docs/design.md, "Distributed")."""
    base, every_rank = ckpt.get("rng"), ckpt.get("rng_ranks")
    if every_rank and len(every_rank) == ranks.world_size:
        return every_rank[ranks.rank]
    if base is None or ranks.rank == 0:
        return base
    g = torch.Generator().manual_seed(seed_for(int(seed), "dropout", ranks.rank, int(ckpt.get("step", 0))))
    return {**base, "torch": g.get_state(), "cuda": None}


class RNGState:
    """The generators: "rng" (rank 0's in a file), "rng_ranks" under torchrun; a load waits for restore()."""

    def __init__(self, ranks: Ranks, seed: int):
        self.ranks, self.seed, self.pending = ranks, seed, None

    def state_dict(self) -> dict:  # under torchrun a collective: every rank calls it
        mine = capture_rng_state()
        return {"rng": mine, **({"rng_ranks": self.ranks.all_gather_object(mine)} if self.ranks.distributed else {})}

    def load_state_dict(self, ckpt: dict) -> None:
        self.pending = rank_rng_state(ckpt, self.ranks, self.seed)

    def restore(self) -> None:
        if self.pending is not None:
            restore_rng_state(self.pending)
            self.pending = None
