"""Token shards written: `TokenWriter` (one token file) and `ShardWriter` (a split as numbered files, read back by
data/loader.py's `TokenShards`). A shard closes between pieces of text and `progress.json` records where it ended,
so a killed preparation continues from the last closed shard.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from common.files import fsync_dir, write_text_atomic
from data.loader import HEADER, TokenFile, dtype_for_vocab, header

PROGRESS = "progress.json"


class TokenWriter:
    """Append-only writer of the token file format; `close()` finalizes, `discard()` drops an unfinished file."""

    def __init__(self, path: str | os.PathLike, vocab_size: int):
        self.path = Path(path)
        self.vocab_size = int(vocab_size)
        self.dtype = dtype_for_vocab(vocab_size)
        self.count = 0
        self._f = open(self.path, "wb")
        self._f.write(b"\0" * HEADER.size)  # placeholder: an unfinished file never has valid magic

    def write(self, ids) -> None:
        arr = np.asarray(ids)
        if arr.size == 0:
            return
        if arr.dtype != self.dtype:
            assert arr.min() >= 0 and arr.max() < self.vocab_size, "token id outside the vocabulary"
            arr = arr.astype(self.dtype)
        self._f.write(np.ascontiguousarray(arr).data)
        self.count += int(arr.size)

    def close(self) -> None:
        if self._f.closed:
            return
        self._f.seek(0)
        self._f.write(header(self.dtype, self.count, self.vocab_size))
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()

    def discard(self) -> None:
        """Close and delete an unfinished file."""
        self._f.close()
        self.path.unlink(missing_ok=True)


def shard_name(split: str, i: int) -> str:
    return f"{split}-{i:05d}.bin"


class ShardWriter:
    """Writes the splits of `directory` as shards of at least `shard_tokens` tokens, in order, resumable.

    `write(split, ids, chars)`: `chars` is how many characters of the corpus `ids` encode (0 for a separator); a
    shard is closed after a write with chars > 0 once it is full, and when the split changes. `done` lists the
    closed shards (as in progress.json); `chars` is where a continued preparation starts reading."""

    def __init__(self, directory: Path, vocab_size: int, shard_tokens: int, head: dict):
        self.dir, self.vocab_size, self.shard_tokens, self.head = directory, vocab_size, shard_tokens, head
        self.done: list[dict] = []
        self.chars = 0
        self._w: TokenWriter | None = None
        self._split: str | None = None

    def resume(self) -> int:
        """Keep the closed shards of an earlier run in `dir` (when its progress.json has our `head`); remove any
        other shard file. Returns the characters to skip."""
        try:
            saved = json.loads((self.dir / PROGRESS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        if saved.get("head") == self.head:
            for s in saved["shards"]:
                try:
                    if len(TokenFile(self.dir / s["file"])) != s["tokens"]:
                        break
                except (OSError, ValueError):
                    break
                self.done.append(s)
        self.chars = self.done[-1]["end_chars"] if self.done else 0
        keep = {s["file"] for s in self.done}
        for f in self.dir.glob("*.bin"):
            if f.name not in keep:
                f.unlink()
        self._save()
        return self.chars

    def count(self, split: str) -> int:
        return sum(s["tokens"] for s in self.done if s["split"] == split) + \
            (self._w.count if self._w is not None and self._split == split else 0)

    def files(self, split: str) -> list[str]:
        return [s["file"] for s in self.done if s["split"] == split]

    def write(self, split: str, ids, chars: int) -> None:
        if split != self._split:
            self._close()
        if self._w is None:
            self._split = split
            self._w = TokenWriter(self.dir / shard_name(split, len(self.files(split))), self.vocab_size)
        self._w.write(ids)
        self.chars += chars
        if chars and self._w.count >= self.shard_tokens:
            self._close()

    def finish(self, splits=("train", "val")) -> None:
        """Close the last shard; a split with no tokens gets one empty shard (the loader names its size)."""
        self._close()
        for split in splits:
            if not self.files(split):
                self.write(split, np.empty(0, np.uint32), 0)
                self._close()

    def _close(self) -> None:
        if self._w is None:
            return
        self._w.close()  # fsynced
        self.done.append({"split": self._split, "file": self._w.path.name, "tokens": self._w.count,
                          "end_chars": self.chars})
        self._w, self._split = None, None
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.dir / PROGRESS, json.dumps({"head": self.head, "shards": self.done}) + "\n")
        fsync_dir(self.dir)

    def abandon(self) -> None:
        """After an error or interrupt: drop the open (unfinished) shard, keep the closed ones."""
        if self._w is not None:
            self._w.discard()
            self._w = None


def skip_chars(stream: Iterator[tuple[str, str | None, bool]], chars: int):
    """`_split_stream` items after the first `chars` characters; separators before that point are dropped (a
    shard never closes between text and the separator that follows it, so those were written)."""
    for split, text, last in stream:
        if chars > 0:
            if text is None:
                continue
            if len(text) <= chars:
                chars -= len(text)
                continue
            text, chars = text[chars:], 0
        yield split, text, last


def saved_head(directory: Path) -> dict:
    """The `head` an earlier run wrote into `directory`'s progress.json ({} when none)."""
    try:
        head = json.loads((directory / PROGRESS).read_text(encoding="utf-8"))["head"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return head if isinstance(head, dict) else {}
