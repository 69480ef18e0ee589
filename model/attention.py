"""Causal multi-head self-attention, two interchangeable paths over the same weights: "sdpa" (fused kernels)
and "manual" (the textbook softmax, which can return the attention weights for maps and tests).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.attention = config.attention
        self.layer_idx = layer_idx  # which of a KVCache's per-layer buffers are this layer's
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # fused q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hook point (no weights): the manual path's raw scores q·k/sqrt(hs), before the mask, pass through it, so a
        # forward hook on it hands them back (explore.py's scores panel); a no-op otherwise
        self.scores = nn.Identity()

    def forward(self, x, *, cache=None, input_pos=None, mask=None, need_weights=False):
        """x (B, T, C) -> (y (B, T, C), weights (B, nh, T, Tk) if need_weights else None). With `cache`, k/v are
        written at `input_pos` and attention runs over the cache under `mask` (Tq, Tk), True = may attend."""
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # each (B, nh, T, hs)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        if cache is not None:
            assert mask is not None and input_pos is not None, "a cached forward needs input_pos and mask"
            k, v = cache.update(self.layer_idx, input_pos, k, v)  # (B, nh, max_len, hs)

        weights = None
        if need_weights or self.attention == "manual":
            y, weights = self.manual_attention(q, k, v, mask)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                is_causal=mask is None)  # (B, nh, T, hs); cached queries do not start at 0: explicit mask
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side: (B, T, C)
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
