"""data/corpus.py: which files make the text, exact UTF-8 decoding (bad bytes, lossy modes), bounded memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

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
                    "data.path=", "nope.txt", "does not exist")
    one_line_error(ValueError, DataConfig(name="text", path=str(write(tmp_path, "e.txt", ""))), "e.txt is empty")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x.md").write_text("hi")
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), "has no .txt files")
    (d / "y.txt").write_text("")
    one_line_error(ValueError, DataConfig(name="text", path=str(d)), "are empty")


def test_non_utf8_names_file_and_offset(tmp_path, monkeypatch):
    small_chunks(monkeypatch, chunk=1000)  # the bad byte lies in a later chunk
    good = ("abc\n" * 1000).encode()
    f = tmp_path / "latin1.txt"
    f.write_bytes(good[:2500] + "é".encode("latin-1") + good[2500:])
    msg = one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                          str(f), "byte 0xe9 at byte offset 2,500", "data.encoding_errors=replace")
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
        import data.corpus as C
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
