"""Tokenizers: char-level and GPT-2 BPE behind one small interface, plus a streaming UTF-8 decoder.

Interface (duck-typed, see `Tokenizer`): `encode(str) -> list[int]`, `decode(list[int]) -> str`,
`decode_bytes(list[int]) -> bytes`, `vocab_size`, `eot_id` (None for char-level), `to_dict()` (plain JSON,
stored in checkpoints and meta.json) and `tokenizer_from_dict(d)` to rebuild the exact tokenizer without the
corpus.

- `CharTokenizer`: the sorted set of characters of the corpus. Encoding a character it does not know raises
  ValueError listing the characters (never a silent drop). `to_dict()` stores the characters themselves.
- `GPT2Tokenizer`: tiktoken's GPT-2 BPE (50,257 ids, `<|endoftext|>` = 50256). It is built from the local
  ranks file `$TINYGPT_CACHE/tokenizers/gpt2.tiktoken` (GPT-2 split pattern + special token) when present,
  else from `tiktoken.get_encoding("gpt2")` (which downloads; the ranks are then written to the cache so the
  next run works offline), else a one-line FileNotFoundError says where to put the file. The ranks file is
  parsed here rather than with `tiktoken.load.load_tiktoken_bpe`, which would copy a local file into
  tiktoken's own cache keyed by path (and could then serve a stale copy). `to_dict()` is `{"type": "gpt2"}`.
  Special tokens: `encode()` (prompts) turns the literal text `<|endoftext|>` into id 50256, as nanoGPT's
  sample.py does; corpus preparation uses `encode_ordinary()`, where that text is ordinary characters.
- `StreamDecoder`: one BPE token can hold half of a multi-byte character (emoji, CJK), so decoding token by
  token would print U+FFFD. It feeds token bytes through an incremental UTF-8 decoder and returns only
  complete characters; genuinely invalid bytes still come out as U+FFFD (honest, never an exception).
"""
from __future__ import annotations

import base64
import binascii
import codecs
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

from data import sources

GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
GPT2_EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257
TIKTOKEN_TIMEOUT_S = 30.0
_MAX_LISTED = 20


class Tokenizer:
    """The interface every tokenizer implements."""

    kind: str = "?"
    vocab_size: int
    eot_id: int | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode corpus text (special-token text is ordinary characters). Same as encode() for char."""
        return self.encode(text)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind} ({self.vocab_size:,} tokens)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(self.to_dict()))


def _ids_list(ids: Iterable[int]) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return [int(i) for i in ids]


# --------------------------------------------------------------------------------------------------------
class CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: str | Iterable[str]):
        chars = sorted(set(chars))
        if not chars:
            raise ValueError("a char-level vocabulary needs at least one character: the text is empty")
        if any(len(c) != 1 for c in chars):
            raise ValueError("CharTokenizer takes single characters")
        self.chars: list[str] = chars
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.eot_id = None

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(set(text))

    def unknown_chars(self, text: str) -> list[str]:
        return sorted(set(text) - self.stoi.keys())

    def _unknown_error(self, text: str) -> ValueError:
        bad = self.unknown_chars(text)
        listed = ", ".join(repr(c) for c in bad[:_MAX_LISTED]) + (f" and {len(bad) - _MAX_LISTED} more"
                                                                 if len(bad) > _MAX_LISTED else "")
        return ValueError(f"characters not in the vocabulary: {listed} (the model was trained on a "
                          f"{self.vocab_size}-character vocabulary): remove or replace them")

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            raise self._unknown_error(text) from None

    def code_table(self):
        """numpy int64 array mapping code point -> id (-1 where unknown); fast bulk encoding in prepare."""
        import numpy as np
        table = np.full(ord(self.chars[-1]) + 1, -1, dtype=np.int64)
        table[[ord(c) for c in self.chars]] = np.arange(self.vocab_size)
        return table

    def decode(self, ids: Sequence[int]) -> str:
        ids = _ids_list(ids)
        try:
            if any(i < 0 for i in ids):
                raise IndexError
            return "".join([self.chars[i] for i in ids])
        except IndexError:
            bad = sorted({i for i in ids if not 0 <= i < self.vocab_size})
            raise ValueError(f"token ids {bad[:_MAX_LISTED]} are outside this {self.vocab_size}-character "
                             f"vocabulary: the ids come from a different tokenizer") from None

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.decode(ids).encode("utf-8", errors="surrogatepass")

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    def describe(self) -> str:
        return f"char ({self.vocab_size} characters)"

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# --------------------------------------------------------------------------------------------------------
_ENCODING_CACHE: dict[Any, Any] = {}
_CACHE_LOCK = threading.Lock()


def _missing_ranks_error(reason: str) -> FileNotFoundError:
    dest = sources.gpt2_ranks_cache_path()
    return FileNotFoundError(
        f"GPT-2 BPE ranks are not at {dest} and tiktoken could not fetch them ({reason}): put a tiktoken-format "
        f"gpt2 ranks file at exactly {dest} (make one on a machine with internet with `python -m data.sources`, "
        f"which writes it to that machine's cache, then copy it)")


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken-format ranks file (`<base64 token> <rank>` per line)."""
    ranks: dict[bytes, int] = {}
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                tok, rank = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(rank)
    except (ValueError, binascii.Error):
        raise ValueError(f"{path} is not a tiktoken ranks file (line {lineno} is not '<base64> <rank>'): "
                         f"replace it with a GPT-2 ranks file in tiktoken format") from None
    if len(ranks) != GPT2_EOT_ID or ranks.get(b"Hello") != 15496:
        raise ValueError(f"{path} does not hold the GPT-2 BPE ranks ({len(ranks):,} entries, expected "
                         f"{GPT2_EOT_ID:,}): replace it with the GPT-2 ranks file in tiktoken format")
    return ranks


