"""KVCache: preallocated key/value buffers written at explicit positions (gpt-fast style).

Design: one key and one value tensor of shape (B, n_head, max_len, head_dim) per layer (`k[layer]`,
`v[layer]`), allocated once. Each attention layer writes the keys/values of its new tokens at the positions
it is given (`index_copy_`, no concatenation, no reallocation) and reads back its whole buffer. Slots that
were never written, or hold stale values from an earlier window, are harmless: the model masks every key
whose position is greater than the query's position, so a query at position p sees exactly the keys at
0..p. Fixed shapes and in-place writes are what CUDA graphs need (see `generate_tokens(compile=True)`).
Separate tensors per layer, not one stacked (n_layer, ...) tensor: torch.compile turns an in-place write
into a view of a stacked tensor into copies of the layer plus a write-back of the whole cache every token.
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

    def reset(self) -> None:
        for t in (*self.k, *self.v):
            t.zero_()
