"""data/prepare.py: exact splits/tokens, cache, streaming, safe BPE cuts, bad input, atomicity, the CLI."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import data.prepare as P
from data import sources
from data.config import DataConfig
from data.loader import HEADER_SIZE, TokenFile
from data.prepare import load_prepared, prepare
from data.tokenizer import CharTokenizer, GPT2Tokenizer
from tests.helpers import REPO, run_cli

TRICKY = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n\nAll:\n  Speak, speak.\n"
          "We'll go; they're here, I'd say 'tis 2024 -- 3.14159!\r\nTabs\there\t\tand  double  spaces   .\n"
          "你好，世界。这是一个测试。😀🤗 emoji 👩‍👩‍👧 naïve café <|endoftext|> done\n")


def _tokens(path):
    return np.asarray(TokenFile(path).tokens, dtype=np.int64)


def _small_chunks(monkeypatch, chunk=4096, seg=1000):
    monkeypatch.setattr(P, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(P, "SEGMENT_CHARS", seg)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------ real corpus, exact
def test_shakespeare_char_matches_nanogpt(cache_with_shakespeare):
    p = prepare(DataConfig(), progress=False)
    text = (cache_with_shakespeare / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    chars = sorted(set(text))
    assert p.vocab_size == len(chars) == 65
    assert p.train_tokens == 1_003_854 and p.val_tokens == 111_540
    stoi = {c: i for i, c in enumerate(chars)}
    n = int(len(text) * 0.9)
    assert np.array_equal(_tokens(p.train_path), np.array([stoi[c] for c in text[:n]]))
    assert np.array_equal(_tokens(p.val_path), np.array([stoi[c] for c in text[n:]]))
    assert TokenFile(p.train_path).dtype == np.uint16
    meta = json.loads((p.dir / "meta.json").read_text())
    assert meta["tokenizer"] == {"type": "char", "chars": "".join(chars)}
    assert meta["source"]["sha256"] == sources.SHAKESPEARE_SHA256
    assert meta["split"]["train_chars"] == 1_003_854 and meta["dtype"] == "uint16"
    assert p.dir.parent == sources.cache_dir() / "prepared" and p.dir.name.startswith("shakespeare_char-char-")
    assert isinstance(p.tokenizer, CharTokenizer) and p.tokenizer.vocab_size == 65


def test_shakespeare_gpt2_matches_nanogpt_streamed(cache_with_shakespeare, cache_with_gpt2, monkeypatch):
    _small_chunks(monkeypatch, chunk=50_000, seg=20_000)  # many chunks and BPE pieces
    p = prepare(DataConfig(name="shakespeare", tokenizer="gpt2"), progress=False)
    assert (p.train_tokens, p.val_tokens) == (301_966, 36_059)  # nanoGPT's shakespeare/prepare.py numbers
    text = (cache_with_shakespeare / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    enc = GPT2Tokenizer()
    n = int(len(text) * 0.9)
    assert _tokens(p.train_path).tolist() == enc.encode_ordinary(text[:n])
    assert _tokens(p.val_path).tolist() == enc.encode_ordinary(text[n:])
    assert p.meta["forced_bpe_cuts"] == 0 and p.meta["eot_id"] == 50256
    # the default tokenizer value ("char") does not matter for the gpt2 preset
    assert prepare(DataConfig(name="shakespeare"), progress=False).dir == p.dir


def test_data_path_overrides_the_download(shared_data_dir, monkeypatch):
    import urllib.request
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download with data.path"))
    p = prepare(DataConfig(path=str(shared_data_dir / "tinyshakespeare.txt")), progress=False)
    assert p.train_tokens == 1_003_854 and p.vocab_size == 65


# ----------------------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_streamed_equals_whole_text(tokenizer, tmp_path, monkeypatch, cache_with_gpt2):
    rng = random.Random(0)
    text = "".join(rng.choice([TRICKY, TRICKY.upper(), TRICKY[::-1], "\n", " ", "x" * 50]) for _ in range(120))
    src = _write(tmp_path, "t.txt", text)
    _small_chunks(monkeypatch, chunk=997, seg=300)  # odd sizes: cuts inside multi-byte characters
    p = prepare(DataConfig(name="text", path=str(src), tokenizer=tokenizer, val_fraction=0.25), progress=False)
    n = int(len(text) * 0.75)
    tok = p.tokenizer
    assert _tokens(p.train_path).tolist() == tok.encode_ordinary(text[:n])
    assert _tokens(p.val_path).tolist() == tok.encode_ordinary(text[n:])
    assert tok.decode(_tokens(p.train_path).tolist()) + tok.decode(_tokens(p.val_path).tolist()) == text


def test_safe_cuts_never_change_gpt2_tokens(cache_with_gpt2):
    enc = GPT2Tokenizer().enc
    rng = random.Random(1)
    alphabet = list("ab cd\n\n  xyZ09'.,!?;:-\t\r_") + ["é", "你", "好", "。", "🤗", "\u00a0", "\u3000",
                                                        "\u2028", "\x1c", "ll", "'s", " 'll", "ǅ", "²", "①"]
    checked = 0
    for _ in range(600):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 40)))
        full = enc.encode_ordinary(s)
        for c in range(1, len(s)):
            if P.find_safe_cut(s, c, c) == c:
                checked += 1
                assert enc.encode_ordinary(s[:c]) + enc.encode_ordinary(s[c:]) == full, (s[:c], s[c:])
    assert checked > 500


def test_text_without_safe_cuts_is_still_prepared(tmp_path, monkeypatch, cache_with_gpt2):
    text = "x" * 5000 + "\n"
    src = _write(tmp_path, "x.txt", text)
    _small_chunks(monkeypatch, chunk=256, seg=100)
    monkeypatch.setattr(P, "MAX_CARRY_CHARS", 1000)
    p = prepare(DataConfig(name="text", path=str(src), tokenizer="gpt2"), progress=False)
    assert p.meta["forced_bpe_cuts"] > 0
    assert p.tokenizer.decode(_tokens(p.train_path).tolist() + _tokens(p.val_path).tolist()) == text


def test_directory_of_txt_files_sorted(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("bbbb\n")
    (d / "a.txt").write_text("aaaa\n")
    (d / "sub" / "c.txt").write_text("cccc\n")
    (d / "notes.md").write_text("ignored!")
    p = prepare(DataConfig(name="text", path=str(d), val_fraction=0.2), progress=False)
    tok = p.tokenizer
    assert tok.decode(_tokens(p.train_path).tolist()) + tok.decode(_tokens(p.val_path).tolist()) == \
        "aaaa\nbbbb\ncccc\n"
    assert p.meta["source"]["files"] == 3 and "!" not in tok.chars


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
        import data.prepare as P
        from data.config import DataConfig
        calls = []
        orig = P._read_text
        def spy(*a, **k):
            for t in orig(*a, **k):
                calls.append(len(t)); yield t
        P._read_text = spy
        P.CHUNK_BYTES = 1 << 20
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


# -------------------------------------------------------------------------------------------- cache
def test_second_call_is_a_cache_hit(tiny_corpus, monkeypatch):
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p1 = prepare(cfg, progress=False)
    assert not p1.cached
    mtimes = {f.name: f.stat().st_mtime_ns for f in p1.dir.iterdir()}
    monkeypatch.setattr(P, "_scan", lambda *a, **k: pytest.fail("a cache hit must not re-read the text"))
    p2 = prepare(cfg, progress=False)
    assert p2.cached and p2.dir == p1.dir and p2.meta == p1.meta and p2.tokenizer == p1.tokenizer
    assert {f.name: f.stat().st_mtime_ns for f in p2.dir.iterdir()} == mtimes
    assert [d.name for d in p1.dir.parent.iterdir()] == [p1.dir.name]  # no temp leftovers


def test_cache_key_follows_content_and_settings(tiny_corpus):
    d1 = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False).dir
    d2 = prepare(DataConfig(name="text", path=str(tiny_corpus), val_fraction=0.2), progress=False).dir
    tiny_corpus.write_text(tiny_corpus.read_text() + "more\n")
    d3 = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False).dir
    assert len({d1, d2, d3}) == 3


def test_damaged_cache_is_prepared_again(tiny_corpus, capsys):
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p = prepare(cfg, progress=False)
    good = p.train_path.read_bytes()
    with open(p.train_path, "r+b") as f:
        f.truncate(len(good) - 2)
    p2 = prepare(cfg, progress=True)
    assert not p2.cached and p2.train_path.read_bytes() == good
    assert "damaged" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- atomicity
def test_interrupted_preparation_leaves_nothing_trusted(tiny_corpus, monkeypatch):
    _small_chunks(monkeypatch, chunk=2048)
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    from data.loader import TokenWriter
    orig_write, n = TokenWriter.write, {"calls": 0}

    def failing_write(self, ids):
        n["calls"] += 1
        if n["calls"] == 3:
            raise KeyboardInterrupt  # Ctrl-C half-way
        orig_write(self, ids)

    monkeypatch.setattr(TokenWriter, "write", failing_write)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, progress=False)
    root = sources.cache_dir() / "prepared"
    assert list(root.iterdir()) == []
    monkeypatch.setattr(TokenWriter, "write", orig_write)
    p = prepare(cfg, progress=False)
    assert not p.cached and p.train_tokens + p.val_tokens == len(tiny_corpus.read_text())


def test_killed_preparation_tmp_dir_is_ignored_and_cleaned(tiny_corpus):
    root = sources.cache_dir() / "prepared"
    stale = root / ".tmp-deadbeef"
    stale.mkdir(parents=True)
    (stale / "train.bin").write_bytes(b"\0" * 100)  # a half-written file from a killed run
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket
    (stale / ".owner").write_text(f"{socket.gethostname()} {dead.pid}\n")
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    assert not stale.exists() and p.dir.is_dir()
    assert TokenFile(p.train_path).count == p.train_tokens


def test_load_prepared_checks_meta(tiny_corpus):
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    assert load_prepared(p.dir).meta == p.meta
    meta = json.loads((p.dir / "meta.json").read_text())
    meta["train_tokens"] += 1
    (p.dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match"):
        load_prepared(p.dir)
    (p.dir / "meta.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_prepared(p.dir)


# ------------------------------------------------------------------------------------ bad input
def _one_line_error(exc_type, cfg, *match):
    with pytest.raises(exc_type) as ei:
        prepare(cfg, progress=False)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    for m in match:
        assert m in msg, (m, msg)
    return msg


def test_bad_config_values(tmp_path):
    _one_line_error(ValueError, DataConfig(name="wikipedia"), "unknown data set 'wikipedia'", "data=text")
    _one_line_error(ValueError, DataConfig(name="text"), "data.path=")
    f = _write(tmp_path, "a.txt", "abc")
    _one_line_error(ValueError, DataConfig(name="text", path=str(f), tokenizer="bpe"), "data.tokenizer=char")
    _one_line_error(ValueError, DataConfig(name="text", path=str(f), val_fraction=1.5), "data.val_fraction")
    _one_line_error(ValueError, DataConfig(name="text", path=str(f), val_fraction=0), "data.val_fraction")
    _one_line_error(ValueError, DataConfig(name="text", path=str(f), encoding_errors="nope"), "replace")
    _one_line_error(ValueError, DataConfig(tokenizer="gpt2"), "data=shakespeare")
    with pytest.raises(ValueError, match="unknown data option"):
        DataConfig.coerce({"name": "text", "pth": "x"})
    assert DataConfig.coerce({"name": "text", "path": "x"}) == DataConfig(name="text", path="x")


def test_missing_empty_and_no_txt(tmp_path):
    _one_line_error(FileNotFoundError, DataConfig(name="text", path=str(tmp_path / "nope.txt")),
                    "data.path=", "nope.txt", "does not exist")
    _one_line_error(ValueError, DataConfig(name="text", path=str(_write(tmp_path, "e.txt", ""))), "e.txt is empty")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x.md").write_text("hi")
    _one_line_error(ValueError, DataConfig(name="text", path=str(d)), "has no .txt files")
    (d / "y.txt").write_text("")
    _one_line_error(ValueError, DataConfig(name="text", path=str(d)), "are empty")


def test_shakespeare_offline_error(monkeypatch):
    import urllib.error
    import urllib.request

    def urlopen(*a, **k):
        raise urllib.error.URLError("offline")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    _one_line_error(FileNotFoundError, DataConfig(), str(sources.shakespeare_cache_path()))


def test_non_utf8_names_file_and_offset(tmp_path, monkeypatch):
    _small_chunks(monkeypatch, chunk=1000)  # the bad byte lies in a later chunk
    good = ("abc\n" * 1000).encode()
    f = tmp_path / "latin1.txt"
    f.write_bytes(good[:2500] + "é".encode("latin-1") + good[2500:])
    msg = _one_line_error(ValueError, DataConfig(name="text", path=str(f)),
                          str(f), "byte 0xe9 at byte offset 2,500", "data.encoding_errors=replace")
    assert "Traceback" not in msg
    # a multi-byte character cut by a chunk border is fine; a truncated one at the end of a file is not
    ok = tmp_path / "ok.txt"
    ok.write_bytes(("x" * 999 + "é" * 10).encode())
    prepare(DataConfig(name="text", path=str(ok)), progress=False)
    trunc = tmp_path / "trunc.txt"
    trunc.write_bytes("abcé".encode()[:-1])
    _one_line_error(ValueError, DataConfig(name="text", path=str(trunc)), "byte offset 3")
    assert list((sources.cache_dir() / "prepared").glob("text-*")) == [
        prepare(DataConfig(name="text", path=str(ok)), progress=False).dir]


def test_encoding_errors_replace(tmp_path):
    f = tmp_path / "mixed.txt"
    f.write_bytes(b"hello \xff\xfe world\n" * 10)
    p = prepare(DataConfig(name="text", path=str(f), encoding_errors="replace"), progress=False)
    assert "\ufffd" in p.tokenizer.chars
    text = p.tokenizer.decode(_tokens(p.train_path).tolist() + _tokens(p.val_path).tolist())
    assert text == (b"hello \xff\xfe world\n" * 10).decode("utf-8", errors="replace")
    p2 = prepare(DataConfig(name="text", path=str(f), encoding_errors="ignore"), progress=False)
    assert p2.dir != p.dir and "\ufffd" not in p2.tokenizer.chars


def test_gpt2_missing_ranks_fails_before_writing(tiny_corpus, monkeypatch):
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding", lambda n: (_ for _ in ()).throw(OSError("offline")))
    _one_line_error(FileNotFoundError, DataConfig(name="text", path=str(tiny_corpus), tokenizer="gpt2"),
                    str(sources.gpt2_ranks_cache_path()))
    assert not (sources.cache_dir() / "prepared").exists()


def test_large_char_vocab_uses_uint32(tmp_path):
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000)
    f = _write(tmp_path, "wide.txt", text)
    p = prepare(DataConfig(name="text", path=str(f)), progress=False)
    assert p.vocab_size == len(set(text)) > 65536
    assert TokenFile(p.train_path).dtype == np.uint32
    assert p.train_path.stat().st_size == HEADER_SIZE + 4 * p.train_tokens


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_prepares_and_reports(tiny_corpus):
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", str(tiny_corpus), "--quiet"], cwd=tiny_corpus.parent)
    assert r.returncode == 0, r.stderr
    assert "train.bin" in r.stdout and "val.bin" in r.stdout and "tokens" in r.stdout
    assert f"from {tiny_corpus.absolute()}" in r.stdout
    copy = tiny_corpus.with_name("copy.txt")  # the same content under another name: a cache hit ...
    shutil.copy(tiny_corpus, copy)
    r2 = run_cli(["-m", "data.prepare", "--data", "text", "--path", "copy.txt"], cwd=tiny_corpus.parent)
    assert r2.returncode == 0 and "already prepared" in r2.stdout
    assert f"from {copy.absolute()} (already prepared)" in r2.stdout  # ... that names the file given


def test_cli_errors_are_one_line(tmp_path):
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", str(tmp_path / "missing.txt")], cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.txt" in lines[0]
    r = run_cli(["-m", "data.prepare", "--data", "text"], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and "--path" in r.stderr
