"""data/corpus.py: which files make the text, documents (<|endoftext|>, jsonl), exact UTF-8 decoding, bounded
memory, unreadable files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from data import sources
from data.config import DataConfig
from data.prepare import prepare
from tests.helpers import REPO
from tests.test_data_prepare import one_line_error, small_chunks, tokens, write


def test_directory_of_txt_files_sorted(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("bbbb\n")
    (d / "a.txt").write_text("aaaa\n")
    (d / "sub" / "c.txt").write_text("cccc\n")
    (d / "notes.md").write_text("ignored!")
    p = prepare(DataConfig(name="text", path=str(d), val_fraction=0.2), progress=False)
    tok = p.tokenizer
    assert tok.decode(tokens(p.train_path).tolist()) + tok.decode(tokens(p.val_path).tolist()) == \
        "aaaa\nbbbb\ncccc\n"
    assert p.meta["source"]["files"] == 3 and "!" not in tok.chars


def test_missing_empty_and_no_txt(tmp_path):
    one_line_error(FileNotFoundError, DataConfig(name="text", path=str(tmp_path / "nope.txt")),
                    f"path={tmp_path / 'nope.txt'} does not exist", "a directory of such files (.txt, .jsonl, .json, "
                    ".csv, .parquet, .arrow)")
    one_line_error(ValueError, DataConfig(name="text", path=str(write(tmp_path, "e.txt", ""))), "e.txt is empty")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x.md").write_text("hi")
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), "has no .txt files", "it has 1 .md")
    (d / "y.txt").write_text("")
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), "are empty")


def test_non_utf8_names_file_and_offset(tmp_path, monkeypatch):
    small_chunks(monkeypatch, chunk=1000)  # the bad byte lies in a later chunk
    good = ("abc\n" * 1000).encode()
    f = tmp_path / "latin1.txt"
    f.write_bytes(good[:2500] + "é".encode("latin-1") + good[2500:])
    msg = one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                          str(f), "byte 0xe9 at byte offset 2,500", "set encoding_errors=replace")
    assert "Traceback" not in msg
    # a multi-byte character cut by a chunk border is fine; a truncated one at the end of a file is not
    ok = tmp_path / "ok.txt"
    ok.write_bytes(("x" * 999 + "é" * 10).encode())
    prepare(DataConfig(name="text", path=str(ok)), progress=False)
    trunc = tmp_path / "trunc.txt"
    trunc.write_bytes("abcé".encode()[:-1])
    one_line_error(ValueError, DataConfig(name="text", path=str(trunc)), "byte offset 3")
    assert list((sources.cache_dir() / "prepared").glob("text-*")) == [
        prepare(DataConfig(name="text", path=str(ok)), progress=False).dir]


def test_encoding_errors_replace(tmp_path):
    f = tmp_path / "mixed.txt"
    f.write_bytes(b"hello \xff\xfe world\n" * 10)
    p = prepare(DataConfig(name="text", path=str(f), encoding_errors="replace"), progress=False)
    assert "\ufffd" in p.tokenizer.chars
    text = p.tokenizer.decode(tokens(p.train_path).tolist() + tokens(p.val_path).tolist())
    assert text == (b"hello \xff\xfe world\n" * 10).decode("utf-8", errors="replace")
    p2 = prepare(DataConfig(name="text", path=str(f), encoding_errors="ignore"), progress=False)
    assert p2.dir != p.dir and "\ufffd" not in p2.tokenizer.chars


@pytest.mark.slow
def test_bounded_memory_streaming(tmp_path):
    """A ~24 MB file prepared in a subprocess with 1 MiB chunks: peak memory stays far below the file size."""
    big = tmp_path / "big.txt"
    line = ("the quick brown fox jumps over the lazy dog; ROMEO: wherefore art thou? 0123456789\n" * 64).encode()
    with open(big, "wb") as f:
        for _ in range((24 << 20) // len(line)):
            f.write(line)
    size = big.stat().st_size
    script = textwrap.dedent(f"""
        import resource, numpy, tqdm, json, tracemalloc
        import data.cache, data.corpus as C  # (imports before tracemalloc: what is measured is the streaming)
        import data.prepare as P
        from data.config import DataConfig
        calls = []
        orig = C.read_text
        def spy(*a, **k):
            for t in orig(*a, **k):
                calls.append(len(t)); yield t
        C.read_text = spy
        C.CHUNK_BYTES = 1 << 20
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        p = P.prepare(DataConfig(name="text", path={str(big)!r}), progress=False)
        peak = tracemalloc.get_traced_memory()[1]
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"growth_kb": after - before, "traced_peak": peak, "max_chunk": max(calls),
                          "chunks": len(calls), "tokens": p.train_tokens + p.val_tokens}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["tokens"] == size
    assert r["max_chunk"] <= 1 << 20 and r["chunks"] >= 2 * (size >> 20)  # two passes, 1 MiB at a time
    # whole-file processing would need several times the file size; streaming needs a few chunks
    assert r["traced_peak"] < size / 3 and r["growth_kb"] * 1024 < size / 3, r
    big.unlink()


