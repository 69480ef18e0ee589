"""Where and in what precision training runs, and how fast the hardware could go.

Design:
- `resolve_device("auto")` picks CUDA > MPS > CPU; an explicit device that is not there is a one-line
  ValueError, never a silent fallback.
- `resolve_dtype("auto", device)`: bfloat16 autocast on CUDA GPUs that support it, float16 autocast
  with a GradScaler on those that do not (V100, T4), float32 on CPU and MPS. Weights and optimizer
  state stay float32 in every case (autocast only lowers the matmuls).
- `configure_backends(device)` turns on TF32 matmuls on CUDA (free speed on Ampere and later); CPU
  numerics are left untouched so CPU runs stay bitwise reproducible.
- `PEAK_FLOPS`: datasheet dense (no sparsity) bf16 tensor-core FLOP/s of common GPUs (fp16 for V100
  and T4, which have no bf16), matched on `torch.cuda.get_device_name()`. MFU is reported only for a
  GPU in this table and only for 16-bit training: an unknown GPU, a CPU or a float32 run shows no MFU
  rather than a wrong one. bench.py reuses this table.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from model.device import DTYPE_BY_NAME, cuda_bf16_native, resolve_device, resolve_dtype  # noqa: F401

# (regex on the device name, readable name, dense bf16 FLOP/s from the datasheet). First match wins,
# so the more specific names come first. Datasheets quote "with sparsity" numbers too: those are 2x.
PEAK_FLOPS: list[tuple[str, str, float]] = [
    (r"\bGH200\b", "NVIDIA GH200", 989e12),
    (r"\bH200\b.*\bNVL\b", "NVIDIA H200 NVL", 835e12),
    (r"\bH200\b", "NVIDIA H200 SXM", 989e12),
    (r"\bH100\b.*\bPCIe\b", "NVIDIA H100 PCIe", 756e12),
    (r"\bH100\b.*\bNVL\b", "NVIDIA H100 NVL", 835e12),
    (r"\bH100\b", "NVIDIA H100 SXM", 989e12),
    (r"\bB200\b", "NVIDIA B200", 2250e12),
    (r"\bA100\b", "NVIDIA A100", 312e12),
    (r"\bA10\b", "NVIDIA A10", 125e12),  # \b: not A10G (a different, lower-clocked part) nor A100
    (r"\bL40S\b", "NVIDIA L40S", 362e12),
    (r"\bL4\b", "NVIDIA L4", 121e12),
    (r"\bRTX A6000\b", "NVIDIA RTX A6000", 154.8e12),
    (r"\bRTX 4090\b(?!\s*D\b)", "NVIDIA GeForce RTX 4090", 165.2e12),  # fp32 accumulate (what PyTorch uses)
    (r"\bRTX 3090\b(?!\s*Ti\b)", "NVIDIA GeForce RTX 3090", 71e12),
    (r"\bV100\b", "NVIDIA V100", 125e12),  # fp16 (no bf16 on Volta)
    (r"\bT4\b", "NVIDIA T4", 65e12),  # fp16 (no bf16 on Turing)
]

def peak_flops(device_name: str) -> Optional[tuple[str, float]]:
    """(readable GPU name, dense 16-bit peak FLOP/s) for a CUDA device name, or None if not in the table."""
    if "MIG" in device_name:  # a slice of the GPU: the whole GPU's peak would understate MFU
        return None
    for pattern, name, flops in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return name, flops
    return None


def configure_backends(device: torch.device) -> None:
    """TF32 matmuls on CUDA; nothing on CPU (keeps CPU runs bitwise reproducible)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True


def autocast_context(device: torch.device, dtype: torch.dtype) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of autocast contexts (a no-op for float32)."""
    if dtype == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        n = torch.get_num_threads()
        return f"CPU, {n} thread{'s' * (n != 1)}"
    return device.type.upper()


@dataclass
class DeviceSetup:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 = none
    autocast: Callable[[], contextlib.AbstractContextManager]
    use_grad_scaler: bool
    name: str  # e.g. "NVIDIA H100 80GB HBM3" or "CPU, 2 threads"
    peak_flops: Optional[float]  # for MFU; None = do not report MFU

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")


def setup_device(device_spec: str = "auto", dtype_spec: str = "auto", local_rank: int = 0) -> DeviceSetup:
    device = resolve_device(device_spec, local_rank)
    dtype = resolve_dtype(dtype_spec, device)
    configure_backends(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    name = device_name(device)
    peak = None
    if device.type == "cuda" and dtype != torch.float32:
        match = peak_flops(name)
        peak = match[1] if match else None
    return DeviceSetup(device=device, dtype=dtype, autocast=autocast_context(device, dtype),
                       use_grad_scaler=(dtype == torch.float16), name=name, peak_flops=peak)


def resolve_compile(setting, device: torch.device) -> bool:
    """`train.compile` (auto/True/False) -> whether to torch.compile. auto = on for CUDA only."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)
