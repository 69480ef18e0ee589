"""How each next token is drawn, in one place: the settings (Sampling, checked once, where it is
made) and the rules that apply them (RULES). A rule is (logits, tokens so far, its setting's value)
-> logits; logits_to_probs applies them in the table's order on every decode path (cached,
uncached, CUDA graphs, torch.compile) and in the explorer. sample.py's flags and the explorer's API
fields come from the settings (SETTINGS): a new rule is a Sampling field and a RULES entry. No
torch import (the rules use tensor methods): sample.py checks its flags before torch is imported."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from common.cli import setting_error

# past block_size the context keeps its last half, or its last block_size (nanoGPT's)
WINDOWS = ("half", "sliding")
GREEDY_BELOW = 2.0 ** -126  # float32's smallest normal number (torch.finfo(torch.float32).tiny)
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
NEG_INF, INF = float("-inf"), float("inf")


def setting(default, type, metavar: str, help: str):
    """A field a user sets: sample.py's flag (--top-k for top_k; type, metavar, help: argparse's)
    and an API field of the explorer."""
    return field(default=default, metadata=dict(type=type, metavar=metavar, help=help))


def _number(x, whole: bool = False) -> bool:  # bool is an int, but True is a typo, not 1
    return not isinstance(x, bool) and isinstance(x, int if whole else (int, float))


@dataclass(frozen=True)
class Sampling:
    """How each next token is drawn from the logits: each field is read by its rule in RULES. Each
    filter's "off" is a value too, as in Hugging Face and llama.cpp: top_k 0, top_p 1, min_p 0 and
    repetition_penalty 1 keep every token and are stored as None (left out), so they compare equal
    to it. Each help states the range its check accepts (tests/test_sampling_ranges.py probes it).
    """
    temperature: float = setting(1.0, float, "T", "T >= 0; 0 = greedy (default %(default)s)")
    top_k: int | None = setting(None, int, "K", "sample among the K most likely tokens, K >= 0 "
                                "(0 = all tokens, as left out; more than the vocabulary: all)")
    top_p: float | None = setting(None, float, "P", "nucleus sampling: the smallest set with mass "
                                  ">= P, 0 < P <= 1 (1 = all tokens, as left out)")
    min_p: float | None = setting(None, float, "P", "keep tokens at least P times as likely as the "
                                  "top one, 0 <= P <= 1 (0 = all tokens, as left out)")
    repetition_penalty: float | None = setting(None, float, "R", "CTRL's: tokens already in the "
                                               "text less likely, R > 0 (e.g. 1.2; 1 = off)")
    # ids >= vocab_limit are never drawn (a padded vocabulary): the tokenizer's size
    vocab_limit: int | None = None

    def __post_init__(self):
        if not (_number(self.temperature) and 0 <= self.temperature < float("inf")):  # also NaN
            raise setting_error("{temperature=}{0!r} is invalid: use 0 (greedy) or a positive "
                                "number such as 0.8", self.temperature)
        if self.top_k is not None and not (_number(self.top_k, whole=True) and self.top_k >= 0):
            raise setting_error("{top_k=}{0!r} is invalid: use a whole number >= 0 (e.g. "
                                "{top_k=}50; 0 keeps every token)", self.top_k)
        if self.top_p is not None and not (_number(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise setting_error("{top_p=}{0!r} is outside (0, 1]: use e.g. {top_p=}0.9 (1 keeps "
                                "every token)", self.top_p)
        if self.min_p is not None and not (_number(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise setting_error("{min_p=}{0!r} is outside [0, 1]: use e.g. {min_p=}0.05 (0 keeps "
                                "every token)", self.min_p)
        if self.repetition_penalty is not None and not (_number(self.repetition_penalty)
                                                        and 0 < self.repetition_penalty < INF):
            raise setting_error("{repetition_penalty=}{0!r} is invalid: use a positive number such "
                                "as 1.2 (1 = off)", self.repetition_penalty)
        if self.vocab_limit is not None and not (_number(self.vocab_limit, whole=True)
                                                 and self.vocab_limit >= 1):
            raise setting_error("{vocab_limit=}{0!r} is invalid: use the tokenizer's vocabulary "
                                "size, or None", self.vocab_limit)
        # a filter that keeps every token is no filter: stored as left out
        for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0),
                          ("repetition_penalty", 1.0)):
            if getattr(self, name) == off:
                object.__setattr__(self, name, None)

    @property
    def greedy(self) -> bool:
        """Argmax, no random draw: temperature 0, or one below GREEDY_BELOW, which float32
        (sampling's) cannot divide by (a GPU flushes it to 0); any other is exact. The one rule of
        every decode path and of the explorer."""
        return self.temperature < GREEDY_BELOW


# what a user sets: sample.py's flags, the explorer's API fields
SETTINGS = {f.name: f for f in fields(Sampling) if f.metadata}


# The rules. Each takes the logits (..., V) in float32, the tokens so far (..., L): the prompt and
# the tokens drawn, -1 in the slots not drawn yet (a static buffer, which a CUDA graph reads too),
# and its setting's value; it returns the logits (..., V), -inf for a token it rules out.

def vocab_limit(logits, tokens, limit: int):
    """Padded ids (>= limit) at -inf: never drawn (on a copy: the caller's logits stay)."""
    if limit >= logits.size(-1):
        return logits
    logits = logits.clone()
    logits[..., limit:] = NEG_INF
    return logits


def repetition_penalty(logits, tokens, r: float):
    """CTRL's (HF's RepetitionPenaltyLogitsProcessor): the logits of the tokens so far divided by r
    where positive, multiplied by r where negative (a -1, a slot not drawn yet, is no token)."""
    drawn = (tokens >= 0).float()
    seen = logits.new_zeros(logits.shape).scatter_add_(-1, tokens.clamp_min(0), drawn)
    return logits.where(seen == 0, (logits / r).where(logits > 0, logits * r))


def top_k(logits, tokens, k: int):
    """The k likeliest (k clamped to V; ties with the k-th kept). Before the temperature, which
    keeps the order: no two logits can merge into one first."""
    kth = logits.topk(min(k, logits.size(-1)), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def temperature(logits, tokens, t: float):
    """Shifted so that the largest is 0, then divided by t: the same softmax, but nothing
    overflows (a t past float32's largest number would be inf there, and -inf / inf is NaN), and a
    tiny t gives the argmax (shared by exact ties) all the mass."""
    return (logits - logits.amax(dim=-1, keepdim=True)) / min(t, FLOAT32_MAX)


def top_p(logits, tokens, p: float):
    """The smallest set of the likeliest tokens whose probability reaches p: a token goes when the
    probability of the strictly likelier ones (exactly 0 for the top one, which always stays)
    reaches p without it."""
    if p >= 1.0:
        return logits
    sorted_probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    mass_before[..., 0] = 0.0
    drop = mass_before >= p
    return logits.masked_fill(drop.scatter(-1, order, drop), NEG_INF)


def min_p(logits, tokens, p: float):
    """HF's MinPLogitsWarper: the tokens at least p times as probable as the top one."""
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < p * probs.amax(dim=-1, keepdim=True), NEG_INF)


# setting -> its rule, in Hugging Face's order. Greedy applies the rules before the temperature
# (those after it only trim the tail), then takes the argmax.
RULES = {
    "vocab_limit": vocab_limit,
    "repetition_penalty": repetition_penalty,
    "top_k": top_k,
    "temperature": temperature,
    "top_p": top_p,
    "min_p": min_p,
}
assert set(RULES) == {f.name for f in fields(Sampling)}, "each Sampling field is read by its rule"


def logits_to_probs(logits, tokens, sampling: Sampling):
    """logits (..., V) -> probabilities (..., V) under `sampling`: the rule of each setting that is
    not None, in RULES's order, then the softmax; if sampling.greedy, the argmax's one-hot after
    the rules before the temperature. tokens (..., L): what the rules read (see above)."""
    logits = logits.float()
    for name, rule in RULES.items():
        if name == "temperature" and sampling.greedy:
            return logits.new_zeros(logits.shape).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        value = getattr(sampling, name)
        if value is not None:
            logits = rule(logits, tokens, value)
    return logits.softmax(dim=-1)
