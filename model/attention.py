"""Causal multi-head self-attention, two interchangeable paths over the same weights: "sdpa" (fused
kernels) and "manual" (the textbook softmax, which can return the attention weights for maps and
tests). The modern settings enter here beside the math they change: qk_norm, then the position
scheme's work on q and k (model/positions.py: rope's rotation) before the scores and its bias on
them (ALiBi's), and grouped-query attention's shared key/value heads repeated for the queries that
read them.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import GPTConfig
from model.positions import SCHEMES


class RMSNorm(nn.RMSNorm):
    """x / rms(x) * w, with w cast to x's dtype: under bf16 autocast x is bf16 and w fp32, and
    torch's fused kernel wants both alike (else it warns "Mismatch dtype between input and weight"
    and takes a slower path)."""

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim, self.n_embd = config.head_size, config.n_embd
        self.dropout = config.dropout
        self.attention = config.attention
        # the position scheme's entry: what it does to q and k (model/positions.py)
        self.position = SCHEMES[config.position]
        # which of a KVCache's per-layer buffers are this layer's
        self.layer_idx = layer_idx
        # the fused q, k, v rows
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(q_dim, config.n_embd, bias=config.bias)
        # qk_norm (Qwen3): a learned RMSNorm over head_dim, shared by the heads, on q and on k
        self.q_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=config.norm_eps) if config.qk_norm else None
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hook point (no weights): the manual path's raw scores q·k/sqrt(hs), before the mask (and
        # a scheme's bias), pass through it, so a forward hook on it hands them back (explore.py's
        # scores panel); a no-op otherwise
        self.scores = nn.Identity()

    def forward(self, x, *, at=None, cache=None, input_pos=None, need_weights=False):
        """x (B, T, C) -> (y (B, T, C), weights (B, nh, T, Tk) if need_weights else None). at: what
        the positions give attention (model.positions.Attend: the scheme's state for q and k, the
        mask), or None: no position, plainly causal. With `cache`, k/v are written at `input_pos`
        and attention runs over the cache under at.mask."""
        B, T, C = x.size()
        hs = self.head_dim
        q_dim, kv_dim = self.n_head * hs, self.n_kv_head * hs
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, n_kv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        # qk_norm: each head's q and k to unit RMS (times a gain), before the position scheme
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # the position scheme's work on q and k (rope: rotated by their positions, so q.k depends on
        # the distance only); keys are cached as it leaves them
        mask = None
        if at is not None:
            q, k = self.position.qk(q, k, at.qk)
            mask = at.mask
        if cache is not None:
            assert mask is not None and input_pos is not None, "a cached forward: input_pos, mask"
            # (B, n_kv, max_len, hs)
            k, v = cache.update(self.layer_idx, input_pos, k, v)
        # a scheme's bias (a float mask) in the scores' dtype (bf16 under autocast)
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)
        # GQA: query head h reads key/value head h // (n_head / n_kv_head)
        grouped = self.n_kv_head != self.n_head

        weights = None
        if need_weights or self.attention == "manual":
            # each key/value head repeated for the n_head / n_kv_head query heads it serves
            if grouped:
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, Tk, hs)
                v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            y, weights = self.manual_attention(q, k, v, mask)
        else:
            # enable_gqa: the same head mapping inside the kernel, without materialising the
            # repeats; is_causal without a mask, else the explicit mask (cached queries, a bias)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                is_causal=mask is None, enable_gqa=grouped)  # (B, nh, T, hs)
        # re-assemble heads side by side: (B, T, nh * hs)
        y = y.transpose(1, 2).contiguous().view(B, T, q_dim)
        y = self.resid_dropout(self.c_proj(y))
        return y, (weights if need_weights else None)

    def manual_attention(self, q, k, v, mask=None):
        """Textbook attention on (B, nh, Tq, hs) queries and (B, nh, Tk, hs) keys/values -> (y,
        weights). mask: None (plainly causal), bool (True = may attend) or float (added)."""
        Tq, Tk = q.size(-2), k.size(-2)
        # plain causal self-attention: lower-triangular, key j visible iff j <= i
        if mask is None:
            mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
        # (B, nh, Tq, Tk)
        att = self.scores((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))))
        # hidden keys (the future, stale cache slots) get zero weight after the softmax; a float
        # mask is a scheme's bias, -inf where hidden
        if mask.dtype == torch.bool:
            att = att.masked_fill(~mask, float("-inf"))
        else:
            att = att + mask
        att = F.softmax(att, dim=-1)
        y = self.attn_dropout(att) @ v  # (B, nh, Tq, Tk) @ (B, nh, Tk, hs) -> (B, nh, Tq, hs)
        return y, att
