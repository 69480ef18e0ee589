"""This process's place in a training job (`DistInfo`) and the few collectives the loop calls: in one process
(plain `python train.py`) each is a no-op or a local check, and torch.distributed is never imported. Joining a
torchrun job, its process groups and DDP/FSDP wrappers: runtime/distributed.py.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch

TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class DistInfo:
    """This process's place in the job. A single process is rank 0 of 1 with parallel="none"."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    parallel: str = "none"  # resolved: none | ddp | fsdp
    backend: Optional[str] = None  # nccl | gloo | None (no process group)
    control_group: Any = None  # CPU gloo group: stop flag, RNG gathering, barriers (never the GPU stream)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:  # a process group is in use
        return self.parallel != "none"


def init(device_spec: str = "auto", parallel: str = "none") -> DistInfo:
    """This process's DistInfo: a torchrun job's (runtime/distributed.py joins its process group), else one process."""
    if any(k in os.environ for k in TORCHRUN_ENV):
        from runtime import distributed
        return distributed.init(DistInfo(), device_spec, parallel)
    if parallel == "fsdp":
        raise ValueError("train.parallel=fsdp needs a torchrun launch: torchrun --standalone "
                         "--nproc_per_node=N train.py train.parallel=fsdp ... (N = number of GPUs)")
    return DistInfo()


def destroy(info: Optional[DistInfo], together: bool = False) -> None:
    """End init()'s process group, never raising; `together` (a run that ended well): first wait for every rank."""
    if info is None or not info.distributed:
        return
    import torch.distributed as dist
    if not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # shutting down after an error must not hide that error
        if together:
            dist.monitored_barrier(group=info.control_group, timeout=timedelta(seconds=60))
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:  # in place; a no-op in one process
    if info.distributed:
        import torch.distributed as dist
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor, info: DistInfo) -> torch.Tensor:  # in place; a no-op in one process
    return all_reduce_sum(t, info).div_(info.world_size) if info.distributed else t


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's (picklable) object on every rank, over the CPU control group."""
    if not info.distributed:
        return obj
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=info.control_group)
    return box[0]


@contextlib.contextmanager
def main_first(info: DistInfo):
    """Run the body on local rank 0 first, then on the others (e.g. to fill a shared cache): a CPU barrier."""
    if not info.distributed:
        yield
        return
    import torch.distributed as dist
    if info.local_rank != 0:
        dist.barrier(group=info.control_group)
    try:
        yield
    finally:
        if info.local_rank == 0:
            dist.barrier(group=info.control_group)


def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device,
               dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The model the steps call: DDP(model) or FSDP2's shards under torchrun (runtime/distributed.py), else itself."""
    if not info.distributed:
        return model
    from runtime import distributed
    return distributed.wrap_model(model, info, device, dtype)


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, info: DistInfo, last: bool):
    """Context for one micro-step's forward+backward: gradients are reduced across ranks only when `last`."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile(DDP(...)) -> DDP
    if info.parallel == "ddp" and not last:
        with inner.no_sync():
            yield
    elif info.parallel == "fsdp" and not last:
        inner.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            inner.set_requires_gradient_sync(True)
    else:
        yield


def weights_finite(params, info: DistInfo) -> bool:
    """All weights finite, on every rank (FSDP: each rank checks its shards; one MIN all-reduce)."""
    local = [t for t in (p.detach().to_local() if hasattr(p, "to_local") else p.detach() for p in params)
             if t.numel()]
    ok = not local or bool(torch.isfinite(torch.nn.utils.get_total_norm(local, foreach=True)).item())
    if info.distributed:
        import torch.distributed as dist
        flag = torch.tensor([int(ok)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=info.control_group)
        ok = bool(flag.item())
    return ok


def eval_plan(n: int, info: DistInfo) -> list[tuple[int, bool]]:
    """This rank's eval batches as (index, counted); FSDP pads with uncounted ones (each forward is a collective)."""
    mine = [(i, True) for i in range(info.rank, n, info.world_size)]
    if info.parallel == "fsdp":
        mine += [(0, False)] * (math.ceil(n / info.world_size) - len(mine))
    return mine

