"""Scale-out on PyTorch's own engine (torchrun, DDP, FSDP2): joining a torchrun job's process group and wrapping the
model for it. Imported only under torchrun (runtime/ranks.py decides); the loop's collectives are in runtime/ranks.py.
"""
from __future__ import annotations

import inspect
import os
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from model.device import resolve_device
from training.config import PARALLEL_MODES

if TYPE_CHECKING:
    from runtime.ranks import DistInfo

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
    if spec not in PARALLEL_MODES:
        raise ValueError(f"train.parallel={spec!r} is not valid: use none (DDP under torchrun), ddp or fsdp")
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


def init(info: DistInfo, device_spec: str = "auto", parallel: str = "none") -> DistInfo:
    """Join the torchrun job: NCCL on CUDA, gloo on the CPU, plus the CPU control group (once; ranks.destroy() ends
    it); `info` (a fresh runtime.ranks.DistInfo) gets this process's place in it."""
    ws, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    if ws < 1 or not 0 <= rank < ws:
        raise ValueError(f"RANK={rank} / WORLD_SIZE={ws} are inconsistent: launch with torchrun ({_TORCHRUN})")
    local_rank, local_ws = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", ws)
    mode = resolve_parallel(parallel, ws, launched_by_torchrun())
    info.rank, info.world_size, info.local_rank, info.local_world_size = rank, ws, local_rank, local_ws
    info.parallel = mode
    if mode == "none":
        return info
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
    info.backend = dist.get_backend()
    info.control_group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return info


def describe(info: DistInfo) -> str:  # of a process group (metrics' opening lines)
    what = {"ddp": "DDP", "fsdp": "FSDP2 (fully_shard per block)"}[info.parallel]
    return f"{what} over {info.world_size} process{'es' if info.world_size > 1 else ''} ({info.backend})"


def wrap_model(model: torch.nn.Module, info: DistInfo, device: torch.device,
               dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """DDP(model), or `model` sharded in place by FSDP2 (build the optimizer after: parameters become shards)."""
    if info.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        kw = {"device_ids": [device.index] if device.type == "cuda" else None, "gradient_as_bucket_view": True}
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # newer torch only
            kw["forward_sync_buffers"] = False  # synced once at init: the model has no running statistics
        return DDP(model, **kw)
    if info.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # the mesh on the device the run uses: fully_shard's default mesh is CUDA whenever a GPU exists
        kw = {"mesh": init_device_mesh(device.type, (info.world_size,))}
        if device.type == "cuda" and dtype == torch.bfloat16:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
    return model


