"""This process's place in a training job (`Ranks`) and the collectives the loop needs, as its methods. A plain
`python train.py` is one process: each collective is then the identity or a no-op, and torch.distributed is never
imported. A torchrun job's `ProcessGroup` (runtime/distributed.py, which this module never imports) overrides them.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Callable

PARALLEL_MODES = ("none", "ddp", "fsdp")  # train.parallel's values
TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env() -> bool:
    """Is one of torchrun's variables set? Then runtime.distributed.join says what this process is."""
    return any(k in os.environ for k in TORCHRUN_ENV)


@dataclass
class Ranks:
    """This process's place in the job; by default rank 0 of 1, where the collectives change nothing."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    parallel: str = "none"  # resolved: none | ddp | fsdp

    @property
    def is_main(self) -> bool:  # rank 0: the process that writes the files and the lines
        return self.rank == 0

    @property
    def distributed(self) -> bool:  # a process group is in use
        return self.parallel != "none"

    def all_reduce_sum(self, t):  # in place, over every rank
        return t

    def all_reduce_mean(self, t):  # in place, over every rank
        return self.all_reduce_sum(t).div_(self.world_size)

    def broadcast_object(self, obj):  # rank 0's (picklable) object, on every rank
        return obj

    def all_gather_object(self, obj) -> list:  # every rank's object, in rank order, on every rank
        return [obj]

    def barrier(self) -> None:  # every rank meets here
        pass

    def max_async(self, value: int) -> Callable[[], int]:
        """Post `value` to a MAX over every rank without waiting; the returned function waits and gives the max."""
        return lambda: value

    def weights_finite(self, params) -> bool:
        """All weights finite, on every rank (FSDP: each rank checks its shards)."""
        import torch
        local = [t for t in (p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in params)
                 if t.numel()]
        return not local or bool(torch.isfinite(torch.nn.utils.get_total_norm(local, foreach=True)).item())

    def wrap_model(self, model, device, dtype=None):
        """The model the steps call: DDP(model) or FSDP2's shards under torchrun, else the model itself."""
        return model

    def grad_sync(self, model, last: bool):
        """Context for one micro-step's forward and backward: gradients are reduced across ranks only when `last`."""
        return contextlib.nullcontext()

    def destroy(self, together: bool = False) -> None:
        """Leave the process group, never raising; `together` (a run that ended well): first wait for every rank."""

    @contextlib.contextmanager
    def main_first(self):
        """Run the body on local rank 0 first, then on the others (e.g. to fill a shared cache)."""
        if self.local_rank != 0:
            self.barrier()
        try:
            yield
        finally:
            if self.local_rank == 0:
                self.barrier()

    def eval_plan(self, n: int) -> list[tuple[int, bool]]:
        """This rank's eval batches as (index, counted); FSDP pads with uncounted ones (each forward, a collective)."""
        mine = [(i, True) for i in range(self.rank, n, self.world_size)]
        if self.parallel == "fsdp":
            mine += [(0, False)] * (math.ceil(n / self.world_size) - len(mine))
        return mine
