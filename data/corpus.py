"""The text to prepare: which files, their content hash (the cache key), and their characters, streamed.

Decoding is exact UTF-8 in bounded chunks (no newline translation), so any file size fits in memory, and a
bad byte under encoding_errors=strict is reported with its file and byte offset.
"""
from __future__ import annotations

import codecs
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from data import sources
from data.config import DataConfig

CHUNK_BYTES = 4 << 20  # bytes read and decoded at a time
HASH_BLOCK = 1 << 20


@dataclass
class Corpus:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory (part of the hash), else None
    display: str  # as the user gave it (messages)
    abspath: str  # absolute (meta.json)
    nbytes: int


def resolve(cfg: DataConfig) -> Corpus:
    """data.path (one file, or every *.txt under a directory sorted by relative path), else Tiny Shakespeare."""
    if cfg.path:
        p = Path(os.path.expanduser(str(cfg.path)))
        if not p.exists():
            raise FileNotFoundError(f"data.path={cfg.path} does not exist (looked at {p.absolute()}): give an "
                                    f"existing text file or a directory of .txt files")
        if p.is_dir():
            files = sorted((f for f in p.rglob("*.txt") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
            if not files:
                raise ValueError(f"directory {p} has no .txt files: put your text in files ending in .txt, or "
                                 f"point data.path at a single file")
            names = [f.relative_to(p).as_posix() for f in files]
        else:
            files, names = [p], None
    else:  # the Shakespeare presets without a local copy: cache / download
        p = sources.shakespeare_path()
        files, names = [p], None
    nbytes = sum(f.stat().st_size for f in files)
    if nbytes == 0:
        what = f"all {len(files)} .txt files in {p} are empty" if names else f"{p} is empty"
        raise ValueError(f"{what}: give a text file with some content")
    return Corpus(files, names, str(p), str(p.absolute()), nbytes)


def _file_header(src: Corpus, i: int) -> bytes:
    return b"" if src.names is None else f"{src.names[i]}\0{src.files[i].stat().st_size}\0".encode()


def sha256(src: Corpus) -> str:
    """For one file exactly `sha256sum file`; for a directory, over names, sizes and contents."""
    h = hashlib.sha256()
    for i, f in enumerate(src.files):
        h.update(_file_header(src, i))
        with open(f, "rb") as fh:
            while block := fh.read(HASH_BLOCK):
                h.update(block)
    return h.hexdigest()


def read_text(src: Corpus, errors: str, hasher=None, bar=None) -> Iterator[str]:
    """The decoded text in chunks (each file on its own), feeding `hasher` (as `sha256`) and `bar` the bytes."""
    for i, path in enumerate(src.files):
        if hasher is not None:
            hasher.update(_file_header(src, i))
        dec = codecs.getincrementaldecoder("utf-8")(errors=errors)
        offset = 0
        with open(path, "rb") as f:
            while True:
                block = f.read(CHUNK_BYTES)
                final = not block
                pending = len(dec.getstate()[0])
                try:
                    text = dec.decode(block, final=final)
                except UnicodeDecodeError as e:
                    bad = e.object[e.start:e.start + 1]
                    what = f"byte 0x{bad.hex()}" if bad else "an incomplete character at the end"
                    raise ValueError(f"{path} is not valid UTF-8: {what} at byte offset {offset - pending + e.start:,}"
                                     f" ({e.reason}): re-save the file as UTF-8, or set data.encoding_errors=replace "
                                     f"to turn undecodable bytes into U+FFFD") from None
                offset += len(block)
                if hasher is not None:
                    hasher.update(block)
                if bar is not None:
                    bar.update(len(block))
                if text:
                    yield text
                if final:
                    break


def blocks(text: str, size: int = 1 << 18) -> Iterator[str]:
    """Slices of at most `size` characters (keeps the 4-byte-per-character temporaries small)."""
    for i in range(0, len(text), size):
        yield text[i:i + size]


def scan(src: Corpus, errors: str, want_vocab: bool) -> tuple[int, list[str]]:
    """The number of characters and (if `want_vocab`) the sorted set of characters."""
    n = 0
    seen = np.zeros(0x110000, dtype=bool) if want_vocab else None
    for text in read_text(src, errors):
        n += len(text)
        if seen is not None:
            for part in blocks(text):
                seen[np.frombuffer(part.encode("utf-32-le"), dtype="<u4")] = True
    return n, [chr(c) for c in np.flatnonzero(seen)] if seen is not None else []