def _save_ranks(ranks: dict[bytes, int], dest: Path) -> None:
    """Best effort: write ranks in tiktoken format atomically so later runs work offline."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        with os.fdopen(fd, "wb") as f:
            for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n")
        os.replace(tmp, dest)
    except OSError as e:
        print(f"note: could not save the GPT-2 ranks to {dest} ({e}); offline runs will need it",
              file=sys.stderr)


def _tiktoken_gpt2(timeout: float = TIKTOKEN_TIMEOUT_S):
    """tiktoken.get_encoding("gpt2") with a time limit (tiktoken's own download has no timeout)."""
    import tiktoken
    box: dict[str, Any] = {}

    def work():
        try:
            box["enc"] = tiktoken.get_encoding("gpt2")
        except BaseException as e:  # noqa: BLE001 - reported below as one line
            box["err"] = e

    t = threading.Thread(target=work, daemon=True, name="tiktoken-gpt2")
    t.start()
    t.join(timeout)
    if "enc" in box:
        return box["enc"]
    if "err" in box:
        err = box["err"]
        msg = " ".join(str(err).split())
        raise _missing_ranks_error(f"{type(err).__name__}: {msg[:120]}{'...' if len(msg) > 120 else ''}")
    raise _missing_ranks_error(f"no answer within {timeout:.0f} s")


def _gpt2_encoding():
    import tiktoken
    path = sources.gpt2_ranks_path()
    if path is not None:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        with _CACHE_LOCK:
            if key not in _ENCODING_CACHE:
                _ENCODING_CACHE[key] = tiktoken.Encoding(
                    name="gpt2", pat_str=GPT2_PAT_STR, mergeable_ranks=load_ranks(path),
                    special_tokens={GPT2_EOT: GPT2_EOT_ID}, explicit_n_vocab=GPT2_VOCAB_SIZE)
            return _ENCODING_CACHE[key]
    enc = _tiktoken_gpt2()
    ranks = getattr(enc, "_mergeable_ranks", None)
    if isinstance(ranks, dict) and len(ranks) == GPT2_EOT_ID:
        _save_ranks(ranks, sources.gpt2_ranks_cache_path())
    return enc


class GPT2Tokenizer(Tokenizer):
    kind = "gpt2"

    def __init__(self):
        self.enc = _gpt2_encoding()
        self.vocab_size = GPT2_VOCAB_SIZE
        self.eot_id = GPT2_EOT_ID

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special={GPT2_EOT})

    def encode_ordinary(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def _check_ids(self, ids: list[int]) -> None:
        if any(not 0 <= i < GPT2_VOCAB_SIZE for i in ids):
            bad = sorted({i for i in ids if not 0 <= i < GPT2_VOCAB_SIZE})
            raise ValueError(f"token ids {bad[:_MAX_LISTED]} are outside the GPT-2 vocabulary (0..{GPT2_EOT_ID}): "
                             f"the ids come from a different tokenizer")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        ids = _ids_list(ids)
        self._check_ids(ids)
        return self.enc.decode_bytes(ids)

    def to_dict(self) -> dict:
        return {"type": "gpt2"}

    def describe(self) -> str:
        return f"gpt2 BPE ({self.vocab_size:,} tokens)"

    def __repr__(self) -> str:
        return "GPT2Tokenizer()"


# --------------------------------------------------------------------------------------------------------
def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Rebuild a tokenizer from `to_dict()` output (checkpoint or meta.json)."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char" and isinstance(d.get("chars"), str):
        return CharTokenizer(d["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer description {str(d)[:80]!r}: expected type 'char' (with 'chars') "
                     f"or 'gpt2'; the file was written by a different program or version")


def make_tokenizer(kind: str, text: str | None = None) -> Tokenizer:
    """'char' (needs the text for its vocabulary) or 'gpt2'."""
    if kind == "char":
        if text is None:
            raise ValueError("a char-level tokenizer needs the corpus text to build its vocabulary")
        return CharTokenizer.from_text(text)
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {kind!r}: use data.tokenizer=char or data.tokenizer=gpt2")


def check_same_tokenizer(expected: dict, actual: dict, *, expected_from: str = "the checkpoint",
                         actual_from: str = "the prepared data") -> None:
    """One-line ValueError if two tokenizer dicts differ (e.g. resuming a checkpoint on other data)."""
    if expected == actual:
        return

    def desc(d: dict) -> str:
        if d.get("type") == "char":
            return f"a {len(d.get('chars', ''))}-character char-level vocabulary"
        return f"{d.get('type')} BPE" if d.get("type") == "gpt2" else repr(d)[:60]

    same_kind = expected.get("type") == actual.get("type")
    raise ValueError(f"vocabulary mismatch: {expected_from} uses {desc(expected)} but {actual_from} uses "
                     f"{desc(actual)}{' with different characters' if same_kind else ''}: use the same "
                     f"data settings (data=..., data.path, data.tokenizer) as the run that wrote the checkpoint")


# --------------------------------------------------------------------------------------------------------
class StreamDecoder:
    """Turn a stream of token ids into text, emitting only complete UTF-8 characters.

    `push(ids)` returns the newly completed text (possibly ""), `flush()` whatever is left at the end
    (incomplete bytes become U+FFFD there, since no later token can complete them).
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int] | int) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return self._dec.decode(self.tokenizer.decode_bytes(_ids_list(ids)))

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
