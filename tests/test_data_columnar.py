"""data/columnar.py: parquet files and directories, datasets.save_to_disk directories, a row = a document,
bounded memory, the cache key, bad columnar input, pyarrow missing, and a training run on parquet shards."""
from __future__ import annotations

import json
import sys

import pytest

from data.config import DataConfig, resolve
from data.prepare import prepare
from tests.test_data_corpus import _check_gpt2
from tests.test_data_prepare import one_line_error, small_chunks, tokens

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [{"id": 1, "text": "Hello world."}, {"id": 2, "text": "Second 😀 doc\nwith lines"}, {"id": 3, "text": ""},
        {"id": 4, "text": None}, {"id": 5, "text": "third " * 40}, {"id": 6, "text": "The end, 你好.\n"}]


def write_parquet(path, rows, row_group_size=2, **columns):
    table = pa.Table.from_pylist(rows) if rows else pa.table(columns)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def text_of(p):
    return p.tokenizer.decode(tokens(p.train_path).tolist() + tokens(p.val_path).tolist())


def test_parquet_rows_are_documents(tmp_path, cache_with_gpt2, monkeypatch):
    small_chunks(monkeypatch, chunk=64, seg=40)
    f = write_parquet(tmp_path / "c.parquet", ROWS)
    docs = [r["text"] or "" for r in ROWS]  # null and empty texts are skipped
    p = prepare(DataConfig(name="text", path=str(f), tokenizer="gpt2", val_fraction=0.25), progress=False)
    _check_gpt2(p, docs, 0.25)
    assert p.meta["source"]["separator"] == "<|endoftext|>" and p.meta["source"]["text_key"] == "text"
    c = prepare(DataConfig(name="text", path=str(f), val_fraction=0.25), progress=False)
    assert text_of(c) == "".join(docs)  # char-level: the texts back to back


def test_directory_of_shards_in_order_with_other_files_left_out(tmp_path, cache_with_gpt2):
    d = tmp_path / "fineweb" / "sample" / "10BT"
    d.mkdir(parents=True)
    write_parquet(d / "001_00000.parquet", ROWS[3:])
    write_parquet(d / "000_00000.parquet", ROWS[:3], row_group_size=1)
    (d / "README.md").write_text("not text!")
    (tmp_path / "fineweb" / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / "fineweb" / ".cache" / "huggingface" / "000_00000.parquet.metadata").write_text("x")
    extra = d / "notes.jsonl"  # kinds mix: a .jsonl beside the shards is documents too, sorted with them
    extra.write_text(json.dumps({"text": "From jsonl."}) + "\n")
    p = prepare(DataConfig(name="text", path=str(tmp_path / "fineweb"), tokenizer="gpt2", val_fraction=0.3),
                progress=False)
    _check_gpt2(p, [r["text"] or "" for r in ROWS[:3]] + [r["text"] or "" for r in ROWS[3:]] + ["From jsonl."],
                0.3)
    assert p.meta["source"]["files"] == 3


def test_cache_key_covers_contents_and_text_column(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", [{"text": "abc", "body": "XYZ"}, {"text": "def", "body": "UVW"}])
    a = prepare(DataConfig(name="text", path=str(f), val_fraction=0.5), progress=False)
    b = prepare(DataConfig(name="text", path=str(f), text_key="body", val_fraction=0.5), progress=False)
    assert a.dir != b.dir and text_of(b) == "XYZUVW"
    assert prepare(DataConfig(name="text", path=str(f), val_fraction=0.5), progress=False).cached
    write_parquet(f, [{"text": "abd", "body": "XYZ"}, {"text": "def", "body": "UVW"}])
    c = prepare(DataConfig(name="text", path=str(f), val_fraction=0.5), progress=False)
    assert c.dir != a.dir and not c.cached and text_of(c) == "abddef"


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"text": r["text"], "id": r["id"]} for r in ROWS])
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    p = prepare(DataConfig(name="text", path=str(tmp_path / "ds")), progress=False)
    assert text_of(p) == "".join(r["text"] or "" for r in ROWS) and p.meta["source"]["files"] == 2
    # a DatasetDict: its train split (tinygpt makes its own validation split)
    dd = datasets.DatasetDict({"train": ds.select([0, 1]), "test": ds.select([4])})
    dd.save_to_disk(str(tmp_path / "dd"))
    q = prepare(DataConfig(name="text", path=str(tmp_path / "dd"), val_fraction=0.5), progress=False)
    assert text_of(q) == ROWS[0]["text"] + ROWS[1]["text"]
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "val_only"))
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "val_only")),
                   "is a saved DatasetDict without a 'train' split (it has: validation)",
                   f"path={tmp_path / 'val_only'}/<split>")
    datasets.Dataset.from_list([{"text": "x"}]).select([]).save_to_disk(str(tmp_path / "empty"))
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "empty")), "saved dataset with no rows")


def test_arrow_file_format_and_stream(tmp_path):
    table = pa.table({"text": ["one ", "two ", "three"]})
    with pa.ipc.new_file(tmp_path / "f.arrow", table.schema) as w:  # the IPC file format (Feather v2)
        w.write_table(table, max_chunksize=2)
    with pa.ipc.new_stream(tmp_path / "s.arrow", table.schema) as w:  # the stream format (save_to_disk's)
        w.write_table(table, max_chunksize=1)
    for name in ("f.arrow", "s.arrow"):
        assert text_of(prepare(DataConfig(name="text", path=str(tmp_path / name)), progress=False)) == "one two three"


