"""GPT: a GPT-2-style decoder-only transformer (nanoGPT's layout, GPT-2's module names so HF weights map 1:1): causal
self-attention with two interchangeable paths over the same weights, "sdpa" (fused kernels) and "manual" (the
textbook softmax, which can return its weights for maps and tests), the MLP, the block, the model, and the one
way weights get into it (checkpoint, Hugging Face, fine-tune). Sampling lives in model/generate.py.
"""
from __future__ import annotations

import math
import re

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
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, Tq, Tk)
        att = att.masked_fill(~mask, float("-inf"))  # future positions get zero weight after softmax
        att = F.softmax(att, dim=-1)
        y = self.attn_dropout(att) @ v  # (B, nh, Tq, Tk) @ (B, nh, Tk, hs) -> (B, nh, Tq, hs)
        return y, att


class MLP(nn.Module):
    """Position-wise feed-forward: C -> 4C -> GELU(tanh) -> C -> dropout."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new": exact parity with HF weights
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: attention then MLP, each on a LayerNorm'd input, each added back."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, **attn_kwargs):
        """x (B, T, C) -> (x (B, T, C), attention weights or None)."""
        a, weights = self.attn(self.ln_1(x), **attn_kwargs)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, weights


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"GPT needs a GPTConfig, got {type(config).__name__}: use GPT(GPTConfig(...))")
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight  # one matrix: embeds tokens and scores them

        self.apply(self._init_weights)  # GPT-2's: weights ~ N(0, 0.02), biases 0
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # 2 residual adds per block: keep the stream's variance ~constant
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, a tied matrix once; non_embedding (nanoGPT's convention) drops wpe, and wte when untied."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    def _check_length(self, T: int) -> None:
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}: "
                             f"crop the input to its last {self.config.block_size} tokens or use a larger block_size")

    def forward(self, idx, targets=None, *, cache=None, input_pos=None, last_only=False):
        """idx (B, T) -> (logits (B, T, V), loss or None); targets (B, T): next ids, -1 = ignored. last_only: only the
        last position's logits (B, 1, V). With a KVCache, k/v are written at `input_pos` (T,), default 0..T-1."""
        B, T = idx.size()
        self._check_length(T)
        if input_pos is None:
            input_pos = torch.arange(T, device=idx.device)  # (T,)
        mask = None  # no cache: attention is plainly causal over x
        if cache is not None:  # (T, width): key <= query, over the slots the cache hands attention
            mask = torch.arange(cache.width(input_pos), device=idx.device) <= input_pos[:, None]

        x = self.transformer.wte(idx) + self.transformer.wpe(input_pos)  # (B, T, C) + (T, C)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x, _ = block(x, cache=cache, input_pos=input_pos, mask=mask)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x[:, -1:] if last_only else x)  # (B, 1 or T, V)

        loss = None
        if targets is not None:
            assert not last_only, "a loss needs every position's logits"
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx) -> torch.Tensor:
        """Softmax attention weights (n_layer, B, n_head, T, T), computed by the manual path with dropout off."""
        B, T = idx.size()
        self._check_length(T)
        was_training = self.training
        self.eval()  # dropout off, whatever mode the caller left the model in
        try:
            pos = torch.arange(T, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
            maps = []
            for block in self.transformer.h:
                x, weights = block(x, need_weights=True)  # weights: (B, nh, T, T)
                maps.append(weights)
            return torch.stack(maps)  # (n_layer, B, nh, T, T)
        finally:
            self.train(was_training)


def clean_state_dict(sd: dict) -> dict:
    """Strip the `_orig_mod.` / `module.` prefixes wrappers add to parameter names."""
    return {re.sub(r"^((_orig_mod|module)\.)+", "", k): v for k, v in sd.items()}


def check_weights(model: torch.nn.Module, state_dict: dict, source) -> dict:
    """`state_dict` without wrapper prefixes; a one-line ValueError when its names or shapes differ from `model`'s
    (a None value counts as missing). `source` names where the weights come from."""
    own, sd = model.state_dict(), clean_state_dict(state_dict)
    missing = [k for k in own if sd.get(k) is None]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in own if sd.get(k) is not None and tuple(sd[k].shape) != tuple(own[k].shape)]
    parts = [f"missing {len(missing)} (e.g. {missing[0]})"] if missing else []
    parts += [f"unexpected {len(unexpected)} (e.g. {unexpected[0]})"] if unexpected else []
    parts += [f"{k} has shape {tuple(sd[k].shape)} there but {tuple(own[k].shape)} here" for k in wrong[:1]]
    if parts:
        raise ValueError(f"the weights in {source} do not match the model ({'; '.join(parts)}): use the model "
                         f"settings they were trained with")
    return sd


def model_with_weights(model_cls, config, state_dict: dict, source) -> torch.nn.Module:
    """`model_cls(config)` on the CPU holding `state_dict`'s tensors (float32), checked by check_weights."""
    with torch.device("meta"):  # shapes only: the state_dict provides every value
        model = model_cls(config)
    sd = {k: v.to(torch.float32) if v.is_floating_point() else v
          for k, v in check_weights(model, state_dict, source).items()}
    model.load_state_dict(sd, assign=True)
    if config.tie_weights:  # assign=True replaced the shared Parameter with two tensors: tie them again
        model.lm_head.weight = model.transformer.wte.weight
    return model
