"""Position schemes, in one table: how a token's position reaches the model. Each entry says what
the embedding adds, what attention does to q and k or to the scores, what the KV-cached decode
needs, and how each export format writes it or why it cannot. GPTConfig checks `position` against
the table's keys; the embedding (model/gpt.py), attention (model/attention.py) and the exports
(model/hf_llama.py, any other format through `export_family`) ask the entry and never test a
scheme's name, so a new scheme is one class here and its line in SCHEMES.

The KV-cached decode writes each key at its position (cache slot p holds position p) and hands
attention the slots 0..Tk-1: a scheme acting on keys has them cached acted on, and a bias reads
the key positions off the slots, so a scheme needs no code of its own there.
tests/test_model_attention.py proves, for every key of SCHEMES and both attention paths, that no
position sees the future and that the cached decode equals the full forward.

torch is imported inside the functions that compute: model.config reads this table and stays free
of torch (sample.py checks its arguments before torch is imported).
"""
from __future__ import annotations

from typing import NamedTuple

from common.cli import setting_error

# the export formats, by the name an exporter asks with -> their name in messages
FORMATS = {"hf": "Hugging Face", "gguf": "GGUF"}


class Attend(NamedTuple):
    """What attention gets from the positions, computed once per forward, shared by the layers."""
    # the scheme's state for q and k (rope: cos and sin (T, hs) at the queries' positions), or None
    qk: object
    # None: plainly causal (SDPA's is_causal); (Tq, Tk) bool, True = may attend (a cached forward);
    # or a scheme's float bias (nh, Tq, Tk) added to the scores, -inf where a query may not attend
    mask: object


class Position:
    """A scheme that adds nothing anywhere (attention alone cannot tell positions apart); each entry
    below overrides what it does."""
    # GPT builds wpe for this scheme: a learned table of block_size rows of n_embd
    table = False
    # export format (a key of FORMATS) -> the family its writer writes it as; others are refused
    exports: dict[str, str] = {}
    # why a format missing from `exports` cannot write this scheme
    unexportable = "no exporter writes it yet"

    def check(self, config) -> None:
        """A setting_error when `config`'s other settings do not fit this scheme."""

    def embed(self, transformer, x, input_pos):
        """What the embedding adds to the token embeddings x (B, T, C) at positions input_pos
        (T,)."""
        return x

    def state(self, config, input_pos):
        """What q and k need of the positions input_pos (T,), once per forward; None if nothing."""
        return None

    def qk(self, q, k, state):
        """q (B, nh, T, hs) and k (B, nkv, T, hs) at the forward's positions, before the scores
        (and before the cache: keys are cached as this returns them)."""
        return q, k

    def bias(self, config, query_pos, key_pos):
        """A float (nh, Tq, Tk) added to the scores of queries at query_pos (Tq,) and keys at
        key_pos (Tk,), or None."""
        return None

    def attend(self, config, input_pos, key_pos=None) -> Attend:
        """What attention gets for queries at input_pos (T,), over their own keys (key_pos None) or
        over a cache's slots (key_pos (Tk,): slot p holds position p)."""
        mask = None if key_pos is None else key_pos <= input_pos[:, None]
        bias = self.bias(config, input_pos, input_pos if key_pos is None else key_pos)
        if bias is not None:
            # one float mask: the bias where a query may attend, -inf where it may not (the future,
            # a cache's stale slots)
            causal = mask if mask is not None else input_pos <= input_pos[:, None]
            mask = bias.masked_fill(~causal, float("-inf"))
        return Attend(self.state(config, input_pos), mask)


class Learned(Position):
    """GPT-2's: the embedding adds row p of a learned table wpe (block_size rows), so the model
    knows positions 0..block_size-1 only; attention sees no position. Decode: nothing (the position
    came in with the token). Exports: GPT-2's wpe (Hugging Face GPT2LMHeadModel; GGUF's gpt2
    architecture, position_embd)."""
    table = True
    exports = {"hf": "gpt2", "gguf": "gpt2"}

    def embed(self, transformer, x, input_pos):
        # + (T, C), the same rows for every sequence of the batch
        return x + transformer.wpe(input_pos)


