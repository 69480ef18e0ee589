"""Where a model runs: the device (CUDA > MPS > CPU), the precision the hardware does well, and for training
autocast, TF32 on CUDA and the datasheet peak FLOP/s for MFU (shown only for a GPU and 16-bit training, never a
wrong one; float16 trains with a GradScaler, which runs on Apple's MPS from torch 2.8).

Shared by training and inference (sample.py never imports training/). An explicit device that is not
there is a one-line ValueError, never a silent fallback; "auto" bf16 needs bf16 in hardware. MPS: auto is
float32 (fp16 would need a GradScaler, bf16 saves memory but not time there); bfloat16 needs macOS 14
(torch's own rule; docs/platforms.md).
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.torch_version import TorchVersion

from common.cli import setting_error
from common.platform import compile_unsupported

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """A device name -> torch.device. auto: CUDA (this process's local_rank) > MPS > CPU."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise setting_error("{device=}{0!r} is not valid: use auto, cpu, cuda, cuda:N or mps", device)
    if device == "cpu":
        return torch.device("cpu")
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise setting_error("{device=}mps but Apple's MPS backend is not available: use {device=}auto "
                                "or {device=}cpu")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise setting_error("{device=}{0} but no CUDA GPU is available: use {device=}auto or {device=}cpu", device)
    index = int(device[5:]) if device != "cuda" else local_rank
    if index >= torch.cuda.device_count():
        raise setting_error("{device=}{0} but only {1} CUDA GPU(s) are visible: use cuda:0..cuda:{2}", device,
                            torch.cuda.device_count(), torch.cuda.device_count() - 1)
    return torch.device("cuda", index)


def cuda_bf16_native() -> bool:
    """bf16 in hardware (Ampere and newer). torch's default also says yes to emulated bf16 (V100, T4),
    which runs far slower than fp16 there."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """A dtype name -> the autocast dtype (float32 = no autocast). auto: CUDA's fastest 16-bit, else float32."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_bf16_native() else torch.float16
        return torch.float32
    if dtype not in DTYPE_BY_NAME:
        raise setting_error("{dtype=}{0!r} is not valid: use auto, float32, bfloat16 or float16", dtype)
    chosen = DTYPE_BY_NAME[dtype]
    # emulated is allowed when asked for
    if chosen == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise setting_error("{dtype=}bfloat16 but {0} does not support it: use {dtype=}float16 (or auto)",
                            torch.cuda.get_device_name(device))
    if chosen == torch.bfloat16 and device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise setting_error("{dtype=}bfloat16 on Apple's MPS needs macOS 14 or newer: use {dtype=}float32 "
                            "(or auto), or {dtype=}float16")
    if chosen == torch.float16 and device.type == "cpu":
        raise setting_error("{dtype=}float16 needs a GPU: use {dtype=}float32 (or bfloat16) on CPU")
    return chosen


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
    """The run's `device` (resolved once, by resolve_device) set up for training in `dtype_spec`."""
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
