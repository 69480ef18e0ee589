"""GPTConfig, the model's shape, and `pad_vocab`, the one home of vocabulary padding.

A plain dataclass (no Hydra, no OmegaConf): checkpoints store it as a dict and the model code stays
framework-free. Construction validates every field with one-line ValueErrors; `field_prefix` lets a caller
whose config nests these fields (training's `model.` block) get messages in its own key names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass

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
    field_prefix: InitVar[str] = ""  # names fields in messages, e.g. "model." -> model.n_embd=130 (not stored)

    def __post_init__(self, field_prefix: str = ""):
        p = field_prefix
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            # bool is a subclass of int: refuse it explicitly (n_layer=True is a typo, not 1 layer)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{p}{name}={value!r} must be an integer: give a positive whole number")
            if value < 1:
                raise ValueError(f"{p}{name}={value} must be positive: give a value >= 1")
        if self.n_embd % self.n_head != 0:
            suggestion = max(self.n_head, round(self.n_embd / self.n_head) * self.n_head)
            raise ValueError(f"{p}n_embd={self.n_embd} is not divisible by {p}n_head={self.n_head}: choose n_embd "
                             f"as a multiple of n_head (e.g. {p}n_embd={suggestion})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"{p}dropout={self.dropout!r} must be a number in [0, 1): e.g. {p}dropout=0.1")
        if not (0.0 <= self.dropout < 1.0):  # also catches NaN
            raise ValueError(f"{p}dropout={self.dropout} is outside [0, 1): use e.g. {p}dropout=0.0 or {p}dropout=0.2")
        self.dropout = float(self.dropout)
        for name in ("bias", "tie_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{p}{name}={getattr(self, name)!r} must be a boolean: use true or false")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"{p}attention={self.attention!r} is not known: use one of {', '.join(ATTENTION_IMPLS)}")

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
