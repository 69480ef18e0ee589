"""KVCache: per-layer key/value buffers allocated once and written in place at explicit positions (gpt-fast).
Static: all max_len slots, fixed shapes for CUDA graphs and torch.compile; dynamic: only the filled prefix.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 *, device=None, dtype: torch.dtype = torch.float32, static: bool = True):
        shape = (batch_size, n_head, max_len, head_dim)  # n_head: the key/value heads (n_kv_head with GQA)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.batch_size, self.max_len, self.static = batch_size, max_len, static

    @classmethod
    def for_model(cls, model, batch_size: int, *, max_len: int | None = None, device=None,
                  dtype: torch.dtype | None = None, static: bool = True) -> "KVCache":
        """A cache sized for `model` (max_len defaults to its block_size, the largest position it knows), storing
        k/v in the dtype attention computes in (dtype defaults to autocast's if on, else the weights')."""
        c, p = model.config, next(model.parameters())
        kind = torch.device(device or p.device).type
        dtype = dtype or (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else p.dtype)
        return cls(c.n_layer, batch_size, c.kv_heads, max_len or c.block_size, c.head_size,
                   device=device or p.device, dtype=dtype, static=static)

    def width(self, input_pos: torch.Tensor) -> int:
        """Key slots queries at input_pos (T,) see: all max_len if static, else the filled prefix (a host read)."""
        return self.max_len if self.static else int(input_pos[-1]) + 1

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, nh, T, hs) at input_pos (T,); return this layer's first `width` slots (B, nh, width, hs)."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all.index_copy_(2, input_pos, k.to(k_all.dtype))  # cast: k may be bf16 under autocast
        v_all.index_copy_(2, input_pos, v.to(v_all.dtype))
        if self.static:
            return k_all, v_all
        n = self.width(input_pos)
        return k_all[:, :, :n], v_all[:, :, :n]
