"""GPT: a decoder-only transformer (nanoGPT's layout, GPT-2's module names so HF weights map 1:1;
the modern settings of model/config.py swap its pieces): the norms, the MLP, the block, the model,
and the one way weights get into it (checkpoint, Hugging Face, fine-tune). Attention lives in
model/attention.py, the position schemes in model/positions.py, sampling in model/generate.py
(GPT.generate, nanoGPT's, is a call into it).
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import CausalSelfAttention, RMSNorm
from model.config import GPTConfig
from model.positions import SCHEMES


def norm(config: GPTConfig, dim: int) -> nn.Module:
    """LayerNorm (x - mean) / std * w [+ b], or RMSNorm x / rms(x) * w (no centring, no bias)."""
    if config.norm == "rmsnorm":
        return RMSNorm(dim, eps=config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)


class MLP(nn.Module):
    """Position-wise feed-forward: C -> H -> activation -> C -> dropout, H = config.mlp_size (4C
    for GELU). gelu: GELU(tanh) (GPT-2); gelu_exact: GELU(erf) (nanoGPT's nn.GELU()); relu2:
    relu(h)^2 (modded-nanogpt); swiglu: silu(gate) * up, c_fc's rows [gate; up]."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.kind, hidden = config.mlp, config.mlp_size
        width = (2 if self.kind == "swiglu" else 1) * hidden
        self.c_fc = nn.Linear(config.n_embd, width, bias=config.bias)
        # GPT-2's "gelu_new" (tanh: exact parity with HF weights), or the erf form nanoGPT trains
        self.gelu = nn.GELU(approximate="none" if self.kind == "gelu_exact" else "tanh")
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # (B, T, C) -> (B, T, H), or (B, T, 2H) for swiglu
        h = self.c_fc(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = self.gelu(h)
        return self.dropout(self.c_proj(h))  # (B, T, H) -> (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each on a normalised input, each added
    back."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.ln_1 = norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = norm(config, config.n_embd)
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
            raise ValueError(f"GPT needs a GPTConfig, got {type(config).__name__}: use "
                             f"GPT(GPTConfig(...))")
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is not set: give "
                             "GPTConfig(vocab_size=...), e.g. the tokenizer's")
        self.config = config
        # the position scheme's entry: what the embedding adds, what attention gets
        # (model/positions.py)
        self.position = SCHEMES[config.position]
        # under torch.device("meta") (a shape to load weights into) nothing is initialised: random
        # init of a meta tensor runs torch's Python meta kernels, whose import (torch._dynamo,
        # sympy) costs 1-4 s at start-up
        shapes_only = torch.empty(0).is_meta

        def table(n):
            weight = torch.empty(n, config.n_embd) if shapes_only else None
            return nn.Embedding(n, config.n_embd, _weight=weight)
        self.transformer = nn.ModuleDict(dict(wte=table(config.vocab_size)))
        # GPT-2's learned position table; the other schemes have none
        if self.position.table:
            self.transformer.wpe = table(config.block_size)
        self.transformer.update(dict(
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=norm(config, config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # one matrix: embeds tokens and scores them
            self.transformer.wte.weight = self.lm_head.weight

        if shapes_only:
            return
        # GPT-2's: weights ~ N(0, 0.02), biases 0
        self.apply(self._init_weights)
        # 2 residual adds per block: keep the stream's variance ~constant
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
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
        """Parameters, a tied matrix once; non_embedding (nanoGPT's convention) drops wpe, and wte
        when untied."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    @classmethod
    def from_pretrained(cls, model_dir, override_args: dict | None = None) -> "GPT":
        """nanoGPT's GPT.from_pretrained, from a local Hugging Face GPT-2, Llama or Qwen3 directory
        (config.json and weights: model.hf reads them), in eval mode; `override_args`: nanoGPT's,
        {'dropout': p} only. tinygpt never downloads: a Hub name such as 'gpt2' with no such
        directory is a ValueError with the download command."""
        from model.hf import read_pretrained
        from model.hub import looks_like_a_name, not_local
        if not Path(str(model_dir)).expanduser().exists() and looks_like_a_name(str(model_dir)):
            raise ValueError(not_local(str(model_dir), "GPT.from_pretrained('{}')"))
        if unknown := sorted(set(override_args or {}) - {"dropout"}):
            raise ValueError(f"override_args {unknown} cannot be set: a pretrained model's shape "
                             f"is its own; only dropout can be (as in nanoGPT)")
        config, sd = read_pretrained(model_dir)
        config = dataclasses.replace(config, **(override_args or {}))
        return model_with_weights(cls, config, sd, model_dir).eval()

    def _check_length(self, T: int) -> None:
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}: "
                             f"crop the input to its last {self.config.block_size} tokens or use a "
                             f"larger block_size")

    def forward(self, idx, targets=None, *, cache=None, input_pos=None, last_only=False):
        """idx (B, T) -> (logits (B, T, V), loss or None); targets (B, T): next ids, -1 = ignored.
        last_only: only the last position's logits (B, 1, V). With a KVCache, k/v are written at
        `input_pos` (T,), default 0..T-1."""
        B, T = idx.size()
        self._check_length(T)
        if input_pos is None:
            input_pos = torch.arange(T, device=idx.device)  # (T,)
        # no cache: the keys are x's own; a cache: its slots, slot p holding position p
        key_pos = None
        if cache is not None:
            key_pos = torch.arange(cache.width(input_pos), device=idx.device)

        x, at = self._embed(idx, input_pos, key_pos)
        x = self.transformer.drop(x)
        # what the positions give attention is computed once for all layers: positions advance per
        # step, not per layer
        for block in self.transformer.h:
            x, _ = block(x, at=at, cache=cache, input_pos=input_pos)
        assert not (last_only and targets is not None), "a loss needs every position's logits"
        return self.output(x[:, -1:] if last_only else x, targets)

    def output(self, x, targets=None):
        """The residual stream x (B, T, C) -> (logits (B, T, V), loss or None): the final norm, the
        head, the softcap and the loss. A method of its own: training compiles it as one region
        (training/step.py)."""
        logits = self.lm_head(self.transformer.ln_f(x))
        # smooth cap to (-c, c), in fp32 (bf16 tanh saturates early)
        if self.config.logit_softcap is not None:
            c = self.config.logit_softcap
            logits = c * torch.tanh(logits.float() / c)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-1)
        return logits, loss

    def _embed(self, idx, input_pos, key_pos=None):
        """The token embeddings (B, T, C) plus what the position scheme adds (GPT-2's wpe rows), and
        what attention gets from the positions (model.positions.Attend: rope's rotation, a bias, the
        mask) for keys at key_pos (a cache's slots), or the queries' own (None)."""
        x = self.position.embed(self.transformer, self.transformer.wte(idx), input_pos)
        return x, self.position.attend(self.config, input_pos, key_pos)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, *, min_p: float | None = None) -> torch.Tensor:
        """nanoGPT's model.generate: idx (B, T) followed by max_new_tokens sampled tokens,
        (B, T + max_new_tokens); temperature 0 is greedy; min_p: see Sampling. With the KV cache;
        top_p, a seeded generator and more: model.generate.generate."""
        # imported here: training never loads the sampler
        from model.generate import Sampling, generate
        return generate(self, idx, max_new_tokens, Sampling(temperature, top_k, min_p=min_p))

    @torch.no_grad()
    def attention_maps(self, idx) -> torch.Tensor:
        """Softmax attention weights (n_layer, B, n_head, T, T), computed by the manual path with
        dropout off."""
        B, T = idx.size()
        self._check_length(T)
        was_training = self.training
        self.eval()  # dropout off, whatever mode the caller left the model in
        try:
            x, at = self._embed(idx, torch.arange(T, device=idx.device))  # (B, T, C)
            maps = []
            for block in self.transformer.h:
                x, weights = block(x, at=at, need_weights=True)  # weights: (B, nh, T, T)
                maps.append(weights)
            return torch.stack(maps)  # (n_layer, B, nh, T, T)
        finally:
            self.train(was_training)


def clean_state_dict(sd: dict) -> dict:
    """Strip the `_orig_mod.` / `module.` prefixes wrappers add to parameter names."""
    return {re.sub(r"^((_orig_mod|module)\.)+", "", k): v for k, v in sd.items()}


def check_weights(model: torch.nn.Module, state_dict: dict, source) -> dict:
    """`state_dict` without wrapper prefixes; a one-line ValueError when its names or shapes differ
    from `model`'s (a None value counts as missing). `source` names where the weights come from."""
    own, sd = model.state_dict(), clean_state_dict(state_dict)
    missing = [k for k in own if sd.get(k) is None]
    unexpected = [k for k in sd if k not in own]
    wrong = [k for k in own
             if sd.get(k) is not None and tuple(sd[k].shape) != tuple(own[k].shape)]
    parts = [f"missing {len(missing)} (e.g. {missing[0]})"] if missing else []
    parts += [f"unexpected {len(unexpected)} (e.g. {unexpected[0]})"] if unexpected else []
    parts += [f"{k} has shape {tuple(sd[k].shape)} there but {tuple(own[k].shape)} here"
              for k in wrong[:1]]
    if parts:
        # the model is built from the settings saved with the weights (or given for them): a
        # mismatch is a damaged or edited file, which no setting of the user's can mend
        raise ValueError(f"the weights in {source} do not match the model ({'; '.join(parts)}): "
                         f"the file's weights and its saved settings disagree (damaged or edited): "
                         f"use the checkpoint or directory as tinygpt or Hugging Face wrote it")
    return sd


def model_with_weights(model_cls, config, state_dict: dict, source) -> torch.nn.Module:
    """`model_cls(config)` on the CPU holding `state_dict`'s tensors (float32), checked by
    check_weights."""
    # shapes only: the state_dict provides every value
    with torch.device("meta"):
        model = model_cls(config)
    sd = {k: v.to(torch.float32) if v.is_floating_point() else v
          for k, v in check_weights(model, state_dict, source).items()}
    model.load_state_dict(sd, assign=True)
    # assign=True replaced the shared Parameter with two tensors: tie them again
    if config.tie_weights:
        model.lm_head.weight = model.transformer.wte.weight
    return model
