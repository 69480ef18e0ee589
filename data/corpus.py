"""The text to prepare: which files, their content hash (the cache key), and their documents, streamed.

Each text file is one document, each line of a .jsonl file another; `read_text` yields None between two.
Decoding is exact UTF-8 in bounded chunks, so any file size fits in memory: docs/design.md (Data).
"""
from __future__ import annotations

import codecs
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from common.text import setting_error
from data import sources
from data.config import DataConfig

CHUNK_BYTES = 4 << 20  # bytes read and decoded at a time
HASH_BLOCK = 1 << 20
SUFFIXES = (".txt", ".jsonl")  # what a directory contributes


@dataclass
class Corpus:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory or a list (part of the hash), else None
    display: str  # as the user gave it (messages)
    abspath: str  # absolute (meta.json)
    nbytes: int
    given: str | None  # the path setting as given, for messages ("a.txt", "[a.txt,b.txt]"); None: the download
    text_key: str  # the field of a .jsonl line that holds its text

    @property
    def jsonl(self) -> bool:
        return any(f.suffix == ".jsonl" for f in self.files)

    @property
    def documents(self) -> bool:  # whether the text can hold more than one document
        return len(self.files) > 1 or self.jsonl


def _expand(given: str) -> tuple[list[Path], list[str] | None]:
    """One `path` entry: a file, or every .txt / .jsonl under a directory sorted by relative path."""
    p = Path(os.path.expanduser(given))
    if not p.exists():
        raise setting_error("{path=}{0} does not exist (looked at {1}): give an existing text file or a directory "
                            "of .txt files", given, p.absolute(), cls=FileNotFoundError)
    if not p.is_dir():
        return [p], None
    files = sorted((f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file()),
                   key=lambda f: f.relative_to(p).as_posix())
    if not files:
        raise setting_error("directory {0} has no .txt files (nor .jsonl): put your text in files ending in .txt, "
                            "or point {path} at a single file", p)
    return files, [f.relative_to(p).as_posix() for f in files]


def resolve(cfg: DataConfig) -> Corpus:
    """`path` (one or several files or directories), else Tiny Shakespeare (cached or downloaded)."""
    given = cfg.paths()
    if len(given) == 1:
        files, names = _expand(given[0])
        p = Path(os.path.expanduser(given[0]))
        display, abspath, shown = str(p), str(p.absolute()), given[0]
    elif given:  # several: their files in order, each name prefixed by its entry's position
        files, names = [], []
        for i, g in enumerate(given):
            f, n = _expand(g)
            files += f
            names += [f"{i}:{x}" for x in (n or [f[0].name])]
        display, shown = ", ".join(given), f"[{','.join(given)}]"
        abspath = ", ".join(str(Path(os.path.expanduser(g)).absolute()) for g in given)
    else:  # the Shakespeare presets without a local copy: cache / download
        p = sources.shakespeare_path()
        files, names, display, abspath, shown = [p], None, str(p), str(p.absolute()), None
    nbytes = sum(f.stat().st_size for f in files)
    if nbytes == 0:
        what = f"all {len(files)} files of {display} are empty" if names else f"{display} is empty"
        raise ValueError(f"{what}: give a text file with some content")
    return Corpus(files, names, display, abspath, nbytes, shown, cfg.text_key)


def _open(src: Corpus, path: Path):
    try:
        return open(path, "rb")
    except OSError as e:
        denied = isinstance(e, PermissionError)
        where = "" if str(path) == src.display else f": {path}"
        shown = "{0}" if src.given is None else "{path=}{0}"
        raise setting_error(shown + " cannot be read ({1}): {2} or give another file", src.given or src.display,
                            f"{'permission denied' if denied else e.strerror or e}{where}",
                            "check its permissions" if denied else "check the file", cls=type(e)) from None


def _file_header(src: Corpus, i: int) -> bytes:
    return b"" if src.names is None else f"{src.names[i]}\0{src.files[i].stat().st_size}\0".encode()


