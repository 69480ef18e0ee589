"""GPTConfig, the model's shape, and `pad_vocab`, the one home of vocabulary padding.

One config for the model: a plain dataclass (no Hydra, no OmegaConf) that is also the schema of
train.py's `model` group, so construction is where every field is validated, once, with one-line
errors naming the field (common.cli). Checkpoints store its shape as a dict (`to_dict`); the
defaults are GPT-2 small's, as nanoGPT's GPTConfig.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Optional

from common.cli import setting_error
from model.positions import SCHEMES

ATTENTION_IMPLS = ("sdpa", "manual")
# how a run builds the model, not its shape
BUILD_FIELDS = ("pad_vocab_to", "init_from")
# in every stored model config
SHAPE_REQUIRED = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
# the position schemes' table (model/positions.py) holds what each does: learned (GPT-2's wpe), rope
POSITIONS = tuple(SCHEMES)
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "gelu_exact", "swiglu", "relu2")


def pad_vocab(vocab_size: int, multiple: int) -> int:
    """vocab_size rounded up to a multiple of `multiple` (GPT-2's 50257 -> 50304 with 64: faster
    matmuls)."""
    assert vocab_size >= 1 and multiple >= 1, (vocab_size, multiple)
    return -(-vocab_size // multiple) * multiple


@dataclass
class GPTConfig:
    # rows of the embedding and the head; None: the tokenizer's (training sets it)
    vocab_size: Optional[int] = None
    # maximum context length (the rows of wpe, GPT-2's learned position table)
    block_size: int = 1024
    # transformer blocks
    n_layer: int = 12
    # attention heads per block
    n_head: int = 12
    # width of the residual stream (the embeddings)
    n_embd: int = 768
    # dropout probability (embeddings, attention weights, residual branches)
    dropout: float = 0.0
    # biases in Linear layers and LayerNorms, like GPT-2
    bias: bool = True
    # lm_head shares its weight with the token embedding
    tie_weights: bool = True
    # "sdpa" (fused kernels) or "manual" (textbook, can return weights)
    attention: str = "sdpa"

    # the modern decoder's settings (docs/model.md); the defaults are GPT-2's, so old checkpoint
    # dicts still load

    # a key of model/positions.py's table: "learned" (wpe), "rope" (rotary q and k, rotate_half
    # layout, no wpe), "alibi" (a bias on the scores, no wpe)
    position: str = "learned"
    # rotary base: inv_freq = 1 / rope_theta^(2i / head_dim)
    rope_theta: float = 10000.0
    # "layernorm" or "rmsnorm" (weight only)
    norm: str = "layernorm"
    # eps of every norm (blocks, final, qk_norm)
    norm_eps: float = 1e-5
    # "gelu" (GPT-2's tanh form), "gelu_exact" (erf: nanoGPT's), "swiglu" (Llama/Qwen3), "relu2"
    mlp: str = "gelu"
    # the MLP's hidden width; None: 4*n_embd (gelu, relu2), swiglu: 8*n_embd/3 to a multiple of 32
    mlp_hidden: Optional[int] = None
    # key/value heads (grouped-query attention); None = n_head, 1 = multi-query
    n_kv_head: Optional[int] = None
    # each head's width; None = n_embd // n_head (set: decoupled)
    head_dim: Optional[int] = None
    # RMSNorm over head_dim of each q and k head, before the position scheme (Qwen3)
    qk_norm: bool = False
    # logits -> softcap * tanh(logits / softcap), after the head, in fp32
    logit_softcap: Optional[float] = None

    # how a training run builds it (not part of the shape, so not in to_dict): the vocabulary's
    # padding, the weights

    # vocab_size = the tokenizer's rounded up to a multiple of this (64 for GPT-2: faster matmuls)
    pad_vocab_to: int = 1
    # fine-tune: a local HF GPT-2/Llama/Qwen3 dir or a tinygpt run / checkpoint
    init_from: Optional[str] = None

    def __post_init__(self):
        # the int and bool fields by their type (annotations are strings here)
        for f in dataclasses.fields(self):
            setting, value = "{" + f.name + "=}", getattr(self, f.name)
            # (set from the tokenizer: GPT() refuses None)
            if f.name == "vocab_size" and value is None:
                continue
            # bool is a subclass of int: refuse it explicitly (n_layer=True is a typo, not 1 layer)
            whole = f.type == "int" or f.name == "vocab_size"
            if whole and (isinstance(value, bool) or not isinstance(value, int)):
                raise setting_error(setting + "{0!r} must be an integer: give a positive whole "
                                    "number", value)
            if whole and value < 1:
                raise setting_error(setting + "{0} must be positive: give a value >= 1", value)
            if f.type == "bool" and not isinstance(value, bool):
                raise setting_error(setting + "{0!r} must be a boolean: use true or false", value)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise setting_error("{dropout=}{0!r} must be a number in [0, 1): e.g. {dropout=}0.1",
                                self.dropout)
        if not (0.0 <= self.dropout < 1.0):  # also catches NaN
            raise setting_error("{dropout=}{0} is outside [0, 1): use e.g. {dropout=}0.0 or "
                                "{dropout=}0.2",
                                self.dropout)
        self.dropout = float(self.dropout)
        if self.attention not in ATTENTION_IMPLS:
            raise setting_error("{attention=}{0!r} is not known: use one of {1}", self.attention,
                                ", ".join(ATTENTION_IMPLS))
        self._check_modern()
        self._check_shape()
        # what the position scheme needs of the other settings (model/positions.py)
        SCHEMES[self.position].check(self)

    def _check_modern(self) -> None:
        """The modern settings, each refused in one line naming it and what it accepts."""
        # position: the keys of the schemes' table, read at each check
        for name, allowed in (("position", SCHEMES), ("norm", NORMS), ("mlp", MLPS)):
            if getattr(self, name) not in allowed:
                raise setting_error("{" + name + "=}{0!r} is not known: use one of {1}",
                                    getattr(self, name), ", ".join(allowed))
        # None, or a positive whole number
        for name in ("mlp_hidden", "n_kv_head", "head_dim"):
            value = getattr(self, name)
            whole = isinstance(value, int) and not isinstance(value, bool)
            if value is not None and not (whole and value >= 1):
                raise setting_error("{" + name + "=}{0!r} is invalid: use a positive whole number "
                                    "or null", value)
        for name, optional in (("rope_theta", False), ("norm_eps", False), ("logit_softcap", True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            # `not value > 0` refuses NaN too
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise setting_error("{" + name + "=}{0!r} is invalid: use a positive number" +
                                    (" or null" if optional else ""), value)
            setattr(self, name, float(value))

    def _shape_problems(self) -> list[str]:
        """The rules between the heads' settings this config breaks, as setting_error templates."""
        out = []
        if self.head_dim is None and self.n_embd % self.n_head != 0:
            out.append(f"{{n_embd=}}{self.n_embd} is not divisible by {{n_head=}}{self.n_head}")
        elif self.position == "rope" and self.head_size % 2 != 0:
            out.append(f"{{position=}}rope needs an even head size, got {self.head_size}")
        if self.n_head % self.kv_heads != 0:
            out.append(f"{{n_kv_head=}}{self.n_kv_head} does not divide {{n_head=}}{self.n_head}")
        return out

    def _check_shape(self) -> None:
        """The heads' rules: every broken one in one line, with settings that keep them all."""
        problems = self._shape_problems()
        if not problems:
            return
        fix, how = self.nearest_shape(), []
        if "n_embd" in fix:
            how.append("n_embd as a multiple of " + ("2 x n_head (rope needs an even head size)"
                                                     if self.position == "rope" else "n_head"))
        if "head_dim" in fix:
            how.append("an even head_dim (rope rotates pairs of dimensions)")
        if "n_kv_head" in fix:
            how.append("n_kv_head as a divisor of n_head (1 = multi-query, n_head = plain "
                       "multi-head)")
        raise setting_error("; ".join(problems) + ": choose " + " and ".join(how) + " (e.g. " +
                            " ".join(f"{{{k}=}}{v}" for k, v in fix.items()) + ")")

    def nearest_shape(self) -> dict[str, int]:
        """The fewest, nearest changes of n_embd, n_kv_head and head_dim (n_head kept: some always
        fit it) after which this config breaks none of the heads' rules, found by trying them on
        copies of it; {} when it breaks none. What an error suggests, so that following it works."""
        if not self._shape_problems():
            return {}
        # n_embd within 2 x n_head of its value (a multiple of 2 x n_head is within n_head), any
        # n_kv_head up to n_head, head_dim within 2 of its value: each alone, then two, then three
        reach, embd, dim = 2 * self.n_head, self.n_embd, self.head_dim
        options = {"n_embd": range(max(1, embd - reach), embd + reach + 1) if dim is None else (),
                   "n_kv_head": range(1, self.n_head + 1) if self.n_kv_head is not None else (),
                   "head_dim": range(max(1, dim - 2), dim + 3) if dim else ()}
        for k in range(1, len(options) + 1):
            found = []
            for names in itertools.combinations(options, k):
                for values in itertools.product(*(options[n] for n in names)):
                    trial = copy.copy(self)
                    for name, value in zip(names, values):
                        setattr(trial, name, value)
                    if not trial._shape_problems():
                        now = [getattr(self, n) for n in names]
                        cost = sum(abs(v - c) / c for v, c in zip(values, now))
                        found.append((cost, values, dict(zip(names, values))))
            if found:
                return min(found, key=lambda f: f[:2])[2]
        # (n_embd = 2 x n_head with n_kv_head = 1, or an even head_dim, always fits)
        raise AssertionError(f"no shape fits n_head={self.n_head}")

    @property
    def head_size(self) -> int:
        """Width of each attention head: head_dim, else n_embd // n_head."""
        return self.head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, else n_head."""
        return self.n_kv_head or self.n_head

    @property
    def mlp_size(self) -> int:
        """The MLP's hidden width: mlp_hidden, else 4*n_embd (swiglu: 2/3 of that,
        parameter-matched, up to a multiple of 32)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return math.ceil(8 * self.n_embd / 3 / 32) * 32 if self.mlp == "swiglu" else 4 * self.n_embd

    def to_dict(self) -> dict:
        """The model's shape, as checkpoints store it (without how a run builds it: pad_vocab_to,
        init_from)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in BUILD_FIELDS}

    def with_vocab(self, vocab_size: int) -> "GPTConfig":
        """This config for a tokenizer of `vocab_size` ids: the vocabulary padded to a multiple of
        pad_vocab_to."""
        return dataclasses.replace(self, vocab_size=pad_vocab(vocab_size, self.pad_vocab_to))

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a dict, got {type(d).__name__}: pass "
                             f"GPTConfig.to_dict() output")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"unknown model config key(s) {', '.join(map(str, unknown))}: "
                             f"valid keys are {', '.join(fields)}")
        missing = [n for n in SHAPE_REQUIRED if n not in d]
        if missing:
            raise ValueError(f"model config is missing {', '.join(missing)}: add these keys")
        return cls(**d)
