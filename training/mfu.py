"""Model FLOPs utilisation: training FLOPs per token (nanoGPT's estimate) against the datasheet's
dense 16-bit peak of the GPU, shown only for a GPU in the table and 16-bit training, never a wrong
one (no MFU on a CPU, MPS, float32 or an unknown GPU).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from model.device import device_name

if TYPE_CHECKING:
    from training.precision import Precision


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int,
                    block_size: int) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT's estimate: 6N for the weights +
    12·L·H·Q·T for attention (N parameters, L layers, H heads, Q head size, T context)."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * block_size


# (regex on the device name, readable name, dense bf16 FLOP/s from the datasheet). First match wins,
# so the more specific names come first. Datasheets quote "with sparsity" numbers too: those are 2x.
# fp32 accumulate (what PyTorch uses)
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
    (r"\bRTX 4090\b(?!\s*D\b)", "NVIDIA GeForce RTX 4090", 165.2e12),
    (r"\bRTX 3090\b(?!\s*Ti\b)", "NVIDIA GeForce RTX 3090", 71e12),
    (r"\bV100\b", "NVIDIA V100", 125e12),  # fp16 (no bf16 on Volta)
    (r"\bT4\b", "NVIDIA T4", 65e12),  # fp16 (no bf16 on Turing)
]


def peak_flops(name: str) -> Optional[tuple[str, float]]:
    """(readable GPU name, dense 16-bit peak FLOP/s) for a CUDA device name, or None if not in the
    table."""
    if "MIG" in name:  # a slice of the GPU: the whole GPU's peak would understate MFU
        return None
    return next(((readable, flops) for pattern, readable, flops in PEAK_FLOPS
                 if re.search(pattern, name)), None)


def mfu_peak(precision: Precision, gpus: int = 1) -> Optional[float]:
    """The peak FLOP/s that MFU divides by: `gpus` of this GPU in 16-bit; None (no MFU) for a CPU,
    MPS, float32 training or a GPU not in the table."""
    if precision.device.type != "cuda" or precision.dtype_name == "float32":
        return None
    match = peak_flops(device_name(precision.device))
    return match[1] * gpus if match else None


def mfu(tokens_per_s: float, flops_per_tok: float, peak: Optional[float]) -> Optional[float]:
    """Achieved / peak FLOP/s as a fraction, or None when the peak is unknown."""
    if not peak or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / peak
