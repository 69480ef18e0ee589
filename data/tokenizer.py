"""Tokenizers: char-level, GPT-2 BPE and your own byte-level BPE behind one small interface, plus a streaming
UTF-8 decoder.

`to_dict()` is plain JSON (stored in checkpoints and meta.json) and `tokenizer_from_dict` rebuilds the exact
tokenizer from it without the corpus. Unknown characters and foreign ids are one-line ValueErrors. Training the
own BPE lives in data/bpe.py; Hugging Face `tokenizers` is imported only when a bpe tokenizer is built.
"""
from __future__ import annotations

import codecs
from typing import Iterable, Sequence

import numpy as np

from common.text import one_line
from data.sources import GPT2_EOT, GPT2_EOT_ID, GPT2_VOCAB_SIZE, gpt2_encoding

_MAX_LISTED = 20
BPE_EOT = GPT2_EOT  # the own BPE's end-of-text token: the same text as GPT-2's, so exports read like GPT-2's


class Tokenizer:
    """encode (prompts), encode_ordinary (corpus), decode, decode_bytes, to_dict, describe, vocab_size, eot_id."""

    vocab_size: int
    eot_id: int | None = None


def _ids_list(ids: Iterable[int]) -> list[int]:
    if hasattr(ids, "tolist"):  # torch / numpy
        ids = ids.tolist()
    return [int(i) for i in ids]


def _foreign_ids(ids: list[int], vocab_size: int, vocabulary: str) -> ValueError:
    bad = sorted({i for i in ids if not 0 <= i < vocab_size})
    return ValueError(f"token ids {bad[:_MAX_LISTED]} are outside {vocabulary}: "
                      f"the ids come from a different tokenizer")


class CharTokenizer(Tokenizer):
    """The sorted set of characters of the corpus; `to_dict()` stores the characters themselves."""

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

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            bad = sorted(set(text) - self.stoi.keys())
            more = f" and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
            raise ValueError(f"characters not in the vocabulary: {', '.join(repr(c) for c in bad[:_MAX_LISTED])}"
                             f"{more} (the model was trained on a {self.vocab_size}-character vocabulary): remove "
                             f"or replace them") from None

    encode_ordinary = encode

    def code_table(self) -> np.ndarray:
        """int64 array mapping code point -> id (-1 where unknown), for bulk encoding."""
        table = np.full(ord(self.chars[-1]) + 1, -1, dtype=np.int64)
        table[[ord(c) for c in self.chars]] = np.arange(self.vocab_size)
        return table

    def decode(self, ids: Sequence[int]) -> str:
        ids = _ids_list(ids)
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise _foreign_ids(ids, self.vocab_size, f"this {self.vocab_size}-character vocabulary")
        return "".join([self.chars[i] for i in ids])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.decode(ids).encode("utf-8", errors="surrogatepass")

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    def describe(self) -> str:
        return f"char ({self.vocab_size} characters)"


class GPT2Tokenizer(Tokenizer):
    """tiktoken's GPT-2 BPE: `encode()` reads the text `<|endoftext|>` as id 50256, `encode_ordinary()` does not."""

    def __init__(self):
        self.enc = gpt2_encoding()
        self.vocab_size = GPT2_VOCAB_SIZE
        self.eot_id = GPT2_EOT_ID

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special={GPT2_EOT})

    def encode_ordinary(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        ids = _ids_list(ids)
        if any(not 0 <= i < GPT2_VOCAB_SIZE for i in ids):
            raise _foreign_ids(ids, GPT2_VOCAB_SIZE, f"the GPT-2 vocabulary (0..{GPT2_EOT_ID})")
        return self.enc.decode_bytes(ids)

    def to_dict(self) -> dict:
        return {"type": "gpt2"}

    def describe(self) -> str:
        return f"gpt2 BPE ({self.vocab_size:,} tokens)"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters (the alphabet of byte-level BPE vocabularies)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]  # mapped to 256, 257, ... in byte order
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def import_tokenizers():
    """Hugging Face `tokenizers`, an optional extra needed only by the bpe tokenizer."""
    try:
        import tokenizers
    except ImportError:
        raise ValueError("the bpe tokenizer needs Hugging Face's tokenizers package, which is not installed: "
                         "pip install tokenizers") from None
    return tokenizers


