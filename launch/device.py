"""Where and in what precision training runs, and how fast the hardware could go.

Device and dtype choice live in model.device (inference needs them too); this adds autocast, TF32 on CUDA
and the datasheet peak FLOP/s for MFU (shown only for a GPU in the table and 16-bit training, never a wrong one).
float16 trains with a GradScaler, which runs on Apple's MPS from torch 2.8 (docs/platforms.md).
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.torch_version import TorchVersion

from common.platform import compile_unsupported
from common.text import setting_error
from model.device import resolve_dtype

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
    autocast: Callable[[], contextlib.AbstractContextManager]  # a factory of autocast contexts (no-op: float32)
    use_grad_scaler: bool
    name: str  # e.g. "NVIDIA H100 80GB HBM3" or "CPU, 2 threads"
    peak_flops: Optional[float]  # for MFU; None = do not report MFU

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")


def setup_device(device: torch.device, dtype_spec: str = "auto") -> DeviceSetup:
    """The run's `device` (resolved once, by model.device.resolve_device) set up for training in `dtype_spec`."""
    dtype = resolve_dtype(dtype_spec, device)
    if device.type == "mps" and dtype == torch.float16 and TorchVersion(torch.__version__) < (2, 8):
        raise setting_error("{dtype=}float16 on Apple's MPS needs torch 2.8 or newer (its GradScaler): upgrade "
                            "torch, or use {dtype=}bfloat16 (macOS 14+) or {dtype=}float32")
    if device.type == "cuda":  # TF32 matmuls; nothing on the CPU (its runs stay bitwise reproducible)
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.set_device(device)
    name = device_name(device)
    match = peak_flops(name) if device.type == "cuda" and dtype != torch.float32 else None
    autocast = contextlib.nullcontext if dtype == torch.float32 else \
        (lambda: torch.autocast(device_type=device.type, dtype=dtype))
    return DeviceSetup(device=device, dtype=dtype, autocast=autocast, use_grad_scaler=(dtype == torch.float16),
                       name=name, peak_flops=match[1] if match else None)


def resolve_compile(setting, device: torch.device) -> bool:
    """`train.compile` (auto/True/False) -> whether to torch.compile. auto = on for CUDA only, and only where
    Triton is installed; off on MPS (both said in one line, with the reason); silently off on the CPU."""
    if setting != "auto":
        return bool(setting)
    why = compile_unsupported(device.type)
    if why:
        logging.getLogger(__name__).warning(f"train.compile=auto: compiling off: {why}")
    return device.type == "cuda" and why is None
