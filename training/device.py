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

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def peak_flops(device_name: str) -> Optional[tuple[str, float]]:
    """(readable GPU name, dense 16-bit peak FLOP/s) for a CUDA device name, or None if not in the table."""
    if "MIG" in device_name:  # a slice of the GPU: the whole GPU's peak would understate MFU
        return None
    for pattern, name, flops in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return name, flops
    return None


def resolve_device(spec: str = "auto", local_rank: int = 0) -> torch.device:
    """`train.device` -> torch.device. auto: CUDA (this process's local_rank) > MPS > CPU."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"train.device={spec} but no CUDA GPU is available: use train.device=auto or "
                             f"train.device=cpu")
        dev = torch.device(spec)
        index = dev.index if dev.index is not None else local_rank
        if index >= torch.cuda.device_count():
            raise ValueError(f"train.device={spec} but only {torch.cuda.device_count()} CUDA GPU(s) are visible: "
                             f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")
        return torch.device("cuda", index)
    if spec == "mps":
        if not _mps_available():
            raise ValueError("train.device=mps but Apple's MPS backend is not available: use train.device=auto "
                             "or train.device=cpu")
        return torch.device("mps")
    if spec == "cpu":
        return torch.device("cpu")
    raise ValueError(f"train.device={spec!r} is not valid: use auto, cpu, cuda, cuda:N or mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def cuda_bf16_native() -> bool:
    """bf16 in hardware (Ampere and newer). torch's default also says yes to emulated bf16 (V100, T4),
    which runs far slower than fp16 there."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`train.dtype` -> the autocast dtype (float32 = no autocast)."""
    if spec == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_bf16_native() else torch.float16
        return torch.float32
    if spec not in DTYPE_BY_NAME:
        raise ValueError(f"train.dtype={spec!r} is not valid: use auto, float32, bfloat16 or float16")
    dtype = DTYPE_BY_NAME[spec]
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():  # emulated is allowed when asked for
        raise ValueError(f"train.dtype=bfloat16 but {torch.cuda.get_device_name(device)} does not support it: "
                         f"use train.dtype=float16 (or auto)")
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError("train.dtype=float16 needs a GPU: use train.dtype=float32 (or bfloat16) on CPU")
    return dtype


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