def sha256(src: Corpus) -> str:
    """For one file exactly `sha256sum file`; for a directory, over names, sizes and contents."""
    h = hashlib.sha256()
    for i, f in enumerate(src.files):
        h.update(_file_header(src, i))
        with _open(src, f) as fh:
            while block := fh.read(HASH_BLOCK):
                h.update(block)
    return h.hexdigest()


def _text_chunks(f, path: Path, errors: str, feed) -> Iterator[str]:
    dec = codecs.getincrementaldecoder("utf-8")(errors=errors)
    offset = 0
    while True:
        block = f.read(CHUNK_BYTES)
        final = not block
        pending = len(dec.getstate()[0])
        try:
            text = dec.decode(block, final=final)
        except UnicodeDecodeError as e:
            bad = e.object[e.start:e.start + 1]
            what = f"byte 0x{bad.hex()}" if bad else "an incomplete character at the end"
            raise setting_error("{0}: re-save the file as UTF-8, or set {encoding_errors=}replace to turn undecodable "
                                "bytes into U+FFFD", f"{path} is not valid UTF-8: {what} at byte offset "
                                f"{offset - pending + e.start:,} ({e.reason})") from None
        offset += len(block)
        feed(block)
        if text:
            yield text
        if final:
            return


def _jsonl_documents(f, path: Path, errors: str, key: str, feed) -> Iterator[tuple[str]]:
    """The text of each line of a .jsonl file (blank lines and empty texts skipped), as 1-chunk documents."""
    for lineno, line in enumerate(f, 1):
        feed(line)
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8-sig" if lineno == 1 else "utf-8", errors=errors))
        except UnicodeDecodeError as e:
            raise setting_error("{0} line {1} is not valid UTF-8 ({2}): re-save the file as UTF-8, or set "
                                "{encoding_errors=}replace", path, lineno, e.reason) from None
        except ValueError as e:
            raise ValueError(f"{path} line {lineno} is not JSON ({e.__class__.__name__}: {str(e)[:80]}): a .jsonl "
                             f"file holds one JSON object per line") from None
        text = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            fields = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
            raise setting_error("{0}: set {text_key=}<the field that holds the text>",
                                f"{path} line {lineno} has no text under {key!r} (it has: {fields})")
        if text:
            yield (text,)


def read_text(src: Corpus, errors: str, hasher=None, bar=None) -> Iterator[str | None]:
    """The decoded text in chunks, None between two documents, feeding `hasher` (as `sha256`) and `bar` the bytes."""
    unshown, started = 0, False  # bytes read but not yet on the bar; whether a document has begun

    def feed(block: bytes) -> None:
        nonlocal unshown
        if hasher is not None:
            hasher.update(block)
        unshown += len(block)
        if bar is not None and unshown >= HASH_BLOCK:
            bar.update(unshown)
            unshown = 0

    for i, path in enumerate(src.files):
        if hasher is not None:
            hasher.update(_file_header(src, i))
        with _open(src, path) as f:
            docs = (_jsonl_documents(f, path, errors, src.text_key, feed) if path.suffix == ".jsonl"
                    else [_text_chunks(f, path, errors, feed)])
            for doc in docs:
                for j, text in enumerate(doc):
                    if j == 0 and started:
                        yield None
                    started = True
                    yield text
    if bar is not None:
        bar.update(unshown)


def blocks(text: str, size: int = 1 << 18) -> Iterator[str]:
    """Slices of at most `size` characters (keeps the 4-byte-per-character temporaries small)."""
    for i in range(0, len(text), size):
        yield text[i:i + size]


def scan(src: Corpus, errors: str, want_vocab: bool) -> tuple[int, list[str]]:
    """The number of characters and (if `want_vocab`) the sorted set of characters."""
    n = 0
    seen = np.zeros(0x110000, dtype=bool) if want_vocab else None
    for text in read_text(src, errors):
        if text is None:
            continue
        n += len(text)
        if seen is not None:
            for part in blocks(text):
                seen[np.frombuffer(part.encode("utf-32-le"), dtype="<u4")] = True
    return n, [chr(c) for c in np.flatnonzero(seen)] if seen is not None else []
