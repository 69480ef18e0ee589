"""Where a model runs: the device (CUDA > MPS > CPU), the precision the hardware does well, its
name, and whether torch.compile is worth trying there. Training's autocast and GradScaler:
training/precision.py.

Shared by training and inference (sample.py never imports training/). An explicit device that is not
there is a one-line ValueError, never a silent fallback; "auto" bf16 needs bf16 in hardware. MPS:
auto is float32 (fp16 would need a GradScaler, bf16 saves memory but not time there); bfloat16 needs
macOS 14 (torch's own rule; docs/platforms.md).
"""
from __future__ import annotations

import logging

import torch

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
    if device not in ("cpu", "cuda", "mps") and not (device.startswith("cuda:")
                                                     and device[5:].isdigit()):
        raise setting_error("{device=}{0!r} is not valid: use auto, cpu, cuda, cuda:N or mps",
                            device)
    if device == "cpu":
        return torch.device("cpu")
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise setting_error("{device=}mps but Apple's MPS backend is not available: use "
                                "{device=}auto or {device=}cpu")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise setting_error("{device=}{0} but no CUDA GPU is available: use {device=}auto or "
                            "{device=}cpu", device)
    index = int(device[5:]) if device != "cuda" else local_rank
    if index >= torch.cuda.device_count():
        raise setting_error("{device=}{0} but only {1} CUDA GPU(s) are visible: use "
                            "cuda:0..cuda:{2}", device,
                            torch.cuda.device_count(), torch.cuda.device_count() - 1)
    return torch.device("cuda", index)


def cuda_bf16_native() -> bool:
    """bf16 in hardware (Ampere and newer). torch's default also says yes to emulated bf16 (V100,
    T4), which runs far slower than fp16 there."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """A dtype name -> the autocast dtype (float32 = no autocast). auto: CUDA's fastest 16-bit, else
    float32."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_bf16_native() else torch.float16
        return torch.float32
    if dtype not in DTYPE_BY_NAME:
        raise setting_error("{dtype=}{0!r} is not valid: use auto, float32, bfloat16 or float16",
                            dtype)
    chosen = DTYPE_BY_NAME[dtype]
    # emulated is allowed when asked for
    if chosen == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise setting_error("{dtype=}bfloat16 but {0} does not support it: use {dtype=}float16 "
                            "(or auto)",
                            torch.cuda.get_device_name(device))
    old_macos = device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0)
    if chosen == torch.bfloat16 and old_macos:
        raise setting_error("{dtype=}bfloat16 on Apple's MPS needs macOS 14 or newer: use "
                            "{dtype=}float32 (or auto), or {dtype=}float16")
    if chosen == torch.float16 and device.type == "cpu":
        raise setting_error("{dtype=}float16 needs a GPU: use {dtype=}float32 (or bfloat16) on CPU")
    return chosen


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        n = torch.get_num_threads()
        return f"CPU, {n} thread{'s' * (n != 1)}"
    return device.type.upper()


def resolve_compile(setting, device: torch.device) -> bool:
    """`train.compile` (auto/True/False) -> whether to torch.compile. auto = on for CUDA only, and
    only where Triton is installed; off on MPS (both said in one line, with the reason); silently
    off on the CPU."""
    if setting != "auto":
        return bool(setting)
    why = compile_unsupported(device.type)
    if why:
        logging.getLogger(__name__).warning(f"train.compile=auto: compiling off: {why}")
    return device.type == "cuda" and why is None
