"""The text to prepare: which files, their content hash (the cache key), and their documents, streamed.

Each text file is one document, each line of a .jsonl file another, each row of a parquet / Arrow file another
(data/columnar.py); `read_text` yields None between two. Decoding is exact UTF-8 in bounded chunks, so any file
size fits in memory: docs/design.md (Data).
"""
from __future__ import annotations

import codecs
import collections
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from common.text import setting_error
from data import columnar, sources
from data.config import DataConfig

CHUNK_BYTES = 4 << 20  # bytes read and decoded at a time
HASH_BLOCK = 1 << 20
SUFFIXES = (".txt", ".jsonl", *columnar.SUFFIXES)  # what a directory contributes


@dataclass
class Corpus:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory or a list (part of the hash), else None
    display: str  # as the user gave it (messages)
    abspath: str  # absolute (meta.json)
    nbytes: int
    given: str | None  # the path setting as given, for messages ("a.txt", "[a.txt,b.txt]"); None: the download
    text_key: str  # the field of a .jsonl line, or the column of a parquet / Arrow file, that holds the text

    @property
    def keyed(self) -> bool:  # whether `text_key` picks the text (part of the cache key then)
        return any(f.suffix in (".jsonl", *columnar.SUFFIXES) for f in self.files)


    @property
    def documents(self) -> bool:  # whether the text can hold more than one document
        return len(self.files) > 1 or self.keyed


def _expand(given: str) -> tuple[list[Path], list[str] | None]:
    """One `path` entry: a file; a `datasets` save_to_disk directory (its Arrow files); or every .txt, .jsonl,
    .parquet and .arrow file under a directory, sorted by relative path (other files are left out)."""
    p = Path(os.path.expanduser(given))
    if not p.exists():
        raise setting_error("{path=}{0} does not exist (looked at {1}): give an existing text file or a directory "
                            "of .txt, .jsonl or .parquet files", given, p.absolute(), cls=FileNotFoundError)
    if not p.is_dir():
        return [p], None
    files = columnar.saved_dataset(p)
    if files is None:
        found = [f for f in p.rglob("*") if f.is_file()]
        files = sorted((f for f in found if f.suffix in SUFFIXES), key=lambda f: f.relative_to(p).as_posix())
        if not files:
            kinds = collections.Counter(f.suffix or "(no suffix)" for f in found)
            has = ", ".join(f"{n} {k}" for k, n in kinds.most_common(6)) or "no files"
            raise setting_error("directory {0} has no .txt files (nor .jsonl, .parquet or a datasets save_to_disk "
                                "directory; it has {1}): convert your text to one of these, or point {path} at a "
                                "single text file", p, has)
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
    src = Corpus(files, names, display, abspath, sum(f.stat().st_size for f in files), shown, cfg.text_key)
    if not any([_has_text(src, f) for f in files]):  # a list: every columnar file is checked
        what = f"all {len(files)} files of {display} are empty" if names else f"{display} is empty"
        rows = " (no rows)" if all(f.suffix in columnar.SUFFIXES for f in files) else ""
        raise ValueError(f"{what}{rows}: give a text file with some content")
    return src


def _has_text(src: Corpus, path: Path) -> bool:
    """Whether the file holds anything; a parquet / Arrow file's text column is checked (one line if wrong)."""
    if path.suffix not in columnar.SUFFIXES:
        return path.stat().st_size > 0
    with _open(src, path) as f:
        return columnar.check(f, path, src.text_key)


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


def _hash_rest(f, hasher) -> None:
    while block := f.read(HASH_BLOCK):
        hasher.update(block)


def sha256(src: Corpus) -> str:
    """For one file exactly `sha256sum file`; for a directory, over names, sizes and contents (parquet and Arrow
    files too: their bytes, as for text)."""
    h = hashlib.sha256()
    for i, f in enumerate(src.files):
        h.update(_file_header(src, i))
        with _open(src, f) as fh:
            _hash_rest(fh, h)
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


def _json_kind(value) -> str:
    """How a JSON value is called: "a number (int)", "null", "a list" ..."""
    if value is None:
        return "null"
    kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return f"{kind.get(type(value), 'a value')} ({type(value).__name__})"


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
            if isinstance(obj, dict) and key in obj:
                what = f": its {key!r} is {_json_kind(text)}, not a string"
            else:
                fields = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
                what = f" has no text under {key!r} (it has: {fields})"
            raise setting_error("{0}: set {text_key=}<the field that holds the text>", f"{path} line {lineno}{what}")
        if text:
            yield (text,)


def read_text(src: Corpus, errors: str, hasher=None, bar=None) -> Iterator[str | None]:
    """The decoded text in chunks, None between two documents, feeding `hasher` (as `sha256`) and `bar` the bytes."""
    unshown, started = 0, False  # bytes read but not yet on the bar; whether a document has begun

    def advance(n: int) -> None:
        nonlocal unshown
        unshown += n
        if bar is not None and unshown >= HASH_BLOCK:
            bar.update(unshown)
            unshown = 0

    def feed(block: bytes) -> None:
        if hasher is not None:
            hasher.update(block)
        advance(len(block))

    for i, path in enumerate(src.files):
        if hasher is not None:
            hasher.update(_file_header(src, i))
        with _open(src, path) as f:
            columns = path.suffix in columnar.SUFFIXES
            if columns:
                docs = columnar.documents(f, path, src.text_key, errors, advance)
            elif path.suffix == ".jsonl":
                docs = _jsonl_documents(f, path, errors, src.text_key, feed)
            else:
                docs = [_text_chunks(f, path, errors, feed)]
            for doc in docs:
                for j, text in enumerate(doc):
                    if j == 0 and started:
                        yield None
                    started = True
                    yield text
            if columns and hasher is not None:  # pyarrow read the file out of order: its bytes, from the same handle
                f.seek(0)
                _hash_rest(f, hasher)
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
