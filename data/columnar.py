"""Columnar sources: parquet files (FineWeb shards) and `datasets.Dataset.save_to_disk` directories (Arrow files).

Each row's `text_key` column is one document, read a batch of rows at a time (a parquet row group at most), so
memory stays bounded whatever the file size. pyarrow is optional: imported only when such a source is used.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from common.cli import one_line, setting_error

PARQUET = ".parquet"  # the other kind: .arrow (data/config.py names both)
BATCH_ROWS = 1024  # rows converted to Python strings at a time
_ARROW_FILE_MAGIC = b"ARROW1"  # the Arrow IPC file format (save_to_disk writes the stream format, which lacks it)


def pyarrow_for(path: Path):
    """The pyarrow module, or a one-line ValueError naming `path` and the install command."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 - loads the submodule
    except ImportError:
        raise ValueError(f"{path} is a {'parquet' if path.suffix == PARQUET else 'Arrow'} file: reading it needs "
                         f"pyarrow, which is not installed: pip install pyarrow") from None
    return pyarrow


def saved_dataset(d: Path) -> list[Path] | None:
    """The Arrow files of a `save_to_disk` directory in its order (a DatasetDict: its 'train' split); None when
    `d` is not one."""
    if (d / "dataset_dict.json").is_file():
        splits = _json(d / "dataset_dict.json").get("splits") or []
        if "train" not in splits:
            raise setting_error("{0} is a saved DatasetDict without a 'train' split (it has: {1}): point {path} at "
                                "the split to train on ({path=}{0}/<split>)", d, ", ".join(map(str, splits)))
        d = d / "train"
    elif not (d / "state.json").is_file():
        return None
    files = [d / str(f.get("filename")) for f in _json(d / "state.json").get("_data_files") or []]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"{d} is an incomplete saved dataset ({missing[0].name} listed in state.json is missing): "
                         f"save it again with Dataset.save_to_disk")
    if not files:
        raise ValueError(f"{d} is a saved dataset with no rows: save one with some text")
    return files


def _json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({type(e).__name__}): save the dataset again with "
                         f"Dataset.save_to_disk") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path} is not a datasets metadata file: save the dataset again with Dataset.save_to_disk")
    return obj


def _corrupt(path: Path, e: BaseException) -> ValueError:
    kind = "parquet file" if path.suffix == PARQUET else "Arrow file (as Dataset.save_to_disk writes)"
    msg = one_line(e)
    msg = msg if len(msg) <= 100 else msg[:100] + "..."
    return ValueError(f"{path} is not a readable {kind} ({type(e).__name__}: {msg}): download or write it again, "
                      f"or move it out of the corpus")


class _Reader:
    """The schema and the record batches of one open file, errors from pyarrow turned into one line."""

    def __init__(self, f: BinaryIO, path: Path):
        self.pa, self.path = pyarrow_for(path), path
        try:
            if path.suffix == PARQUET:
                self.pf = self.pa.parquet.ParquetFile(f)
                self.schema, self.rows = self.pf.schema_arrow, self.pf.metadata.num_rows
            else:
                head = f.read(len(_ARROW_FILE_MAGIC))
                f.seek(0)
                ipc = self.pa.ipc.open_file(f) if head == _ARROW_FILE_MAGIC else self.pa.ipc.open_stream(f)
                self.ipc, self.schema, self.rows = ipc, ipc.schema, None  # rows: unknown without reading
        except (self.pa.ArrowException, OSError) as e:
            raise _corrupt(path, e) from None

    def batches(self, columns: list[str]) -> Iterator:
        if self.path.suffix == PARQUET:  # a row group at a time: iter_batches across groups grew Arrow's memory
            it = (b for g in range(self.pf.metadata.num_row_groups)  # with the file (pyarrow 26: 170 MB for 150 MB)
                  for b in self.pf.read_row_group(g, columns=columns, use_threads=False).to_batches(BATCH_ROWS))
        elif isinstance(self.ipc, self.pa.ipc.RecordBatchFileReader):
            it = (self.ipc.get_batch(i) for i in range(self.ipc.num_record_batches))
        else:
            it = iter(self.ipc)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except (self.pa.ArrowException, OSError) as e:
                raise _corrupt(self.path, e) from None
            yield batch

    def text_column(self, key: str) -> None:
        """Check that column `key` exists and holds strings (one line naming what there is otherwise)."""
        names = self.schema.names
        if key not in names:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise setting_error("{0}: set {text_key=}<the column that holds the text>",
                                f"{self.path} has no column {key!r} (it has: {shown})")
        t, types = self.schema.field(key).type, self.pa.types
        value = t.value_type if types.is_dictionary(t) else t
        if types.is_null(value):
            raise setting_error("{0}: set {text_key=}<the column that holds the text>",
                                f"{self.path}: its column {key!r} holds only nulls (no text)")
        if not any(f(value) for f in (types.is_string, types.is_large_string, types.is_string_view,
                                      types.is_binary, types.is_large_binary, types.is_binary_view)):
            raise setting_error("{0}: set {text_key=}<a column of strings>",
                                f"{self.path}: its column {key!r} holds {t}, not strings")


def check(f: BinaryIO, path: Path, key: str) -> bool:
    """Check the file's text column (one-line ValueError); whether it has any rows."""
    r = _Reader(f, path)
    r.text_column(key)
    if r.rows is not None:
        return r.rows > 0
    return any(b.num_rows for b in r.batches([key]))


def _texts(pa, col, path: Path, key: str, errors: str, first_row: int) -> list:
    """The column's values as str (None for nulls); bytes (a binary column, or strings that are not UTF-8, which
    parquet readers do not check) are decoded as UTF-8 with `errors`."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type) or pa.types.is_binary_view(col.type)):
        try:
            return col.to_pylist()
        except UnicodeDecodeError:
            pass
    out = []
    for i, b in enumerate(col.cast(pa.large_binary()).to_pylist()):
        try:
            out.append(None if b is None else b.decode("utf-8", errors=errors))
        except UnicodeDecodeError as e:
            raise setting_error("{0}: write it again as UTF-8, or set {encoding_errors=}replace",
                                f"{path} row {first_row + i:,} is not valid UTF-8 in column {key!r} ({e.reason})"
                                ) from None
    return out


def documents(f: BinaryIO, path: Path, key: str, errors: str, advance: Callable[[int], None]) -> Iterator[tuple[str]]:
    """The text of each row (null and empty texts skipped) as 1-chunk documents; `advance(n)` moves the progress
    on by about n of the file's bytes per batch read."""
    r = _Reader(f, path)
    r.text_column(key)
    size, done, row = path.stat().st_size, 0, 0
    for batch in r.batches([key]):
        for text in _texts(r.pa, batch.column(key), path, key, errors, row):
            if text:
                yield (text,)
        row += batch.num_rows
        now = f.tell() if r.rows is None else size * row // max(r.rows, 1)  # a stream is read front to back
        if now > done:
            advance(now - done)
            done = now
