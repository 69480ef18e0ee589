"""GPT: a GPT-2-style decoder-only transformer (nanoGPT's layout, GPT-2's module names so HF weights map 1:1).
Sampling lives in model/generate.py and the Hugging Face format in model/hf.py; the methods here are thin.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import generate as _gen
from model import hf
from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.weights import model_with_weights


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

    # model.generate(idx, ...) is model.generate.generate(model, idx, ...): one signature, in one place
    generate = _gen.generate  # idx (B, T) -> (B, T + max_new_tokens)
    generate_stream = _gen.generate_tokens  # yields each new token as a (B, 1) LongTensor

    @classmethod
    def from_pretrained(cls, path) -> "GPT":
        """A local Hugging Face GPT-2 directory (config.json + weights, 124M to 1.5B) as a GPT in eval mode."""
        config, sd = hf.read_pretrained(path)
        return model_with_weights(cls, config, sd, path).eval()
