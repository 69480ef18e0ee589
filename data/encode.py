"""Streamed encoding of the corpus into the train/val token shards, in bounded memory: char-level through a lookup
table; BPE cut only where GPT-2's pre-tokenizer always splits (`find_safe_cut`), the pieces encoded on a thread pool.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np

from common.platform import usable_cores
from data.corpus import blocks
from data.loader import dtype_for_vocab
from data.shards import ShardWriter, skip_chars
from data.safe_cut import find_safe_cut
from data.tokenizer import CharTokenizer, Tokenizer

SEGMENT_CHARS = 1 << 19  # characters per BPE work item
MAX_CARRY_CHARS = 32 << 20  # if no safe BPE boundary shows up in this much text, cut anyway (noted)


class _Cutter:
    """Cuts a stream of text into BPE work items at safe boundaries; `forced` counts cuts made without one."""

    def __init__(self, note: Callable[[str], None]):
        self.seg, self.max_carry, self.note = SEGMENT_CHARS, MAX_CARRY_CHARS, note
        self.forced = 0

    def pieces(self, buf: str, final: bool) -> tuple[list[str], str]:
        """The work items ready in `buf`, and the rest to carry over (all of it goes out when `final`)."""
        out, start, n = [], 0, len(buf)
        while n - start > self.seg:
            cut = find_safe_cut(buf, start + self.seg // 2, start + self.seg)
            if cut < 0:
                cut = find_safe_cut(buf, start + self.seg + 1, n - 1)
            if cut < 0:
                if final:
                    break
                if n - start <= self.max_carry:
                    return out, buf[start:]  # wait for more text
                cut = start + self.seg
                self.forced += 1
                if self.forced == 1:
                    self.note(f"note: no GPT-2 piece boundary in {self.max_carry:,} characters; cutting there "
                              f"anyway (tokens at such cuts may differ from encoding the text in one go)")
            out.append(buf[start:cut])
            start = cut
        if final:
            return out + ([buf[start:]] if start < n else []), ""
        return out, buf[start:]


def _split_stream(texts: Iterator[str | None], n_train: int) -> Iterator[tuple[str, str | None, bool]]:
    """(split, text, last_of_split) with the train part ending exactly at character n_train; a document boundary
    (None) goes to the split it falls in (val when it falls exactly at the split point)."""
    remaining = n_train
    for text in texts:
        if text is None:
            yield ("train" if remaining > 0 else "val"), None, False
            continue
        if remaining > 0:
            head = text[:remaining]
            remaining -= len(head)
            yield "train", head, remaining == 0
            text = text[len(head):]
        if text:
            yield "val", text, False
    yield "val", "", True


def threads() -> int:
    """Encoder threads: the CPUs this process may use, at most 16."""
    return max(1, min(usable_cores(), 16))


def encode_char(texts, n_train: int, tok: CharTokenizer, sink: ShardWriter, changed_error: Callable[[], Exception],
                start: int = 0):
    """`changed_error()` is raised for a character missing from `tok` (the text changed since it was scanned)."""
    table = tok.code_table().astype(np.int32)
    dtype = dtype_for_vocab(tok.vocab_size)
    for split, text, _ in skip_chars(_split_stream(texts, n_train), start):
        for part in blocks(text or "", min(1 << 18, sink.shard_tokens)):  # no separator between documents
            cps = np.frombuffer(part.encode("utf-32-le"), dtype="<u4")
            try:
                ids = table[cps]
            except IndexError:
                raise changed_error() from None
            if ids.min() < 0:
                raise changed_error()
            sink.write(split, ids.astype(dtype), len(part))


def encode_bpe(texts, n_train: int, tok: Tokenizer, sink: ShardWriter, note: Callable[[str], None],
               start: int = 0) -> int:
    """<|endoftext|> between documents, as nanoGPT does; the first `start` characters were written by an earlier
    run. Returns the number of forced (not provably safe) cuts."""
    encode = tok.encode_ordinary_numpy
    n_threads = threads()
    cutter = _Cutter(note)
    inflight: collections.deque = collections.deque()
    with ThreadPoolExecutor(n_threads, thread_name_prefix="bpe") as pool:
        def drain(limit):
            while len(inflight) > limit:
                split, ids, chars = inflight.popleft()
                sink.write(split, ids if isinstance(ids, np.ndarray) else ids.result(), chars)

        buf, cur, eot = "", "train", np.array([tok.eot_id], dtype=np.uint32)
        for split, text, last in skip_chars(_split_stream(texts, n_train), start):
            if split != cur:  # the train part has been flushed (last=True) before val starts
                cur, buf = split, ""
            pieces, buf = cutter.pieces(buf + (text or ""), final=last or text is None)
            for p in pieces:
                inflight.append((split, pool.submit(encode, p), len(p)))
                drain(2 * n_threads)
            if text is None:  # a document ends here (its pieces are in flight): the separator follows
                inflight.append((split, eot, 0))
        drain(0)
    return cutter.forced
