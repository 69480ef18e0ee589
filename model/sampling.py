"""The sampling settings as one object, checked once, where it is made: sample.py's flags and the explorer's API
fields come from its fields, and model/generate.py takes it whole. No torch: sample.py checks flags before torch."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from common.cli import setting_error

WINDOWS = ("half", "sliding")  # past block_size the context keeps its last half, or its last block_size (nanoGPT's)
GREEDY_BELOW = 2.0 ** -126  # float32's smallest normal number (torch.finfo(torch.float32).tiny), 1.18e-38


def setting(default, type, metavar: str, help: str):
    """A field a user sets: sample.py's flag (--top-k for top_k; type, metavar, help: argparse's), an API field."""
    return field(default=default, metadata=dict(type=type, metavar=metavar, help=help))


def _number(x, whole: bool = False) -> bool:  # bool is an int, but True is a typo, not 1
    return not isinstance(x, bool) and isinstance(x, int if whole else (int, float))


@dataclass(frozen=True)
class Sampling:
    """How each next token is drawn from the logits: logits_to_probs applies it, in the order it
    documents. Each filter's "off" is a value too, as in Hugging Face and llama.cpp: top_k 0, top_p
    1 and min_p 0 keep every token and are stored as None (left out), so they compare equal to it.
    Each help states the range its check accepts (tests/test_sampling_ranges.py probes the ends)."""
    temperature: float = setting(1.0, float, "T", "T >= 0; 0 = greedy (default %(default)s)")
    top_k: int | None = setting(None, int, "K", "sample among the K most likely tokens, K >= 0 "
                                "(0 = all tokens, as left out; more than the vocabulary: all)")
    top_p: float | None = setting(None, float, "P", "nucleus sampling: the smallest set with mass "
                                  ">= P, 0 < P <= 1 (1 = all tokens, as left out)")
    min_p: float | None = setting(None, float, "P", "keep tokens at least P times as likely as the "
                                  "top one, 0 <= P <= 1 (0 = all tokens, as left out)")
    vocab_limit: int | None = None  # ids >= vocab_limit are never drawn (a padded vocabulary): the tokenizer's size

    def __post_init__(self):
        if not (_number(self.temperature) and 0 <= self.temperature < float("inf")):  # also NaN
            raise setting_error("{temperature=}{0!r} is invalid: use 0 (greedy) or a positive number such as 0.8",
                                self.temperature)
        if self.top_k is not None and not (_number(self.top_k, whole=True) and self.top_k >= 0):
            raise setting_error("{top_k=}{0!r} is invalid: use a whole number >= 0 (e.g. "
                                "{top_k=}50; 0 keeps every token)", self.top_k)
        if self.top_p is not None and not (_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise setting_error("{top_p=}{0!r} is outside (0, 1]: use e.g. {top_p=}0.9 (1 keeps every token)",
                                self.top_p)
        if self.min_p is not None and not (_number(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise setting_error("{min_p=}{0!r} is outside [0, 1]: use e.g. {min_p=}0.05 (0 keeps every token)",
                                self.min_p)
        if self.vocab_limit is not None and not (_number(self.vocab_limit, whole=True) and self.vocab_limit >= 1):
            raise setting_error("{vocab_limit=}{0!r} is invalid: use the tokenizer's vocabulary size, or None",
                                self.vocab_limit)
        # a filter that keeps every token is no filter: stored as left out
        for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
            if getattr(self, name) == off:
                object.__setattr__(self, name, None)

    @property
    def greedy(self) -> bool:
        """Argmax, no random draw: temperature 0, or one below GREEDY_BELOW, which float32 (sampling's) cannot divide
        by (a GPU flushes it to 0); any other is exact. The one rule of every decode path and of the explorer."""
        return self.temperature < GREEDY_BELOW


SETTINGS = {f.name: f for f in fields(Sampling) if f.metadata}  # what a user sets: sample.py's flags, API fields