def test_read_a_row_group_at_a_time(tmp_path):
    """10 row groups of 4 rows of ~100 KB: Arrow's live memory while documents stream out stays near one group."""
    from data import corpus, sources
    f = write_parquet(tmp_path / "big.parquet", [{"text": f"{i} " + "lorem ipsum dolor " * 5500} for i in range(40)],
                      row_group_size=4)
    src = resolve(DataConfig(name="text", path=str(f)))
    live, total = [], 0
    for text in corpus.read_text(src, "strict"):
        live.append(pa.total_allocated_bytes())
        total += len(text or "")
    assert total > 3_900_000 and max(live) < 1_000_000, (total, max(live))


def test_bad_columnar_input_is_one_line(tmp_path):
    f = write_parquet(tmp_path / "a.parquet", [{"body": "x", "n": 5}])
    one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                   f"{f} has no column 'text' (it has: body, n)", "set text_key=<the column that holds the text>")
    one_line_error(ValueError, DataConfig(name="text", path=str(f), text_key="n"),
                   f"{f}: its column 'n' holds int64, not strings", "set text_key=<a column of strings>")
    # corrupt: cut short, or not parquet at all (named, and the file is left as it was)
    good = write_parquet(tmp_path / "good.parquet", ROWS).read_bytes()
    cut = tmp_path / "d" / "cut.parquet"
    cut.parent.mkdir()
    cut.write_bytes(good[: len(good) // 2])
    write_parquet(tmp_path / "d" / "ok.parquet", ROWS)
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "d")),
                   f"{cut} is not a readable parquet file (ArrowInvalid: ", "download or write it again")
    assert cut.read_bytes() == good[: len(good) // 2]
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"\x00" * 64)
    one_line_error(ValueError, DataConfig(name="text", path=str(junk)), f"{junk} is not a readable Arrow file")
    # zero rows: one file, or every file of a directory
    (tmp_path / "e").mkdir()
    empty = write_parquet(tmp_path / "e" / "0.parquet", [], text=pa.array([], pa.string()))
    one_line_error(ValueError, DataConfig(name="text", path=str(empty)), f"{empty} is empty (no rows)")
    write_parquet(tmp_path / "e" / "1.parquet", [], text=pa.array([], pa.string()))
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "e")), "all 2 files of", "are empty")
    # nothing readable in a directory: what it holds is named
    u = tmp_path / "u"
    u.mkdir()
    for name in ("a.md", "b.md", "c.json.gz"):
        (u / name).write_text("x")
    one_line_error(ValueError, DataConfig(name="text", path=str(u)), "has no .txt files (nor .jsonl, .json, .csv, "
                   ".parquet, .arrow or a datasets save_to_disk directory; it has 2 .md, 1 .gz): decompress them first "
                   "(.gz files are compressed)")


def test_non_utf8_bytes_in_a_string_column(tmp_path):
    f = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": pa.array([b"fine ", b"bad \xff!"], pa.binary()).view(pa.string())}), f)
    one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                   f"{f} row 1 is not valid UTF-8 in column 'text'", "set encoding_errors=replace")
    p = prepare(DataConfig(name="text", path=str(f), encoding_errors="replace", val_fraction=0.5), progress=False)
    assert text_of(p) == "fine bad \ufffd!"


def test_pyarrow_missing_says_what_to_install(tmp_path, monkeypatch):
    f = write_parquet(tmp_path / "a.parquet", ROWS)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                   f"{f} is a parquet file: reading it needs pyarrow, which is not installed: pip install pyarrow")


def test_training_on_a_directory_of_parquet_shards(tmp_path, tiny_corpus):
    from tests.test_training_loop import make_cfg
    from launch.run import train
    lines = tiny_corpus.read_text().splitlines(keepends=True)
    d = tmp_path / "shards"
    d.mkdir()
    half = len(lines) // 2
    for i, part in enumerate((lines[:half], lines[half:])):
        write_parquet(d / f"{i:03d}.parquet", [{"text": "".join(part[j:j + 8])} for j in range(0, len(part), 8)],
                      row_group_size=16)
    res = train(make_cfg(d, "train.max_iters=2", "train.eval_interval=2"), tmp_path / "run")
    assert (tmp_path / "run" / "last.pt").is_file() and res is not None


def test_null_and_binary_columns(tmp_path):
    """A binary column is read as UTF-8 text; an all-null column says it holds no text (not a decoding problem)."""
    f = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"text": pa.array([b"hello ", None, "w\xf6rld".encode()], type=pa.binary())}), f)
    assert text_of(prepare(DataConfig(name="text", path=str(f), val_fraction=0.2), progress=False)) == "hello w\xf6rld"
    pq.write_table(pa.table({"text": pa.array([None, None], type=pa.string())}), tmp_path / "nulls.parquet")
    msg = one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "nulls.parquet")),
                         "has no text (every document is empty or null)", "set text_key=<")
    assert "decoding" not in msg
    pq.write_table(pa.table({"text": pa.array([None, None]), "body": ["a", "b"]}), tmp_path / "nulltype.parquet")
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "nulltype.parquet")),
                   "its column 'text' holds only nulls (no text)", "set text_key=<")
