"""GPTConfig, the model's shape, and `pad_vocab`, the one home of vocabulary padding.

A plain dataclass (no Hydra, no OmegaConf): checkpoints store it as a dict and the model code stays
framework-free. Construction validates every field with one-line errors naming the field (common.text).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.text import setting_error

ATTENTION_IMPLS = ("sdpa", "manual")


def pad_vocab(vocab_size: int, multiple: int) -> int:
    """vocab_size rounded up to a multiple of `multiple` (GPT-2's 50257 -> 50304 with 64: faster matmuls)."""
    assert vocab_size >= 1 and multiple >= 1, (vocab_size, multiple)
    return -(-vocab_size // multiple) * multiple


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int  # maximum context length (number of learned position embeddings)
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms, like GPT-2
    tie_weights: bool = True  # lm_head shares its weight with the token embedding
    attention: str = "sdpa"  # "sdpa" (fused kernels) or "manual" (textbook, can return weights)

    def __post_init__(self):
        for f in dataclasses.fields(self):  # the int and bool fields by their type (annotations are strings here)
            setting, value = "{" + f.name + "=}", getattr(self, f.name)
            # bool is a subclass of int: refuse it explicitly (n_layer=True is a typo, not 1 layer)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise setting_error(setting + "{0!r} must be an integer: give a positive whole number", value)
            if f.type == "int" and value < 1:
                raise setting_error(setting + "{0} must be positive: give a value >= 1", value)
            if f.type == "bool" and not isinstance(value, bool):
                raise setting_error(setting + "{0!r} must be a boolean: use true or false", value)
        if self.n_embd % self.n_head != 0:
            suggestion = max(self.n_head, round(self.n_embd / self.n_head) * self.n_head)
            raise setting_error("{n_embd=}{0} is not divisible by {n_head=}{1}: choose n_embd as a multiple of n_head "
                                "(e.g. {n_embd=}{2})", self.n_embd, self.n_head, suggestion)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise setting_error("{dropout=}{0!r} must be a number in [0, 1): e.g. {dropout=}0.1", self.dropout)
        if not (0.0 <= self.dropout < 1.0):  # also catches NaN
            raise setting_error("{dropout=}{0} is outside [0, 1): use e.g. {dropout=}0.0 or {dropout=}0.2",
                                self.dropout)
        self.dropout = float(self.dropout)
        if self.attention not in ATTENTION_IMPLS:
            raise setting_error("{attention=}{0!r} is not known: use one of {1}", self.attention,
                                ", ".join(ATTENTION_IMPLS))

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a dict, got {type(d).__name__}: pass GPTConfig.to_dict() output")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"unknown model config key(s) {', '.join(map(str, unknown))}: "
                             f"valid keys are {', '.join(fields)}")
        missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in d]
        if missing:
            raise ValueError(f"model config is missing {', '.join(missing)}: add these keys")
        return cls(**d)
