"""Model FLOPs utilization: the FLOPs a training step needs per token, and what fraction of the peak a run uses."""
from __future__ import annotations

from typing import Optional


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, block_size: int) -> float:
    """Training FLOPs per token (forward + backward), nanoGPT's estimate: 6N for the weights + 12·L·H·Q·T for
    attention (N parameters, L layers, H heads, Q head size, T context)."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * block_size


def mfu(tokens_per_s: float, flops_per_tok: float, peak: Optional[float]) -> Optional[float]:
    """Achieved / peak FLOP/s as a fraction, or None when the peak is unknown."""
    if not peak or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / peak
