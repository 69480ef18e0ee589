"""The corpus's text, streamed: each text file is one document, each line of a .jsonl file another, each record of
a .json array, each row of a .csv file or of a parquet / Arrow file another (data/columnar.py); `read_text` yields None between two. Decoding is exact UTF-8 in
bounded chunks, so any file size fits in memory: docs/design.md (Data). Which files, and their hash: data/config.py.
"""
from __future__ import annotations

import codecs
import csv
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from common.cli import setting_error
from data.config import BLOCK, Corpus
from data.formats import file_format

CHUNK_BYTES = 4 << 20  # bytes read and decoded at a time
csv.field_size_limit(2**31 - 1)  # a document in one cell may be long (the default limit is 128 KiB)


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


def _text_of(obj, key: str, where: str) -> str:
    """A JSON record's text under `key`, or a one-line ValueError naming `where` and what the record holds."""
    text = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(text, str):
        if isinstance(obj, dict) and key in obj:
            what = f": its {key!r} is {_json_kind(text)}, not a string"
        else:
            fields = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
            what = f" has no text under {key!r} (it has: {fields})"
        raise setting_error("{0}: set {text_key=}<the field that holds the text>", f"{where}{what}")
    return text


def _lines(f, path: Path, errors: str, feed) -> Iterator[str]:
    """The decoded lines of a file (a UTF-8 BOM dropped), feeding `feed` their bytes."""
    for lineno, line in enumerate(f, 1):
        feed(line)
        try:
            yield line.decode("utf-8-sig" if lineno == 1 else "utf-8", errors=errors)
        except UnicodeDecodeError as e:
            raise setting_error("{0} line {1} is not valid UTF-8 ({2}): re-save the file as UTF-8, or set "
                                "{encoding_errors=}replace", path, lineno, e.reason) from None


def _jsonl_documents(f, path: Path, errors: str, key: str, feed) -> Iterator[tuple[str]]:
    """The text of each line of a .jsonl file (blank lines and empty texts skipped), as 1-chunk documents."""
    for lineno, line in enumerate(_lines(f, path, errors, feed), 1):
        if line.strip():
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path} line {lineno} is not JSON ({e.__class__.__name__}: {str(e)[:80]}): a "
                                 f".jsonl file holds one JSON object per line") from None
            if text := _text_of(obj, key, f"{path} line {lineno}"):
                yield (text,)


def _json_documents(f, path: Path, errors: str, key: str, feed) -> Iterator[tuple[str]]:
    """The text of each record of a .json file holding one array of objects (read whole)."""
    try:
        records = json.loads("".join(_lines(f, path, errors, feed)))
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e.__class__.__name__}: {str(e)[:80]}): give a JSON array of "
                         f"records, or a .jsonl file with one JSON object per line") from None
    if path.name in ("state.json", "dataset_dict.json", "dataset_info.json"):
        raise setting_error("{0} is the metadata of a saved dataset, not text: point {path} at its directory "
                            "({path=}{1})", path, path.parent)
    if not isinstance(records, list):
        raise setting_error("{0} holds {1}, not an array of records: give a JSON array of objects with the text "
                            "under {text_key} (or a .jsonl file)", path, _json_kind(records))
    for i, obj in enumerate(records):
        if text := _text_of(obj, key, f"{path} record {i:,}"):
            yield (text,)


def _csv_documents(f, path: Path, errors: str, key: str, feed) -> Iterator[tuple[str]]:
    """The `key` column of each row of a .csv file whose first row names the columns."""
    rows = csv.reader(_lines(f, path, errors, feed))
    try:
        header = next(rows, None)
        if header is not None and key not in header:
            shown = ", ".join(header[:8]) + (", ..." if len(header) > 8 else "")
            raise setting_error("{0}: set {text_key=}<the column that holds the text>",
                                f"{path} has no column {key!r} in its header row (it has: {shown})")
        col = header.index(key) if header else 0
        for row in rows:
            if len(row) > col and row[col]:
                yield (row[col],)
    except csv.Error as e:
        raise ValueError(f"{path} line {rows.line_num:,} is not CSV ({e}): write it again with a csv writer, "
                         f"or as .jsonl") from None


READERS = {"jsonl": _jsonl_documents, "json": _json_documents, "csv": _csv_documents}  # data.formats' kinds


def read_text(src: Corpus, errors: str, hasher=None, bar=None) -> Iterator[str | None]:
    """The decoded text in chunks, None between two documents, feeding `hasher` (as `sha256`) and `bar` the bytes."""
    unshown, started = 0, False  # bytes read but not yet on the bar; whether a document has begun

    def advance(n: int) -> None:
        nonlocal unshown
        unshown += n
        if bar is not None and unshown >= BLOCK:
            bar.update(unshown)
            unshown = 0

    def feed(block: bytes) -> None:
        if hasher is not None:
            hasher.update(block)
        advance(len(block))

    for i, path in enumerate(src.files):
        if hasher is not None:
            hasher.update(src.header(i))
        with src.open(path) as f:
            kind = file_format(path)
            columns = kind == "columnar"
            if columns:
                from data.columnar import documents  # pyarrow: only for these files
                docs = documents(f, path, src.text_key, errors, advance)
            elif kind in READERS:
                docs = READERS[kind](f, path, errors, src.text_key, feed)
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
                src.hash_rest(f, hasher)
    if bar is not None:
        bar.update(unshown)


def blocks(text: str, size: int = 1 << 18) -> Iterator[str]:
    """Slices of at most `size` characters (keeps the 4-byte-per-character temporaries small)."""
    for i in range(0, len(text), size):
        yield text[i:i + size]


def scan(src: Corpus, errors: str, want_vocab: bool, sample_bytes: int = 0) -> tuple[int, list[str], list[str]]:
    """The number of characters, (if `want_vocab`) the sorted set of characters, and the first `sample_bytes`
    bytes (UTF-8) of the text in its pieces, which the own BPE learns from (data/bpe.py): one read for all three."""
    n, pieces, left = 0, [], sample_bytes
    seen = np.zeros(0x110000, dtype=bool) if want_vocab else None
    for text in read_text(src, errors):
        if text is None:
            continue
        n += len(text)
        if left > 0:
            raw = text.encode("utf-8", errors="surrogatepass")[:left]
            pieces.append(raw.decode("utf-8", errors="ignore"))  # a character cut by the byte limit is dropped
            left -= len(raw)
        if seen is not None:
            for part in blocks(text):
                seen[np.frombuffer(part.encode("utf-32-le"), dtype="<u4")] = True
    return n, [chr(c) for c in np.flatnonzero(seen)] if seen is not None else [], pieces