# ------------------------------------------------------------------------------------- documents, jsonl
def _expected(docs, n, tok):
    """nanoGPT's rule on our character split: each document encoded on its own, <|endoftext|> between two;
    the train part ends at character n (a separator exactly there opens val)."""
    out, pos, first = {"train": [], "val": []}, 0, True
    for d in filter(None, docs):
        if not first:
            out["train" if pos < n else "val"].append(50256)
        first = False
        cut = max(0, n - pos)
        out["train"] += tok.encode_ordinary(d[:cut])
        out["val"] += tok.encode_ordinary(d[cut:])
        pos += len(d)
    return out


def _check_gpt2(p, docs, vf):
    n = int(sum(map(len, docs)) * (1 - vf))
    want = _expected(docs, n, p.tokenizer)
    assert tokens(p.train_path).tolist() == want["train"] and tokens(p.val_path).tolist() == want["val"]
    assert want["train"].count(50256) + want["val"].count(50256) == len(list(filter(None, docs))) - 1


def test_gpt2_puts_endoftext_between_documents(tmp_path, cache_with_gpt2, monkeypatch):
    small_chunks(monkeypatch, chunk=64, seg=40)  # documents span many chunks and BPE pieces
    d = tmp_path / "docs"
    d.mkdir()
    docs = ["First document.\nIt ends here", "", "Second <|endoftext|> one.\n", "Third, 你好 😀 it's\n" * 30]
    for i, text in enumerate(docs):
        (d / f"{i}.txt").write_text(text, encoding="utf-8")
    p = prepare(DataConfig(name="text", path=str(d), tokenizer="gpt2", val_fraction=0.3), progress=False)
    _check_gpt2(p, docs, 0.3)
    assert p.meta["source"]["separator"] == "<|endoftext|>"
    # a list of paths: files and directories in the order given
    extra = write(tmp_path, "extra.txt", "An extra document.\n")
    p2 = prepare(DataConfig(name="text", path=[str(extra), str(d)], tokenizer="gpt2", val_fraction=0.3),
                 progress=False)
    _check_gpt2(p2, ["An extra document.\n", *docs], 0.3)
    # char-level: no separator, byte-for-byte concatenation
    p3 = prepare(DataConfig(name="text", path=[str(extra), str(d)]), progress=False)
    assert p3.tokenizer.decode(tokens(p3.train_path).tolist() + tokens(p3.val_path).tolist()) == \
        "An extra document.\n" + "".join(docs)


def test_document_boundary_at_the_split_point_opens_val():
    from data.encode import _split_stream
    assert list(_split_stream(iter(["ab", None, "cd"]), 2)) == [
        ("train", "ab", True), ("val", None, False), ("val", "cd", False), ("val", "", True)]


