"""What a run carries into its next session, as Stateful parts of the checkpoint
(checkpoint.manager), and the one home of random state (every generator seeded, captured and
restored as plain containers). Their state_dicts are format 1's keys, so checkpoints of every
version resume exactly.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch

from checkpoint.file import batch_tokens
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
        "numpy": {"bit_generator": np_state[0],
                  "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": (torch.cuda.get_rng_state_all()
                 if torch.cuda.is_available() and torch.cuda.is_initialized() else None),
    }


def restore_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # a different GPU count restores what lines up (exactness is only promised on the same
        # setup)
        for i, s in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)


@dataclass
class TrainState:
    """A run's counters. Every field but the last two is a top-level checkpoint key of its own name,
    saved and loaded as it is (a checkpoint from before the field: its default), so a counter a
    resume must keep is one line here."""
    step: int = 0
    # training tokens so far, all sessions: counted, since a resume may change the batch
    tokens: int = 0
    best_val_loss: float = math.inf
    best_step: Optional[int] = None
    wandb_run_id: Optional[str] = None
    # a stop cut the evaluation at `step` short: the resumed run redoes it
    eval_pending: bool = False
    elapsed_s: float = 0.0  # training time of earlier sessions (saved with this session's added)
    # this run's global batch in tokens
    batch_tokens: int = field(default=0, metadata={"saved": False})
    # this session's clock
    started: float = field(default_factory=time.perf_counter, metadata={"saved": False})

    def elapsed(self) -> float:
        return self.elapsed_s + (time.perf_counter() - self.started)

    def _saved(self) -> list[Field]:
        return [f for f in fields(self) if f.metadata.get("saved", True)]

    def state_dict(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in self._saved()},
                "elapsed_s": self.elapsed()}

    def load_state_dict(self, ckpt: dict) -> None:
        for f in self._saved():
            setattr(self, f.name, f.default if ckpt.get(f.name) is None else ckpt[f.name])
        # (older checkpoints: their step times their own global batch)
        if ckpt.get("tokens") is None:
            self.tokens = self.step * (batch_tokens(ckpt) or self.batch_tokens)


class MetricsWindow:
    """Each step's named metrics (device tensors) since the last log line. The log line reads every
    name at once (one host sync, averaged over ranks); saved, so a resumed run logs them as a
    straight run does."""

    def __init__(self, size: int, device: torch.device, ranks: Ranks):
        self.size, self.device, self.ranks = max(1, size), device, ranks
        self.values: dict[str, list[torch.Tensor]] = {}  # name -> one 1-element tensor per step
        # restored: steps that came from the checkpoint (timed before it)
        self.first_step = self.restored = 0
        self._saved: dict = {}

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for name, value in metrics.items():
            self.values.setdefault(name, []).append(value.detach().float().view(1))

    def read(self, on_bad: Optional[Callable[[int, float], None]] = None) -> dict[str, list[float]]:
        """Each name's values since clear(), averaged over ranks; `on_bad(step, value)` for the
        first NaN/inf loss."""
        every = [v for steps in self.values.values() for v in steps]
        flat = iter(self.ranks.all_reduce_mean(torch.cat(every)).tolist() if every else [])
        read = {name: [next(flat) for _ in steps] for name, steps in self.values.items()}
        bad = next((i for i, v in enumerate(read.get("loss", [])) if not math.isfinite(v)), None)
        if bad is not None and on_bad is not None:
            on_bad(self.first_step + bad + 1, read["loss"][bad])
        return read

    def clear(self, step: int) -> None:
        self.values, self.first_step, self.restored = {}, step, 0

    def state_dict(self) -> dict:
        return {"first_step": self.first_step, "values": self.read()}

    def load_state_dict(self, sd: dict) -> None:
        self._saved = sd  # start() takes it once the run's step is known

    def start(self, step: int) -> None:
        """Begin at `step` with the checkpoint's unlogged values if they end there and fit (same
        log_interval)."""
        # (older: the loss alone)
        saved = self._saved.get("values") or {"loss": self._saved.get("losses") or []}
        first, n = int(self._saved.get("first_step", -1)), len(saved.get("loss", []))
        self.clear(step)
        if n and first + n == step and first % self.size == 0 and n < self.size:
            self.values = {k: [torch.tensor([float(v)], device=self.device) for v in vs] for k,
                           vs in saved.items()}
            self.first_step, self.restored = first, n


def rank_rng_state(ckpt: dict, ranks: Ranks, seed: int) -> Optional[dict]:
    """The RNG state this rank restores from `ckpt` (another world size: docs/design.md,
    "Distributed")."""
    base, every_rank = ckpt.get("rng"), ckpt.get("rng_ranks")
    if every_rank and len(every_rank) == ranks.world_size:
        return every_rank[ranks.rank]
    if base is None or ranks.rank == 0:
        return base
    g = torch.Generator().manual_seed(seed_for(int(seed), "dropout", ranks.rank,
                                               int(ckpt.get("step", 0))))
    return {**base, "torch": g.get_state(), "cuda": None}


class RNGState:
    """The generators: "rng" (rank 0's in a file), "rng_ranks" under torchrun; a load waits for
    restore()."""

    def __init__(self, ranks: Ranks, seed: int):
        self.ranks, self.seed, self.pending = ranks, seed, None

    def state_dict(self) -> dict:  # under torchrun a collective: every rank calls it
        mine = capture_rng_state()
        return {"rng": mine,
                **({"rng_ranks": self.ranks.all_gather_object(mine)} if self.ranks.distributed
                   else {})}

    def load_state_dict(self, ckpt: dict) -> None:
        self.pending = rank_rng_state(ckpt, self.ranks, self.seed)

    def restore(self) -> None:
        if self.pending is not None:
            restore_rng_state(self.pending)
            self.pending = None
