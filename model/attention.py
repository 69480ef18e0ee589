"""Causal multi-head self-attention, two interchangeable paths over the same weights: "sdpa" (fused kernels)
and "manual" (the textbook softmax, which can return the attention weights for maps and tests). The modern
settings enter here beside the math they change: qk_norm and the rotation on q and k before the scores, and
grouped-query attention's shared key/value heads repeated for the queries that read them.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import GPTConfig


class RMSNorm(nn.RMSNorm):
    """x / rms(x) * w, with w cast to x's dtype: under bf16 autocast x is bf16 and w fp32, and torch's fused kernel
    wants both alike (else it warns "Mismatch dtype between input and weight" and takes a slower path)."""

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


def rope_cos_sin(input_pos: torch.Tensor, head_dim: int, theta: float):
    """cos, sin (T, head_dim) in fp32 for positions input_pos (T,): angle pos * theta^(-2i/head_dim), each
    frequency twice (cat(freqs, freqs): the rotate_half layout of Hugging Face's Llama/Qwen3)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=input_pos.device).float() / head_dim))
    freqs = input_pos.float()[:, None] * inv_freq[None, :]  # (T, head_dim / 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim: pairs (i, i + head_dim/2) rotate together."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair of x (B, nh, T, hs) by its position's angle, in fp32: x cos + rotate_half(x) sin."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_size
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.attention = config.attention
        self.layer_idx = layer_idx  # which of a KVCache's per-layer buffers are this layer's
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.bias)  # fused q, k, v rows
        self.c_proj = nn.Linear(q_dim, config.n_embd, bias=config.bias)
        # qk_norm (Qwen3): a learned RMSNorm over head_dim, shared by the heads, on q and on k
        self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hook point (no weights): the manual path's raw scores q·k/sqrt(hs), before the mask, pass through it, so a
        # forward hook on it hands them back (explore.py's scores panel); a no-op otherwise
        self.scores = nn.Identity()

    def forward(self, x, *, rope=None, cache=None, input_pos=None, mask=None, need_weights=False):
        """x (B, T, C) -> (y (B, T, C), weights (B, nh, T, Tk) if need_weights else None). rope: (cos, sin) of the
        positions of x, or None. With `cache`, k/v are written at `input_pos` and attention runs over the cache
        under `mask` (Tq, Tk), True = may attend."""
        B, T, C = x.size()
        hs, q_dim, kv_dim = self.head_dim, self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if self.q_norm is not None:  # qk_norm: each head's q and k to unit RMS (times a gain), then rotated
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # RoPE: q and k rotated by their positions, so q.k depends on the distance only
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            assert mask is not None and input_pos is not None, "a cached forward needs input_pos and mask"
            k, v = cache.update(self.layer_idx, input_pos, k, v)  # (B, n_kv, max_len, hs): rotated keys cached
        grouped = self.n_kv_head != self.n_head  # GQA: query head h reads key/value head h // (n_head / n_kv_head)

        weights = None
        if need_weights or self.attention == "manual":
            if grouped:  # each key/value head repeated for the n_head / n_kv_head query heads it serves
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, Tk, hs)
                v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            y, weights = self.manual_attention(q, k, v, mask)
        else:  # enable_gqa: the same head mapping inside the kernel, without materialising the repeats
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                is_causal=mask is None, enable_gqa=grouped)  # (B, nh, T, hs); cached queries: explicit mask
        y = y.transpose(1, 2).contiguous().view(B, T, q_dim)  # re-assemble heads side by side: (B, T, nh * hs)
        y = self.resid_dropout(self.c_proj(y))
        return y, (weights if need_weights else None)

    def manual_attention(self, q, k, v, mask=None):
        """Textbook attention on (B, nh, Tq, hs) queries and (B, nh, Tk, hs) keys/values -> (y, weights)."""
        Tq, Tk = q.size(-2), k.size(-2)
        if mask is None:  # plain causal self-attention: lower-triangular, key j visible iff j <= i
            mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
        att = self.scores((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))))  # (B, nh, Tq, Tk)
        att = att.masked_fill(~mask, float("-inf"))  # future positions get zero weight after softmax
        att = F.softmax(att, dim=-1)
        y = self.attn_dropout(att) @ v  # (B, nh, Tq, Tk) @ (B, nh, Tk, hs) -> (B, nh, Tq, hs)
        return y, att
