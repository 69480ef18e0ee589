"""Where a model runs: the device (CUDA > MPS > CPU) and the precision the hardware does well.

Shared by training and inference (sample.py never imports training/). An explicit device that is not
there is a one-line ValueError, never a silent fallback; "auto" bf16 needs bf16 in hardware.
"""
from __future__ import annotations

import torch

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str = "auto", local_rank: int = 0, *, setting: str = "train.device") -> torch.device:
    """`train.device` -> torch.device. auto: CUDA (this process's local_rank) > MPS > CPU. `setting` names
    the option in messages (sample.py passes "--device")."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{setting}={spec} but no CUDA GPU is available: use {setting}=auto or {setting}=cpu")
        try:
            dev = torch.device(spec)
        except RuntimeError:
            raise ValueError(f"{setting}={spec!r} is not valid: use auto, cpu, cuda, cuda:N or mps") from None
        index = dev.index if dev.index is not None else local_rank
        if index >= torch.cuda.device_count():
            raise ValueError(f"{setting}={spec} but only {torch.cuda.device_count()} CUDA GPU(s) are visible: "
                             f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")
        return torch.device("cuda", index)
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{setting}=mps but Apple's MPS backend is not available: use {setting}=auto "
                             f"or {setting}=cpu")
        return torch.device("mps")
    if spec == "cpu":
        return torch.device("cpu")
    raise ValueError(f"{setting}={spec!r} is not valid: use auto, cpu, cuda, cuda:N or mps")


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
    # emulated is allowed when asked for
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"train.dtype=bfloat16 but {torch.cuda.get_device_name(device)} does not support it: "
                         f"use train.dtype=float16 (or auto)")
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError("train.dtype=float16 needs a GPU: use train.dtype=float32 (or bfloat16) on CPU")
    return dtype