def rope_cos_sin(input_pos, head_dim: int, theta: float):
    """cos, sin (T, head_dim) in fp32 for positions input_pos (T,): angle
    pos * theta^(-2i/head_dim), each frequency twice (cat(freqs, freqs): the rotate_half layout
    of HF's Llama/Qwen3)."""
    import torch
    arange = torch.arange(0, head_dim, 2, device=input_pos.device).float()
    inv_freq = 1.0 / (theta ** (arange / head_dim))
    # (T, head_dim / 2), then each frequency twice: (T, head_dim)
    freqs = input_pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim: pairs (i, i + head_dim/2) rotate
    together."""
    import torch
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate each pair of x (B, nh, T, hs) by its position's angle, in fp32:
    x cos + rotate_half(x) sin."""
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).type_as(x)


class Rope(Position):
    """Rotary (RoFormer; Llama's and Qwen3's): q and k rotated pair by pair by angles of their
    position, so the score q_m . k_n depends on m - n only; no table. Decode: keys are cached
    rotated, so a step rotates its own token only. Exports: Hugging Face Llama/Qwen3 (rope_theta;
    HF's rotate_half layout, so q and k copy as they are) and GGUF's llama/qwen3 architectures
    (rope.freq_base)."""
    exports = {"hf": "llama", "gguf": "llama"}

    def check(self, config) -> None:
        if config.head_size % 2 != 0:
            raise setting_error("{position=}rope needs an even head size, got {0}: change "
                                "n_embd/n_head or head_dim", config.head_size)

    def state(self, config, input_pos):
        return rope_cos_sin(input_pos, config.head_size, config.rope_theta)

    def qk(self, q, k, state):
        return apply_rope(q, *state), apply_rope(k, *state)


def alibi_slopes(n_head: int, device=None):
    """The heads' slopes (Press et al.): 2^(-8i/n), i = 1..n, for n = n_head a power of two; else
    those of the power of two m below n_head, then every other one of 2m's."""
    import torch
    m = 1 << (n_head.bit_length() - 1)
    first = torch.arange(1, m + 1, device=device)
    rest = 2 * torch.arange(n_head - m, device=device) + 1
    return torch.cat((2.0 ** (-8.0 * first / m), 2.0 ** (-4.0 * rest / m)))


class Alibi(Position):
    """ALiBi (Press et al.; BLOOM's, MPT's): no table, q and k untouched; head h adds
    -slope_h * (i - j) to the score of query i for key j, so each head prefers recent keys at its
    own scale. Decode: the bias over the cache's slots. Exports: none."""
    unexportable = ("no exporter writes ALiBi (BLOOM's and MPT's layers differ from ours): train "
                    "with model.position=rope (Llama/Qwen3) or learned (GPT-2) to export")

    def bias(self, config, query_pos, key_pos):
        slopes = alibi_slopes(config.n_head, query_pos.device)
        distance = (query_pos[:, None] - key_pos[None, :]).float()
        return -slopes[:, None, None] * distance


# the table: model.position's values (GPTConfig checks against its keys)
SCHEMES: dict[str, Position] = {"learned": Learned(), "rope": Rope(), "alibi": Alibi()}


def export_family(config, fmt: str) -> str:
    """The family export format `fmt` (a key of FORMATS) writes config's positions as ("gpt2" or
    "llama" for "hf"), or a ValueError in one line:
    "model.position=X cannot be exported to <format>: <why>"."""
    assert fmt in FORMATS, fmt
    scheme = SCHEMES[config.position]
    if fmt not in scheme.exports:
        raise ValueError(f"model.position={config.position} cannot be exported to "
                         f"{FORMATS[fmt]}: {scheme.unexportable}")
    return scheme.exports[fmt]