class BPETokenizer(Tokenizer):
    """A byte-level BPE trained on the corpus (data/bpe.py); `to_dict()` holds its tokenizer.json as a string.
    Its pre-tokenizer is GPT-2's, so data/encode.py cuts the text at the same safe places, and it has the two
    tiktoken methods tinygpt calls on GPT2Tokenizer.enc (encode_ordinary, decode_tokens_bytes): `enc` is itself."""

    def __init__(self, json_text: str):
        tk = import_tokenizers()
        try:
            self.hf = tk.Tokenizer.from_str(json_text)
            self._ordinary = tk.Tokenizer.from_str(json_text)  # reads "<|endoftext|>" in text as plain text
        except Exception as e:  # noqa: BLE001 - the Rust side raises its own exception type
            raise ValueError(f"the bpe tokenizer description is damaged ({one_line(e)[:100]}): prepare the data "
                             f"again, or use a checkpoint written by train.py") from None
        self._ordinary.encode_special_tokens = True
        self.json = json_text
        vocab = self.hf.get_vocab(with_added_tokens=True)  # token text -> id
        self.vocab_size, self.eot_id = len(vocab), vocab.get(BPE_EOT)
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        added = self.hf.get_added_tokens_decoder()  # <|endoftext|>, an imported model's <|im_start|>, ...: their text
        try:
            by_id = {i: s.encode() if i == self.eot_id or i in added else bytes(byte_of[c] for c in s)
                     for s, i in vocab.items()}
        except KeyError:
            by_id = {}
        if self.eot_id is None or sorted(by_id) != list(range(self.vocab_size)):
            raise ValueError(f"the tokenizer description is not a byte-level BPE with {BPE_EOT} (as data/bpe.py "
                             f"trains): prepare the data again with data.tokenizer=bpe")
        self._bytes: list[bytes] = [by_id[i] for i in range(self.vocab_size)]

    @property
    def enc(self) -> "BPETokenizer":
        return self

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_ordinary(self, text: str) -> list[int]:
        return self._ordinary.encode(text, add_special_tokens=False).ids

    def encode_ordinary_batch(self, texts: list[str]) -> list[list[int]]:
        """encode_ordinary of each text on every core: `tokenizers` releases the GIL for a batch (not for one)."""
        return [e.ids for e in self._ordinary.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_tokens_bytes(self, ids: Sequence[int]) -> list[bytes]:
        ids = _ids_list(ids)
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise _foreign_ids(ids, self.vocab_size, f"this {self.vocab_size}-token BPE vocabulary")
        return [self._bytes[i] for i in ids]

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.decode_tokens_bytes(ids))

    def to_dict(self) -> dict:
        return {"type": "bpe", "vocab_size": self.vocab_size, "json": self.json}

    def describe(self) -> str:
        return f"own BPE ({self.vocab_size:,} tokens)"


def token_bytes(tokenizer: Tokenizer):
    """int64 tensor, per id, of the UTF-8 bytes it stands for (0 for <|endoftext|>): the bits-per-byte divisor."""
    import torch
    enc = getattr(tokenizer, "enc", None)  # tiktoken (and BPE): all tokens in one call (50K decode calls take seconds)
    ids = list(range(tokenizer.vocab_size))
    n = [len(b) for b in enc.decode_tokens_bytes(ids)] if enc is not None else \
        [len(tokenizer.decode_bytes([i])) for i in ids]
    if tokenizer.eot_id is not None:
        n[tokenizer.eot_id] = 0
    return torch.tensor(n, dtype=torch.int64)


def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Rebuild a tokenizer from `to_dict()` output (checkpoint or meta.json)."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "char" and isinstance(d.get("chars"), str):
        return CharTokenizer(d["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    if kind == "bpe" and isinstance(d.get("json"), str):
        tok = BPETokenizer(d["json"])
        if d.get("vocab_size", tok.vocab_size) != tok.vocab_size:
            raise ValueError(f"the bpe tokenizer description says {d.get('vocab_size')!r} tokens but holds "
                             f"{tok.vocab_size}: the file is damaged")
        return tok
    raise ValueError(f"unknown tokenizer description {str(d)[:80]!r}: expected type 'char' (with 'chars'), "
                     f"'gpt2' or 'bpe' (with 'json'); the file was written by a different program or version")


class StreamDecoder:
    """Token ids -> text, emitting only complete UTF-8 characters; `flush()` ends with incomplete bytes as U+FFFD."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        return self._dec.decode(self.tokenizer.decode_bytes(ids))

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
