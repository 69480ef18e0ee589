"""Scale-out on PyTorch's own engine (torchrun, DDP, FSDP2): `join` checks torchrun's environment and
train.parallel in one place and joins the job's process group; `ProcessGroup` is runtime.ranks.Ranks with its
collectives over torch.distributed. The only module with process-group code; a one-process run never imports it.
"""
from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from model.device import resolve_device
from runtime.ranks import PARALLEL_MODES, Ranks

CONTROL_TIMEOUT = timedelta(minutes=60)  # rank 0 may prepare a large dataset while the others wait
_TORCHRUN = "torchrun --standalone --nproc_per_node=N train.py ..."


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a whole number: launch with torchrun, "
                         f"which sets it ({_TORCHRUN})") from None


def launched_by_torchrun() -> bool:
    """True under torchrun (or any launcher that sets the env:// variables), even with one process."""
    return all(k in os.environ for k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def resolve_parallel(spec: str, world_size: int, launched: bool) -> str:
    """`train.parallel` -> the mode this process runs: none | ddp | fsdp."""
    assert spec in PARALLEL_MODES, spec  # (training.config.check told the user)
    if world_size > 1 and not launched:
        raise ValueError(f"WORLD_SIZE={world_size} is set but MASTER_ADDR/MASTER_PORT are not: launch with "
                         f"torchrun (torchrun --standalone --nproc_per_node={world_size} train.py ...)")
    if spec == "fsdp":
        if not launched:
            raise ValueError("train.parallel=fsdp needs a torchrun launch: torchrun --standalone "
                             "--nproc_per_node=N train.py train.parallel=fsdp ... (N = number of GPUs)")
        return "fsdp"
    if spec == "ddp":
        return "ddp" if launched else "none"
    return "ddp" if world_size > 1 else "none"


def join(device_spec: str = "auto", parallel: str = "none") -> Ranks:
    """This process's Ranks from torchrun's environment: a ProcessGroup (NCCL on CUDA, gloo on the CPU, plus the
    CPU control group; its destroy() ends them), or one process's Ranks where the mode resolves to none."""
    ws, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    if ws < 1 or not 0 <= rank < ws:
        raise ValueError(f"RANK={rank} / WORLD_SIZE={ws} are inconsistent: launch with torchrun ({_TORCHRUN})")
    local_rank, local_ws = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", ws)
    mode = resolve_parallel(parallel, ws, launched_by_torchrun())
    place = Ranks(rank, ws, local_rank, local_ws)
    if mode == "none":
        return place
    device = resolve_device(device_spec, local_rank)
    if device.type == "mps":
        raise ValueError("multi-process training does not support Apple's MPS device: use train.device=cpu "
                         "(gloo) or CUDA GPUs (NCCL)")
    if device.type == "cuda" and device.index != local_rank % max(1, torch.cuda.device_count()):
        raise ValueError(f"train.device={device} but this process is LOCAL_RANK={local_rank}: use "
                         f"train.device=cuda (or auto) so each process takes cuda:LOCAL_RANK")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                            **({"device_id": device} if device.type == "cuda" else {}))
    return ProcessGroup(rank, ws, local_rank, local_ws, mode, backend=dist.get_backend(),
                        control=dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT))


@dataclass
class ProcessGroup(Ranks):
    """A process of a torchrun job. The stop flag, RNG states, objects and barriers go over the CPU gloo `control`
    group (None: the default group), never the GPU stream."""
    backend: str = "gloo"  # nccl | gloo
    control: Any = None

    def describe(self) -> str:  # (metrics' opening lines)
        what = {"ddp": "DDP", "fsdp": "FSDP2 (fully_shard per block)"}[self.parallel]
        return f"{what} over {self.world_size} process{'es' if self.world_size > 1 else ''} ({self.backend})"

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def broadcast_object(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def all_gather_object(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.control)

    def max_async(self, value: int):
        buf = torch.tensor([value], dtype=torch.int64)
        work = dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.control, async_op=True)

        def result() -> int:
            work.wait()
            return int(buf.item())
        return result

    def weights_finite(self, params) -> bool:  # each rank's check, then one MIN all-reduce
        flag = torch.tensor([int(super().weights_finite(params))], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.control)
        return bool(flag.item())

    def wrap_model(self, model: torch.nn.Module, device: torch.device,
                   dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        """DDP(model), or `model` sharded in place by FSDP2 (build the optimizer after: parameters become shards)."""
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            kw = {"device_ids": [device.index] if device.type == "cuda" else None, "gradient_as_bucket_view": True}
            if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # newer torch only
                kw["forward_sync_buffers"] = False  # synced once at init: the model has no running statistics
            return DDP(model, **kw)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # the mesh on the device the run uses: fully_shard's default mesh is CUDA whenever a GPU exists
        kw = {"mesh": init_device_mesh(device.type, (self.world_size,))}
        if device.type == "cuda" and dtype == torch.bfloat16:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        return model

    @contextlib.contextmanager
    def grad_sync(self, model: torch.nn.Module, last: bool):
        """`model`: what wrap_model returned. DDP's no_sync, or FSDP2's gradient sync off, until the `last`."""
        if last:
            yield
        elif self.parallel == "ddp":
            with model.no_sync():
                yield
        else:
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

    def destroy(self, together: bool = False) -> None:
        if not dist.is_initialized():
            return
        with contextlib.suppress(Exception):  # shutting down after an error must not hide that error
            if together:
                dist.monitored_barrier(group=self.control, timeout=timedelta(seconds=60))
            dist.destroy_process_group()
