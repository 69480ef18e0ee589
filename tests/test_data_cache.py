"""data/cache.py: cache hits, the key, damaged copies, interrupted and killed preparations, load_prepared."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from data import corpus, sources
from data.config import DataConfig
from data.loader import TokenFile, TokenWriter
from data.prepare import load_prepared, prepare
from tests.test_data_prepare import small_chunks


def test_second_call_is_a_cache_hit(tiny_corpus, monkeypatch):
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p1 = prepare(cfg, progress=False)
    assert not p1.cached
    mtimes = {f.name: f.stat().st_mtime_ns for f in p1.dir.iterdir()}
    monkeypatch.setattr(corpus, "scan", lambda *a, **k: pytest.fail("a cache hit must not re-read the text"))
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


def test_interrupted_preparation_leaves_nothing_trusted(tiny_corpus, monkeypatch):
    small_chunks(monkeypatch, chunk=2048)
    cfg = DataConfig(name="text", path=str(tiny_corpus))
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