def test_jsonl_lines_are_documents(tmp_path, cache_with_gpt2, monkeypatch):
    small_chunks(monkeypatch, chunk=64, seg=40)
    rows = [{"text": "Hello world.", "id": 1}, {"text": "Second 😀 doc\nwith lines", "body": "B"}, {"text": ""},
            {"body": "b3", "text": "third " * 40}]
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n", encoding="utf-8")
    docs = [r["text"] for r in rows]
    p = prepare(DataConfig(name="text", path=str(f), tokenizer="gpt2", val_fraction=0.25), progress=False)
    _check_gpt2(p, docs, 0.25)
    c = prepare(DataConfig(name="text", path=str(f), val_fraction=0.25), progress=False)
    assert c.tokenizer.decode(tokens(c.train_path).tolist() + tokens(c.val_path).tolist()) == "".join(docs)
    # the text key is part of the cache key; a line without it is named
    g = tmp_path / "d.jsonl"
    g.write_text("".join(json.dumps({"text": t, "body": t.upper()}) + "\n" for t in ("abc", "def")))
    a = prepare(DataConfig(name="text", path=str(g)), progress=False)
    b = prepare(DataConfig(name="text", path=str(g), text_key="body"), progress=False)
    assert a.dir != b.dir
    assert b.tokenizer.decode(tokens(b.train_path).tolist() + tokens(b.val_path).tolist()) == "ABCDEF"
    one_line_error(ValueError, DataConfig(name="text", path=str(f), text_key="body"),
                   f"{f} line 1 has no text under 'body' (it has: text, id)", "set text_key=<")


def test_jsonl_bad_lines_are_named(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "ok"}\n\n{"text": "fine"\n')
    one_line_error(ValueError, DataConfig(name="text", path=str(f)), f"{f} line 3 is not JSON", "one JSON object")
    f.write_text('{"text": "ok"}\n["a list"]\n')
    one_line_error(ValueError, DataConfig(name="text", path=str(f)), "line 2 has no text under 'text' (it has: list)")
    f.write_bytes(b'\xef\xbb\xbf{"text": "a BOM is fine"}\n{"text": 5}\n')
    one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                   "line 2: its 'text' is a number (int), not a string", "set text_key=<")
    for value, kind in (("null", "null"), ("true", "a boolean (bool)"), ('["a"]', "a list (list)")):
        f.write_text('{"text": %s}\n' % value)
        one_line_error(ValueError, DataConfig(name="text", path=str(f)), f"line 1: its 'text' is {kind}, not a string")
    f.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    one_line_error(ValueError, DataConfig(name="text", path=str(f)), "line 2 is not valid UTF-8", "encoding_errors")
    p = prepare(DataConfig(name="text", path=str(f), encoding_errors="replace", val_fraction=0.5), progress=False)
    assert "\ufffd" in p.tokenizer.chars


@pytest.mark.slow  # over ~1 s
def test_jsonl_is_streamed(tmp_path):
    """1.5 MB then 4.5 MB of lines: the traced peak does not grow with the file (a line at a time)."""
    import tracemalloc
    line = json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 40, "meta": {"n": 1}}) + "\n"
    peaks = []
    for mb in (1.5, 4.5):
        f = tmp_path / f"{mb}.jsonl"
        f.write_text(line * int(mb * (1 << 20) / len(line)))
        tracemalloc.start()
        try:
            p = prepare(DataConfig(name="text", path=str(f)), progress=False)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert p.train_tokens + p.val_tokens == int(mb * (1 << 20) / len(line)) * 44 * 40
    assert peaks[1] < peaks[0] + (128 << 10), peaks


def test_path_list_and_bad_paths(tmp_path):
    one_line_error(ValueError, DataConfig(name="text", path=[str(tmp_path), {"a": 1}]), "is not a path",
                   "(path=[a.txt,b.txt])")
    one_line_error(ValueError, DataConfig(name="text", path=[]), "name=text needs your text: add path=<")
    one_line_error(FileNotFoundError, DataConfig(name="text", path=[str(write(tmp_path, "a.txt", "a")), "nope.txt"]),
                   "path=nope.txt does not exist")
    assert DataConfig(path=5).paths() == ["5"]
    from omegaconf import OmegaConf  # what Hydra hands over for data.path=[a.txt,b.txt]
    cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.from_dotlist(["path=[a.txt,b.txt]"]))
    assert OmegaConf.to_object(cfg).paths() == ["a.txt", "b.txt"]


