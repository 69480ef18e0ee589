"""GPTConfig: the model's shape, as one validated dataclass.

Design: a plain dataclass (no Hydra, no OmegaConf) so checkpoints can store it as a dict and the model
code stays framework-free. `__post_init__` validates every field and raises `ValueError` with a
one-line message that names the field and says how to fix it; `to_dict()`/`from_dict()` round-trip
through plain JSON-able dicts (unknown keys are refused rather than silently dropped).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ATTENTION_IMPLS = ("sdpa", "manual")


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
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            # bool is a subclass of int: refuse it explicitly (n_layer=True is a typo, not 1 layer)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}={value!r} must be an integer: give a positive whole number")
            if value < 1:
                raise ValueError(f"{name}={value} must be positive: give a value >= 1")
        if self.n_embd % self.n_head != 0:
            suggestion = max(self.n_head, round(self.n_embd / self.n_head) * self.n_head)
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}: choose n_embd "
                             f"as a multiple of n_head (e.g. n_embd={suggestion})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"dropout={self.dropout!r} must be a number in [0, 1): e.g. dropout=0.1")
        if not (0.0 <= self.dropout < 1.0):  # also catches NaN
            raise ValueError(f"dropout={self.dropout} is outside [0, 1): use e.g. dropout=0.0 or dropout=0.2")
        self.dropout = float(self.dropout)
        for name in ("bias", "tie_weights"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a boolean: use true or false")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention={self.attention!r} is not known: use one of {', '.join(ATTENTION_IMPLS)}")

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
