"""A run's training precision: the autocast dtype, float16's GradScaler and TF32 matmuls on CUDA.
Chosen once per run from `train.dtype` (model/device.py resolves the name, which inference shares);
a combination whose GradScaler cannot run is refused in one line before any work. The CPU keeps full
float32 matmuls: its runs stay bitwise reproducible.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager, Optional

import torch
from torch.torch_version import TorchVersion

from common.cli import setting_error
from model.device import resolve_dtype


@dataclass(frozen=True)
class Precision:
    device: torch.device
    dtype: torch.dtype  # the autocast dtype; float32: no autocast

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def use_grad_scaler(self) -> bool:  # float16's range needs the loss scaled
        return self.dtype == torch.float16

    def autocast(self) -> ContextManager:
        """A fresh autocast context for one forward (a no-op in float32)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        return torch.amp.GradScaler(self.device.type) if self.use_grad_scaler else None


def setup_precision(device: torch.device, dtype_spec: str = "auto",
                    parallel: str = "none") -> Precision:
    """The run's `device` (resolved once, by model.device.resolve_device) set up to train in
    `dtype_spec`."""
    dtype = resolve_dtype(dtype_spec, device)
    if device.type == "mps" and dtype == torch.float16 and TorchVersion(torch.__version__) < (2, 8):
        raise setting_error("{dtype=}float16 on Apple's MPS needs torch 2.8 or newer (its "
                            "GradScaler): upgrade torch, or use {dtype=}bfloat16 (macOS 14+) or "
                            "{dtype=}float32")
    # GradScaler's inf checks would differ per shard
    if parallel == "fsdp" and dtype == torch.float16:
        raise ValueError("train.parallel=fsdp does not support float16 with a GradScaler: use "
                         "train.dtype=bfloat16 (or float32), or train.parallel=ddp")
    if device.type == "cuda":  # TF32 matmuls, and the run's GPU the current one
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.set_device(device)
    return Precision(device, dtype)