# ------------------------------------------------------------------------------------------ unreadable
def _deny(monkeypatch, name):
    import builtins
    def fake_open(path, *a, **k):
        if Path(path).name == name:
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *a, **k)

    import data.config
    monkeypatch.setattr(data.config, "open", fake_open, raising=False)


def test_unreadable_corpus_names_the_setting(tmp_path, monkeypatch):
    write(tmp_path, "secret.txt", "top secret\n")
    _deny(monkeypatch, "secret.txt")
    msg = one_line_error(PermissionError, DataConfig(name="text", path="secret.txt"))
    assert msg == "path=secret.txt cannot be read (permission denied): check its permissions or give another file"
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("fine\n")
    (d / "secret.txt").write_text("no\n")
    one_line_error(PermissionError, DataConfig(name="text", path=str(d)),
                   f"path={d} cannot be read (permission denied: {d / 'secret.txt'})")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_corpus_for_real(tmp_path):
    f = write(tmp_path, "secret.txt", "top secret\n")
    f.chmod(0)
    try:
        one_line_error(PermissionError, DataConfig(name="text", path="secret.txt"),
                       "path=secret.txt cannot be read")
    finally:
        f.chmod(0o600)


# ------------------------------------------------------- issue 29: structured files are read by their format
def test_json_array_and_csv_are_read_by_their_format(tmp_path):
    """A .json array of records and a .csv table give their text field, not their syntax, and `text_key` picks it."""
    records = [{"text": "hello there", "id": 1}, {"text": "general kenobi", "id": 2}, {"text": "", "id": 3}]
    (tmp_path / "records.json").write_text(json.dumps(records), encoding="utf-8")
    p = prepare(DataConfig(name="text", path=str(tmp_path / "records.json"), val_fraction=0.2), progress=False)
    assert "".join(p.tokenizer.chars) == " abeghiklnort" and p.meta["source"]["text_key"] == "text"
    (tmp_path / "table.csv").write_text('id,body\n1,"hello, there"\n2,"two\nlines"\n3,\n', encoding="utf-8")
    q = prepare(DataConfig(name="text", path=str(tmp_path / "table.csv"), text_key="body", val_fraction=0.2),
                progress=False)
    text = q.tokenizer.decode(tokens(q.train_path).tolist() + tokens(q.val_path).tolist())
    assert text == "hello, theretwo\nlines"
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "table.csv")),
                   "table.csv has no column 'text' in its header row (it has: id, body)", "set text_key=<")
    (tmp_path / "obj.json").write_text('{"text": "x"}')
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "obj.json")),
                   "holds an object (dict), not an array of records")
    (tmp_path / "nums.json").write_text('[{"text": 3}]')
    one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / "nums.json")),
                   "nums.json record 0: its 'text' is a number (int), not a string", "set text_key=<")


def test_a_directory_takes_every_format_a_single_file_takes(tmp_path):
    """Issue 43: a directory of .csv files was refused though one .csv trains. data.formats.FORMATS is the one
    table: each of its formats is read from a directory as it is alone."""
    from data.formats import FORMATS
    files = {".txt": "hello there\n", ".jsonl": '{"text": "hello there\\n"}\n',
             ".json": '[{"text": "hello there\\n"}]', ".csv": 'id,text\n1,"hello there\n"\n'}
    assert set(files) | {".parquet", ".arrow"} == set(FORMATS)  # (parquet, arrow: tests/test_data_columnar.py)
    for suffix, content in files.items():
        d = tmp_path / suffix[1:]
        d.mkdir()
        for name in ("a", "b"):
            (d / f"{name}{suffix}").write_text(content, encoding="utf-8")
        both = prepare(DataConfig(name="text", path=str(d), val_fraction=0.5), progress=False)
        text = both.tokenizer.decode(tokens(both.train_path).tolist() + tokens(both.val_path).tolist())
        assert text == "hello there\n" * 2 and both.meta["source"]["files"] == 2, suffix


