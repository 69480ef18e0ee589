"""Tokenizers: char-level, GPT-2 BPE and your own byte-level BPE behind one small interface, plus a streaming
UTF-8 decoder. `to_dict()` is plain JSON (checkpoints, meta.json) that `tokenizer_from_dict` rebuilds exactly; its
kind is read only here. The GPT-2 ranks and `tokenizers` are loaded only when such a tokenizer is built.
"""
from __future__ import annotations

import codecs
import itertools
import re
from typing import Iterable, Sequence

import numpy as np

from common.cli import one_line
from data.safe_cut import split_safe

_MAX_LISTED = 20
BPE_EOT = "<|endoftext|>"  # the own BPE's end-of-text token: GPT-2's text, so exports read like GPT-2's


class Tokenizer:
    """encode (prompts), encode_ordinary (corpus), encode_ordinary_numpy (streamed preparation), decode,
    decode_bytes, decode_tokens_bytes, to_dict, describe, unknown_characters, vocab_size, eot_id."""

    vocab_size: int
    eot_id: int | None = None

    def describe(self) -> str:
        return f"{describe_tokenizer(self.to_dict())} ({self.vocab_size:,} tokens)"

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of `text` that it cannot encode, sorted (byte-level tokenizers: none)."""
        return []

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.decode_tokens_bytes(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _ids(self, ids: Iterable[int], vocabulary: str) -> list[int]:
        """`ids` (a list, numpy or torch) as ints, or a one-line ValueError naming those outside `vocabulary`."""
        ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]  # hasattr: torch / numpy
        if bad := sorted({i for i in ids if not 0 <= i < self.vocab_size}):
            raise ValueError(f"token ids {bad[:_MAX_LISTED]} are outside {vocabulary}: the ids come from a "
                             f"different tokenizer")
        return ids


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
            bad = self.unknown_characters(text)
            raise self.unknown_error(bad, "remove or replace them") from None

    encode_ordinary = encode

    def unknown_characters(self, text: str | Iterable[str]) -> list[str]:
        return sorted(set(text) - self.stoi.keys())

    def unknown_error(self, bad: list[str], fix: str, where: str = "") -> ValueError:
        """The one line for characters `bad` it cannot encode (the first ones named)."""
        listed = ", ".join(repr(c) for c in bad[:_MAX_LISTED])
        more = f" and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        return ValueError(f"{where}characters not in the vocabulary: {listed}{more} (the model was "
                          f"trained on a {self.vocab_size}-character vocabulary): {fix}")

    def code_table(self) -> np.ndarray:
        """int64 array mapping code point -> id (-1 where unknown), for bulk encoding."""
        table = np.full(ord(self.chars[-1]) + 1, -1, dtype=np.int64)
        table[[ord(c) for c in self.chars]] = np.arange(self.vocab_size)
        return table

    def decode(self, ids: Sequence[int]) -> str:
        return "".join([self.chars[i] for i in self._ids(ids, f"this {self.vocab_size}-character vocabulary")])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.decode(ids).encode("utf-8", errors="surrogatepass")

    def decode_tokens_bytes(self, ids: Sequence[int]) -> list[bytes]:
        return [self.decode([i]).encode("utf-8", errors="surrogatepass") for i in ids]

    def to_dict(self) -> dict:
        return {"type": "char", "chars": "".join(self.chars)}

    def describe(self) -> str:
        return describe_tokenizer(self.to_dict())


class GPT2Tokenizer(Tokenizer):
    """tiktoken's GPT-2 BPE: `encode()` reads the text `<|endoftext|>` as id 50256, `encode_ordinary()` does not."""

    def __init__(self):
        from data import sources  # the ranks file (or tiktoken's download): only when GPT-2 BPE is used
        self.enc = sources.gpt2_encoding()
        self.vocab_size, self.eot_id = sources.GPT2_VOCAB_SIZE, sources.GPT2_EOT_ID

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special={BPE_EOT})

    def encode_ordinary(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_ordinary_numpy(self, text: str) -> np.ndarray:
        """encode_ordinary as uint32, without a Python list."""
        return self.enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def decode_tokens_bytes(self, ids: Sequence[int]) -> list[bytes]:
        return self.enc.decode_tokens_bytes(self._ids(ids, f"the GPT-2 vocabulary (0..{self.eot_id})"))

    @staticmethod
    def to_dict() -> dict:
        return {"type": "gpt2"}


class ChatTokenizer(Tokenizer):
    """A tokenizer with a chat template (`chat`: data/chat_template.py's description) and the
    special tokens the template adds after the base's ids (none for an imported model's template:
    its tokens are its own)."""

    def __init__(self, base: Tokenizer, chat: dict):
        self.base, self.chat, self.special = base, chat, list(chat.get("special", []))
        self.vocab_size, self.eot_id = base.vocab_size + len(self.special), base.eot_id
        self.special_ids = {s: base.vocab_size + i for i, s in enumerate(self.special)}
        pattern = "(" + "|".join(map(re.escape, self.special)) + ")"
        self._cut = re.compile(pattern) if self.special else None

    def encode(self, text: str) -> list[int]:
        """The special tokens' text as their ids, the rest as the base encodes it."""
        ids = []
        for piece in self._cut.split(text) if self._cut else [text]:
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids += self.base.encode(piece)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        return self.base.encode_ordinary(text)

    def unknown_characters(self, text: str) -> list[str]:
        return self.base.unknown_characters(self._cut.sub("", text) if self._cut else text)

    def decode_tokens_bytes(self, ids: Sequence[int]) -> list[bytes]:
        ids, n = self._ids(ids, f"this {self.vocab_size}-token vocabulary"), self.base.vocab_size
        # the base's ids in one call (GPT-2's 50K ids one by one take seconds)
        base = iter(self.base.decode_tokens_bytes([i for i in ids if i < n]))
        return [self.special[i - n].encode() if i >= n else next(base) for i in ids]

    def to_dict(self) -> dict:
        return {**self.base.to_dict(), "chat": self.chat}

    def describe(self) -> str:
        added = f" ({len(self.special)} tokens added)" if self.special else ""
        return f"{self.base.describe()} with a chat template{added}"


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
    Its pre-tokenizer is GPT-2's, so the text is cut at the same safe places (`find_safe_cut`)."""

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

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_ordinary(self, text: str) -> list[int]:
        return self._ordinary.encode(text, add_special_tokens=False).ids

    def encode_ordinary_numpy(self, text: str) -> np.ndarray:
        """encode_ordinary as uint32, its safe pieces as one batch on every core (`tokenizers` releases the GIL for
        a batch, not for one text)."""
        batch = self._ordinary.encode_batch(split_safe(text), add_special_tokens=False)
        return np.fromiter(itertools.chain.from_iterable(e.ids for e in batch), dtype=np.uint32)

    def decode_tokens_bytes(self, ids: Sequence[int]) -> list[bytes]:
        return [self._bytes[i] for i in self._ids(ids, f"this {self.vocab_size}-token BPE vocabulary")]

    def to_dict(self) -> dict:
        return {"type": "bpe", "vocab_size": self.vocab_size, "json": self.json}

    def describe(self) -> str:
        return f"own BPE ({self.vocab_size:,} tokens)"


def token_bytes(tokenizer: Tokenizer):
    """int64 tensor, per id, of the UTF-8 bytes it stands for (0 for <|endoftext|>): the bits-per-byte divisor."""
    import torch
    n = [len(b) for b in tokenizer.decode_tokens_bytes(range(tokenizer.vocab_size))]  # one call: 50K take seconds
    if tokenizer.eot_id is not None:
        n[tokenizer.eot_id] = 0
    return torch.tensor(n, dtype=torch.int64)


def _base_of(d: dict) -> dict:
    """A description without its chat template: the tokenizer the template is added to."""
    return {k: v for k, v in d.items() if k != "chat"}


def describe_tokenizer(d: dict) -> str:
    """A description's name for messages ("char (65 characters)", "gpt2 BPE", "own BPE (4096 tokens)"), without
    building the tokenizer."""
    kind = d.get("type")
    if isinstance(d.get("chat"), dict):
        return describe_tokenizer(_base_of(d)) + " with a chat template"
    if kind == "char":
        return f"char ({len(d.get('chars', ''))} characters)"
    if kind == "bpe":
        return f"own BPE ({d.get('vocab_size')} tokens)"
    return "gpt2 BPE" if kind == "gpt2" else str(kind or "unknown")


def vocab_size_of(d: dict) -> int:
    """The number of ids of a description, without building the tokenizer."""
    # the special tokens a chat template adds after the base's ids
    if isinstance(d.get("chat"), dict):
        return vocab_size_of(_base_of(d)) + len(d["chat"].get("special", []))
    if d.get("type") == "gpt2":
        from data.sources import GPT2_VOCAB_SIZE
        return GPT2_VOCAB_SIZE
    return int(d.get("vocab_size") or 0) if d.get("type") == "bpe" else len(d.get("chars", ""))


def data_setting(d: dict) -> str:
    """The `data.tokenizer` setting that prepares data with the tokenizer of this description (char, gpt2, bpe)."""
    return str(d.get("type"))


def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Rebuild a tokenizer from `to_dict()` output (checkpoint or meta.json)."""
    kind = d.get("type") if isinstance(d, dict) else None
    if isinstance(d, dict) and isinstance(d.get("chat"), dict):
        return ChatTokenizer(tokenizer_from_dict(_base_of(d)), d["chat"])
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
