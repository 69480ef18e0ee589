"""Where a text may be cut so that encoding its pieces one by one gives the tokens of the whole:
GPT-2's pre-tokenizer never merges across these places, so GPT-2 BPE (data/encode.py's parallel
encoding) and the own BPE (data/tokenizer.py's batches) both cut there.
"""
from __future__ import annotations

import unicodedata

# the own BPE: a text goes to `tokenizers` as a batch of safe pieces of this size
BATCH_CHARS = 1 << 13


def _ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def find_safe_cut(text: str, lo: int, hi: int) -> int:
    """Largest c in [lo, hi] such that GPT-2's pre-tokenizer (and so GPT-2 and the own BPE) encodes
    text[:c] + text[c:] as it encodes text; -1 if none found. Safe cuts: "a\\n|b" and "a| b" between
    ASCII letters/digits, and punctuation/symbol (not ') | letter ("。|你")."""
    n = len(text)
    lo, hi = max(lo, 1), min(hi, n - 1)
    if lo > hi:
        return -1
    for sep, after in (("\n", 1), (" ", 0)):  # cut = j + after in [lo, hi], j + 1 < n
        j = text.rfind(sep, lo - after, min(hi + 1 - after, n - 1))
        while j >= 1:
            if _ascii_alnum(text[j - 1]) and _ascii_alnum(text[j + 1]):
                return j + after
            j = text.rfind(sep, lo - after, j)
    category = unicodedata.category
    for c in range(hi, max(lo, hi - 65536) - 1, -1):
        a = text[c - 1]
        if a != "'" and category(a)[0] in "PS" and category(text[c])[0] == "L":
            return c
    return -1


def split_safe(text: str, size: int = BATCH_CHARS) -> list[str]:
    """`text` in pieces of about `size` characters, cut only where find_safe_cut allows (a piece
    with no safe cut in reach stays longer): encoding the pieces one by one gives the tokens of the
    whole."""
    out, start = [], 0
    while len(text) - start > 2 * size:
        cut = find_safe_cut(text, start + size // 2, start + size)
        if cut <= 0:
            break
        out.append(text[start:cut])
        start = cut
    return out + [text[start:]]
