"""KVCache: per-layer key/value buffers allocated once and written in place at explicit positions (gpt-fast).

Fixed shapes and addresses are what CUDA graphs need; stale slots are harmless because the model masks
every key after the query's position. One tensor per layer: torch.compile copies views of a stacked one.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 *, device=None, dtype: torch.dtype = torch.float32):
        shape = (batch_size, n_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.batch_size, self.max_len = batch_size, max_len

    @classmethod
    def for_model(cls, model, batch_size: int, *, max_len: int | None = None, device=None,
                  dtype: torch.dtype | None = None) -> "KVCache":
        """A cache sized for `model` (max_len defaults to its block_size, the largest position it knows)."""
        c = model.config
        p = next(model.parameters())
        return cls(c.n_layer, batch_size, c.n_head, max_len or c.block_size, c.head_dim,
                   device=device or p.device, dtype=dtype or p.dtype)

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, nh, T, hs) at positions input_pos (T,); return this layer's full (B, nh, max_len, hs) buffers."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all.index_copy_(2, input_pos, k.to(k_all.dtype))  # cast: k may be bf16 under autocast
        v_all.index_copy_(2, input_pos, v.to(v_all.dtype))
        return k_all, v_all
