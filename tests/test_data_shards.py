"""data/shards.py: a split read across shards as one sequence, sharded preparation (same tokens, same batches),
continuing after an interrupt or kill -9, and two preparations of one corpus at once."""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from data import shards, sources
from data.config import DataConfig
from data.loader import BatchLoader, TokenShards, write_token_file
from data.prepare import load_prepared, prepare
from data.shards import ShardWriter, skip_chars
from tests.test_data_prepare import small_chunks, tokens


def _all(p, split):
    return np.concatenate([tokens(f) for f in (p.train_paths if split == "train" else p.val_paths)])


def test_windows_run_across_shard_boundaries(tmp_path):
    ids = np.random.default_rng(0).integers(0, 500, size=1000)
    cuts = [0, 7, 300, 301, 1000]  # includes a one-token shard
    ts = TokenShards([write_token_file(tmp_path / f"s{i}.bin", ids[a:b], 500)
                      for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    assert len(ts) == 1000 and ts.vocab_size == 500
    offsets = np.array([0, 5, 6, 295, 299, 300, 301, 700, 1000 - 20])
    assert np.array_equal(ts.windows(offsets, 20), ids[offsets[:, None] + np.arange(20)])


def test_skip_chars_drops_separators_before_the_point():
    stream = [("train", "abc", False), ("train", None, False), ("train", "de", True), ("val", None, False),
              ("val", "fg", False), ("val", "", True)]
    assert list(skip_chars(iter(stream), 3)) == stream[1:]  # the separator right after char 3 is still to write
    assert list(skip_chars(iter(stream), 4)) == [("train", "e", True)] + stream[3:]
    assert list(skip_chars(iter(stream), 5)) == stream[3:]


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_sharded_preparation_has_the_same_tokens_and_batches(tmp_path, tiny_corpus, monkeypatch, tokenizer,
                                                             cache_with_gpt2):
    small_chunks(monkeypatch, chunk=2048, seg=500)
    cfg = DataConfig(name="text", path=str(tiny_corpus), tokenizer=tokenizer)
    whole = prepare(cfg, progress=False)
    wtrain, wval = _all(whole, "train"), _all(whole, "val")
    name = whole.dir.name
    os.rename(whole.dir, tmp_path / "whole")
    whole = load_prepared(tmp_path / "whole")
    sharded = prepare(cfg, progress=False, shard_tokens=1000)
    assert len(sharded.train_paths) > 3 and sharded.dir.name == name  # same key
    assert np.array_equal(_all(sharded, "train"), wtrain) and np.array_equal(_all(sharded, "val"), wval)
    loaders = [BatchLoader(*p.token_files(), 32, 8, seed=3) for p in (whole, sharded)]
    for _ in range(5):
        (x1, y1), (x2, y2) = (ld.next_batch() for ld in loaders)
        assert x1.equal(x2) and y1.equal(y2)
    assert loaders[0].eval_batch("val", 1)[0].equal(loaders[1].eval_batch("val", 1)[0])


def test_interrupt_keeps_finished_shards_and_a_rerun_does_the_rest(tiny_corpus, monkeypatch, cache_with_gpt2):
    small_chunks(monkeypatch, chunk=2048, seg=500)
    cfg = DataConfig(name="text", path=str(tiny_corpus), tokenizer="gpt2")
    close, calls = ShardWriter._close, {"n": 0}

    def interrupted_close(self):
        calls["n"] += self._w is not None
        close(self)
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C after the third shard

    monkeypatch.setattr(ShardWriter, "_close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, progress=False, shard_tokens=300)
    root = sources.cache_dir() / "prepared"
    (partial,) = root.iterdir()
    assert partial.name.startswith(".tmp-") and sorted(f.name for f in partial.glob("*.bin")) == \
        ["train-00000.bin", "train-00001.bin", "train-00002.bin"]
    kept = {f.name: f.stat().st_ino for f in partial.glob("*.bin")}
    monkeypatch.setattr(ShardWriter, "_close", close)
    written = []
    monkeypatch.setattr(ShardWriter, "write", lambda self, split, ids, chars, w=ShardWriter.write:
                        (written.append(len(ids)), w(self, split, ids, chars))[1])
    p = prepare(cfg, progress=False, shard_tokens=300)
    assert {f.name: f.stat().st_ino for f in p.train_paths[:3]} == kept  # the same files, moved with the directory
    assert [d.name for d in root.iterdir()] == [p.dir.name]
    assert sum(written) == p.train_tokens + p.val_tokens - sum(len(tokens(f)) for f in p.train_paths[:3])
    text = tiny_corpus.read_text()
    n = int(len(text) * 0.9)
    assert p.tokenizer.decode(_all(p, "train").tolist()) == text[:n]
    assert p.tokenizer.decode(_all(p, "val").tolist()) == text[n:]


def test_a_changed_head_starts_over(tmp_path):
    w = ShardWriter(tmp_path, 10, 4, {"key": "a"})
    w.resume()
    w.write("train", np.arange(5), 5)
    assert w.files("train") == ["train-00000.bin"]
    w2 = ShardWriter(tmp_path, 10, 4, {"key": "b"})
    assert w2.resume() == 0 and not list(tmp_path.glob("*.bin"))


_KILL_AFTER_THIRD_SHARD = """
import os, signal, sys
from data.config import DataConfig
from data.prepare import load_prepared, prepare
from data.shards import ShardWriter
close, n = ShardWriter._close, [0]
def killed(self):
    n[0] += self._w is not None
    close(self)
    if n[0] == 3:
        os.kill(os.getpid(), signal.SIGKILL)
ShardWriter._close = killed
prepare(DataConfig(name="text", path=sys.argv[1]), progress=False, shard_tokens=2000)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9")
def test_kill_9_then_rerun_keeps_the_finished_shards(tiny_corpus):
    r = subprocess.run([sys.executable, "-c", _KILL_AFTER_THIRD_SHARD, str(tiny_corpus)], cwd=os.getcwd(),
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == -signal.SIGKILL
    (partial,) = (sources.cache_dir() / "prepared").iterdir()
    assert len(list(partial.glob("train-*.bin"))) == 3
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False, shard_tokens=2000)
    text = tiny_corpus.read_text()
    assert p.tokenizer.decode(_all(p, "train").tolist() + _all(p, "val").tolist()) == text
    assert [d.name for d in p.dir.parent.iterdir()] == [p.dir.name]


def _prepare_together(path, barrier, out):
    ShardWriter.resume = lambda self, r=ShardWriter.resume: (barrier.wait(60), r(self))[1]  # both inside staging
    p = prepare(DataConfig(name="text", path=path), progress=False, shard_tokens=3000)
    out.put((str(p.dir), p.train_tokens, _all(p, "train").tobytes()))


@pytest.mark.slow
def test_two_preparations_at_once_do_not_corrupt_the_cache(tiny_corpus):
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_prepare_together, args=(str(tiny_corpus), barrier, out)) for _ in range(2)]
    for pr in procs:
        pr.start()
    results = [out.get(timeout=120) for _ in procs]
    for pr in procs:
        pr.join(60)
        assert pr.exitcode == 0
    assert results[0] == results[1]
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False, shard_tokens=3000)
    assert p.cached and str(p.dir) == results[0][0] and _all(p, "train").tobytes() == results[0][2]
    assert [d.name for d in p.dir.parent.iterdir()] == [p.dir.name]  # no temp leftovers
    assert not (p.dir / shards.PROGRESS).exists()
