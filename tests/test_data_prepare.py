"""data/prepare.py: prepare() end to end (exact nanoGPT numbers, config errors, token widths) and the CLI.

The helpers here (tokens, small_chunks, write, one_line_error) are shared by the other test_data_* files.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from data import corpus, encode, sources
from data.config import DataConfig
from data.loader import HEADER_SIZE, TokenFile
from data.prepare import main, prepare
from data.tokenizer import CharTokenizer, GPT2Tokenizer
from tests.helpers import run_cli

TRICKY = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n\nAll:\n  Speak, speak.\n"
          "We'll go; they're here, I'd say 'tis 2024 -- 3.14159!\r\nTabs\there\t\tand  double  spaces   .\n"
          "你好，世界。这是一个测试。😀🤗 emoji 👩‍👩‍👧 naïve café <|endoftext|> done\n")


def tokens(path):
    return np.asarray(TokenFile(path).tokens, dtype=np.int64)


def small_chunks(monkeypatch, chunk=4096, seg=1000):
    monkeypatch.setattr(corpus, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(encode, "SEGMENT_CHARS", seg)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def one_line_error(exc_type, cfg, *match):
    with pytest.raises(exc_type) as ei:
        prepare(cfg, progress=False)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    for m in match:
        assert m in msg, (m, msg)
    return msg


# ---------------------------------------------------------------------------------- real corpus, exact
def test_shakespeare_char_matches_nanogpt(cache_with_shakespeare):
    p = prepare(DataConfig(), progress=False)
    text = (cache_with_shakespeare / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    chars = sorted(set(text))
    assert p.tokenizer.vocab_size == len(chars) == 65
    assert p.train_tokens == 1_003_854 and p.val_tokens == 111_540
    stoi = {c: i for i, c in enumerate(chars)}
    n = int(len(text) * 0.9)
    assert np.array_equal(tokens(p.train_path), np.array([stoi[c] for c in text[:n]]))
    assert np.array_equal(tokens(p.val_path), np.array([stoi[c] for c in text[n:]]))
    assert TokenFile(p.train_path).dtype == np.uint16
    meta = json.loads((p.dir / "meta.json").read_text())
    assert meta["tokenizer"] == {"type": "char", "chars": "".join(chars)}
    assert meta["source"]["sha256"] == sources.SHAKESPEARE_SHA256
    assert meta["split"]["train_chars"] == 1_003_854 and meta["dtype"] == "uint16"
    assert p.dir.parent == sources.cache_dir() / "prepared" and p.dir.name.startswith("shakespeare_char-char-")
    assert p.dir.name == "shakespeare_char-char-6f6a4e890b805290"  # the key before documents/jsonl existed
    assert isinstance(p.tokenizer, CharTokenizer) and p.tokenizer.vocab_size == 65


def test_shakespeare_gpt2_matches_nanogpt_streamed(cache_with_shakespeare, cache_with_gpt2, monkeypatch):
    small_chunks(monkeypatch, chunk=50_000, seg=20_000)  # many chunks and BPE pieces
    p = prepare(DataConfig(name="shakespeare", tokenizer="gpt2"), progress=False)
    assert (p.train_tokens, p.val_tokens) == (301_966, 36_059)  # nanoGPT's shakespeare/prepare.py numbers
    text = (cache_with_shakespeare / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    enc = GPT2Tokenizer()
    n = int(len(text) * 0.9)
    assert tokens(p.train_path).tolist() == enc.encode_ordinary(text[:n])
    assert tokens(p.val_path).tolist() == enc.encode_ordinary(text[n:])
    assert p.meta["forced_bpe_cuts"] == 0 and p.meta["eot_id"] == 50256
    # the default tokenizer value ("char") does not matter for the gpt2 preset
    assert prepare(DataConfig(name="shakespeare"), progress=False).dir == p.dir


def test_data_path_overrides_the_download(shared_data_dir, monkeypatch):
    import urllib.request
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download with data.path"))
    p = prepare(DataConfig(path=str(shared_data_dir / "tinyshakespeare.txt")), progress=False)
    assert p.train_tokens == 1_003_854 and p.tokenizer.vocab_size == 65


# ------------------------------------------------------------------------------------------- bad input
def test_bad_config_values(tmp_path):
    one_line_error(ValueError, DataConfig(name="wikipedia"), "unknown data set 'wikipedia'", "name=text (with path=<")
    one_line_error(ValueError, DataConfig(name="text"), "add path=<")
    f = write(tmp_path, "a.txt", "abc")
    one_line_error(ValueError, DataConfig(name="text", path=str(f), tokenizer="wordpiece"),
                   "use tokenizer=char, tokenizer=gpt2 or tokenizer=bpe vocab_size=4096")
    one_line_error(ValueError, DataConfig(name="text", path=str(f), val_fraction=1.5), "val_fraction=1.5 must be between 0 and 1")
    one_line_error(ValueError, DataConfig(name="text", path=str(f), val_fraction=0), "val_fraction=0 must be between 0 and 1")
    one_line_error(ValueError, DataConfig(name="text", path=str(f), encoding_errors="nope"), "replace")
    one_line_error(ValueError, DataConfig(tokenizer="gpt2"), "use name=shakespeare for")


def test_shakespeare_offline_error(monkeypatch):
    import urllib.error
    import urllib.request

    def urlopen(*a, **k):
        raise urllib.error.URLError("offline")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    one_line_error(FileNotFoundError, DataConfig(), str(sources.shakespeare_cache_path()))


def test_gpt2_missing_ranks_fails_before_writing(tiny_corpus, monkeypatch):
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding", lambda n: (_ for _ in ()).throw(OSError("offline")))
    one_line_error(FileNotFoundError, DataConfig(name="text", path=str(tiny_corpus), tokenizer="gpt2"),
                    str(sources.gpt2_ranks_cache_path()))
    assert not (sources.cache_dir() / "prepared").exists()


def test_large_char_vocab_uses_uint32(tmp_path):
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 70000) if not 0xD800 <= c < 0xE000)
    f = write(tmp_path, "wide.txt", text)
    p = prepare(DataConfig(name="text", path=str(f)), progress=False)
    assert p.tokenizer.vocab_size == len(set(text)) > 65536
    assert TokenFile(p.train_path).dtype == np.uint32
    assert p.train_path.stat().st_size == HEADER_SIZE + 4 * p.train_tokens


# ------------------------------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_prepares_and_reports(tiny_corpus):
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", str(tiny_corpus), "--quiet"], cwd=tiny_corpus.parent)
    assert r.returncode == 0, r.stderr
    assert "train-00000.bin" in r.stdout and "val-00000.bin" in r.stdout and "tokens" in r.stdout
    assert f"from {tiny_corpus.absolute()}" in r.stdout
    copy = tiny_corpus.with_name("copy.txt")  # the same content under another name: a cache hit ...
    shutil.copy(tiny_corpus, copy)
    r2 = run_cli(["-m", "data.prepare", "--data", "text", "--path", "copy.txt"], cwd=tiny_corpus.parent)
    assert r2.returncode == 0 and "already prepared" in r2.stdout
    assert f"from {copy.absolute()} (already prepared)" in r2.stdout  # ... that names the file given


@pytest.mark.slow
def test_cli_several_paths_and_jsonl(tmp_path):
    write(tmp_path, "a.txt", "plain text\n")
    write(tmp_path, "b.jsonl", '{"body": "from json"}\n{"body": "again"}\n')
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", "a.txt", "b.jsonl", "--text-key", "body",
                 "--quiet"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"from {tmp_path / 'a.txt'}, {tmp_path / 'b.jsonl'}" in r.stdout
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", "b.jsonl"], cwd=tmp_path)
    assert r.returncode == 2 and "line 1 has no text under 'text'" in r.stderr and "--text-key <" in r.stderr


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    r = run_cli(["-m", "data.prepare", "--data", "text", "--path", str(tmp_path / "missing.txt")], cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "missing.txt" in lines[0]
    r = run_cli(["-m", "data.prepare", "--data", "text"], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and "--path" in r.stderr


def test_cli_trains_the_own_bpe_and_names_its_flags(tiny_corpus, capsys):
    """`--tokenizer bpe --vocab-size N` (in-process: the same main() as `python -m data.prepare`)."""
    from data.prepare import main
    assert main(["--data", "text", "--path", str(tiny_corpus), "--tokenizer", "bpe", "--vocab-size", "300",
                 "--quiet"]) == 0
    assert "own BPE (300 tokens)" in capsys.readouterr().out
    assert main(["--data", "text", "--path", str(tiny_corpus), "--tokenizer", "bpe", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--vocab-size" in err and len(err.strip().splitlines()) == 1


def test_cli_argument_error_is_one_line_and_sizes_are_text(tmp_path, capsys):
    """A bad flag is one line (no 8-line usage); the summary reports the text's size, not the file's."""
    assert main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "error: unrecognized arguments: --bogus (see python -m data.prepare --help)\n"
    (tmp_path / "r.jsonl").write_text('{"text": "abc", "padding": "' + "x" * 100 + '"}\n{"text": "de"}\n')
    assert main(["--data", "text", "--path", str(tmp_path / "r.jsonl"), "--val-fraction", "0.4"]) == 0
    out = capsys.readouterr()
    assert "5 characters of text from" in out.out and "5 characters of text" in out.err


def test_cache_that_is_a_file_is_one_line(tmp_path, monkeypatch, tiny_corpus):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "afile"))
    for cfg in (DataConfig(), DataConfig(name="text", path=str(tiny_corpus))):
        one_line_error(ValueError, cfg, f"the tinygpt cache {tmp_path / 'afile'} is a file, not a directory",
                       "set TINYGPT_CACHE to a directory")
