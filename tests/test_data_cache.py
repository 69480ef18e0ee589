"""data/cache.py: cache hits, the key (and its compatibility), damaged copies, interrupted and killed preparations,
load_prepared, a read-only cache."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data import corpus, sources
from data.prepare import cache_key
from data.config import DataConfig
from data.loader import TokenFile
from data.shards import TokenWriter
from data.prepare import load_prepared, prepare
from tests.helpers import REPO
from tests.test_data_prepare import small_chunks


def test_second_call_is_a_cache_hit(tiny_corpus, monkeypatch):
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p1 = prepare(cfg, progress=False)
    assert not p1.cached
    mtimes = {f.name: f.stat().st_mtime_ns for f in p1.dir.iterdir()}
    monkeypatch.setattr(corpus, "scan", lambda *a, **k: pytest.fail("a cache hit must not re-read the text"))
    p2 = prepare(cfg, progress=False)
    assert p2.cached and p2.dir == p1.dir and p2.meta == p1.meta and p2.tokenizer.to_dict() == p1.tokenizer.to_dict()
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
    """Ctrl-C: no directory under the final name; the partial one (released) is continued by the next run."""
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
    (partial,) = root.iterdir()
    assert partial.name.startswith(".tmp-") and partial.name.split("-")[-2] == str(os.getpid())  # its owner
    monkeypatch.setattr(TokenWriter, "write", orig_write)
    p = prepare(cfg, progress=False)
    assert not p.cached and p.train_tokens + p.val_tokens == len(tiny_corpus.read_text())
    assert [d.name for d in root.iterdir()] == [p.dir.name]


HOLD = ("import sys, time\nfrom pathlib import Path\nfrom data.cache import _take\nlock = _take(Path(sys.argv[1]))\n"
        "print('held', flush=True)\ntime.sleep(600)\n")


@pytest.mark.slow
def test_a_live_builders_directory_is_left_alone_and_a_killed_ones_removed(tiny_corpus):
    """Whether a `.tmp-*`'s builder lives is its lock: held (another process at work: not adopted, even of the same
    key), or dropped by the OS (a killed run: with nothing to continue from, removed). Another machine's is left."""
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p = prepare(cfg, progress=False)
    shutil.rmtree(p.dir)
    live, killed = p.dir.parent / ".tmp-live", p.dir.parent / ".tmp-killed"
    elsewhere = p.dir.parent / ".tmp-another_host-1234-0123456789ab"  # its lock may not reach here: left alone
    for d in (live, killed, elsewhere):
        d.mkdir()
        (d / "train-00000.bin").write_bytes(b"\0" * 100)  # a half-written shard
    (live / "progress.json").write_text(json.dumps({"head": {"key": p.meta["key"]}, "shards": []}))
    builders = [subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(REPO))) for d in (live, killed)]
    try:
        assert [b.stdout.readline().strip() for b in builders] == ["held", "held"]
        builders[1].kill()  # SIGKILL; TerminateProcess on Windows
        builders[1].wait()
        p2 = prepare(cfg, progress=False)
        assert not killed.exists() and p2.dir == p.dir and TokenFile(p2.train_path).count == p2.train_tokens
        assert sorted(f.name for f in live.iterdir()) == ["progress.json", "train-00000.bin"] and elsewhere.is_dir()
    finally:
        for b in builders:
            b.kill()
            b.wait()
    assert [f.name for f in (p.dir.parent.parent / "prepared.locks").iterdir()] == [live.name]


def test_load_prepared_checks_meta(tiny_corpus):
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    assert load_prepared(p.dir).meta == p.meta
    meta = json.loads((p.dir / "meta.json").read_text())
    meta["train_tokens"] += 1
    (p.dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="do not match"):
        load_prepared(p.dir)
    (p.dir / "meta.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_prepared(p.dir)


def test_cache_keys_of_existing_inputs_are_unchanged(tmp_path, cache_with_gpt2):
    """Keys computed with the code before documents/jsonl existed: those caches stay valid. A directory with
    GPT-2 now gets <|endoftext|> between its files, so its key had to change."""
    assert cache_key(sources.SHAKESPEARE_SHA256, "char", 0.1, "strict") == "6f6a4e890b805290"  # shakespeare_char
    assert cache_key(sources.SHAKESPEARE_SHA256, "gpt2", 0.1, "strict") == "636eb1f2f28c7cf8"  # shakespeare
    one = tmp_path / "one.txt"
    one.write_text("hello world\nsecond line\n")
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("first document\n")
    (d / "sub" / "b.txt").write_text("second document\n")
    for path, tok, name in [(one, "char", "text-char-0b0035bba3ade2bc"), (d, "char", "text-char-019f0081c1488eb0"),
                            (one, "gpt2", "text-gpt2-77f999037f34bbaf")]:
        assert prepare(DataConfig(name="text", path=str(path), tokenizer=tok), progress=False).dir.name == name
    p = prepare(DataConfig(name="text", path=str(d), tokenizer="gpt2"), progress=False)
    assert p.dir.name != "text-gpt2-9af09a7fe917c5c5" and 50256 in TokenFile(p.train_path).tokens


def test_overwritten_token_ids_are_prepared_again(tiny_corpus, capsys):
    cfg = DataConfig(name="text", path=str(tiny_corpus))
    p = prepare(cfg, progress=False)
    good = p.train_path.read_bytes()
    with open(p.train_path, "r+b") as f:  # same size, ids far outside the 30-odd-character vocabulary
        f.seek(len(good) // 2)
        f.write(b"\xff" * 64)
    with pytest.raises(ValueError, match="is corrupt: it holds token id 65,535 but its vocabulary has"):
        TokenFile(p.train_path)
    p2 = prepare(cfg, progress=True)
    assert not p2.cached and p2.train_path.read_bytes() == good
    err = capsys.readouterr().err
    assert "damaged" in err and "token id 65,535" in err


def test_read_only_cache_names_the_cache(tiny_corpus, monkeypatch):
    root = sources.cache_dir() / "prepared"
    mkdir = Path.mkdir

    def deny(self, *a, **k):
        if self.name.startswith(".tmp-"):
            raise PermissionError(13, "Permission denied", str(self))
        return mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", deny)
    with pytest.raises(PermissionError) as ei:
        prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    assert str(ei.value) == (f"the data cache {root} is not writable (Permission denied): make it writable, or set "
                             f"TINYGPT_CACHE to a writable directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode")
def test_read_only_cache_for_real(tiny_corpus):
    root = sources.cache_dir()
    root.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match=f"the data cache {root / 'prepared'} is not writable"):
            prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    finally:
        root.chmod(0o700)