def test_a_compressed_or_binary_file_is_named_for_what_it_is(tmp_path):
    """Issue 43: a gzip file was told "set data.encoding_errors=replace", which trains on its compressed bytes.
    Compressed (gzip, zip, bz2, xz, zstd), PDF, UTF-16 and NUL-holding files are named, with what to do; with
    encoding_errors=replace too, and inside a directory; a directory of only archives says to decompress them."""
    import bz2
    import gzip
    import lzma
    import zipfile
    text = b"hello there, general kenobi\n" * 50
    with zipfile.ZipFile(tmp_path / "book.zip", "w") as z:
        z.writestr("book.txt", text)
    cases = {"book.txt.gz": (gzip.compress(text), "is compressed (gzip), not text: decompress it first (gzip -dc "
                                                  f"{tmp_path / 'book.txt.gz'} > {tmp_path / 'book.txt'})"),
             "book.zip": (None, f"is compressed (zip), not text: decompress it first (unzip {tmp_path / 'book.zip'})"),
             "book.bz2": (bz2.compress(text), "is compressed (bzip2)"),
             "book.xz": (lzma.compress(text), "is compressed (xz)"),
             "book.zst": (b"\x28\xb5\x2f\xfd" + bytes(20), "is compressed (zstd)"),
             "gz.txt": (gzip.compress(text), f"(gzip -dc {tmp_path / 'gz.txt'} > {tmp_path / 'gz-text.txt'})"),
             "book.docx": ((tmp_path / "book.zip").read_bytes(), "is a zip archive (as .docx files are), not text: "
                                                                 "export its text to a .txt file"),
             "book.pdf": (b"%PDF-1.7\n" + text, "is a PDF document, not text: extract its text to a .txt file"),
             "wide.txt": (text.decode().encode("utf-16"), "is UTF-16 text (it starts with a UTF-16 byte-order mark): "
                                                          "re-save it as UTF-8"),
             "data.bin": (b"\x01\x02" + bytes(10) + text, "is a binary file, not text (a NUL byte at offset 2): point "
                                                          "path at text")}
    for name, (content, words) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        for errors in ("strict", "replace"):
            msg = one_line_error(ValueError, DataConfig(name="text", path=str(tmp_path / name), encoding_errors=errors),
                                 f"{tmp_path / name} ", words)
            assert "encoding_errors" not in msg, msg
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_bytes(text)
    (d / "b.txt").write_bytes(gzip.compress(text))
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), f"{d / 'b.txt'} is compressed (gzip)")
    (d / "a.txt").rename(d / "a.txt.gz")
    (d / "b.txt").rename(d / "b.txt.gz")
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), "it has 2 .gz): decompress them first (.gz files "
                   "are compressed), or point path at a single text file")


def test_datasets_metadata_is_not_text(tmp_path):
    """state.json / dataset_dict.json given as a file are refused naming the directory; a saved dataset inside a
    directory contributes its Arrow files (a DatasetDict: its train split), never its metadata or other splits."""
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "train text"}]),
                               "validation": datasets.Dataset.from_list([{"text": "VALIDATION"}])})
    dd.save_to_disk(str(tmp_path / "corpus" / "dd"))
    (tmp_path / "corpus" / "more.txt").write_text(" and more")
    p = prepare(DataConfig(name="text", path=str(tmp_path / "corpus"), val_fraction=0.2), progress=False)
    assert p.tokenizer.decode(tokens(p.train_path).tolist() + tokens(p.val_path).tolist()) == "train text and more"
    state = tmp_path / "corpus" / "dd" / "train" / "state.json"
    one_line_error(ValueError, DataConfig(name="text", path=str(state)), "is the metadata of a saved dataset",
                   f"path={state.parent}")
