"""data/loader.py: token-file header checks, batches, global-batch determinism, resume, eval independence."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from data.config import DataConfig
from data.loader import HEADER, HEADER_SIZE, MAGIC, BatchLoader, TokenFile, write_token_file
from data.prepare import prepare


@pytest.fixture
def bins(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 1000, size=5000)
    val = rng.integers(0, 1000, size=700)
    return (write_token_file(tmp_path / "train.bin", train, 1000),
            write_token_file(tmp_path / "val.bin", val, 1000), train, val)


def _loader(bins, **kw):
    args = dict(block_size=16, batch_size=4, seed=123)
    args.update(kw)
    return BatchLoader(bins[0], bins[1], args.pop("block_size"), args.pop("batch_size"), **args)


# ---------------------------------------------------------------------------------------- token files
def test_token_file_roundtrip(bins):
    tf = TokenFile(bins[0])
    assert len(tf) == 5000 and tf.dtype == np.uint16 and tf.vocab_size == 1000
    assert np.array_equal(np.asarray(tf.tokens), bins[2])
    assert bins[0].stat().st_size == HEADER_SIZE + 2 * 5000
    wide = write_token_file(bins[0].parent / "wide.bin", [0, 70_000, 5], 70_001)
    assert TokenFile(wide).dtype == np.uint32 and TokenFile(wide).tokens.tolist() == [0, 70_000, 5]
    empty = write_token_file(bins[0].parent / "empty.bin", [], 10)
    assert len(TokenFile(empty)) == 0


def _corrupt(path, header=None, data=b""):
    raw = path.read_bytes()
    path.write_bytes((header if header is not None else raw[:HEADER_SIZE]) + raw[HEADER_SIZE:] + data)


@pytest.mark.parametrize("damage, match", [
    (lambda p: p.write_bytes(p.read_bytes()[:-3]), "is truncated: the header says 5,000 tokens"),
    (lambda p: p.write_bytes(p.read_bytes()[:10]), "is truncated"),
    (lambda p: _corrupt(p, data=b"xx"), "longer than its header says"),
    (lambda p: _corrupt(p, HEADER.pack(b"NOTTOKEN", 1, 2, 5000, 1000, 0)), "bad magic"),
    (lambda p: _corrupt(p, HEADER.pack(MAGIC, 9, 2, 5000, 1000, 0)), "format version 9"),
    (lambda p: _corrupt(p, HEADER.pack(MAGIC, 1, 3, 5000, 1000, 0)), "unknown token size 3"),
    (lambda p: _corrupt(p, HEADER.pack(MAGIC, 1, 2, 4000, 1000, 0)), "longer than its header says"),
    (lambda p: _corrupt(p, b"\0" * HEADER_SIZE), "bad magic"),  # an unfinished write
])
def test_token_file_damage_is_detected(bins, damage, match):
    damage(bins[0])
    with pytest.raises(ValueError, match=match) as ei:
        TokenFile(bins[0])
    msg = str(ei.value)
    assert "\n" not in msg and str(bins[0]) in msg
    # issue 43: not "or run python -m data.prepare", which prepares the default data set, not this one
    assert msg.endswith(f": delete {bins[0].parent} so that the next run prepares it again"), msg


def test_ids_outside_the_vocabulary_are_refused(bins):
    """Overwritten bytes (same size) would crash the model's embedding with an IndexError: refused at open."""
    raw = bytearray(bins[0].read_bytes())
    raw[HEADER_SIZE + 200:HEADER_SIZE + 202] = (1000).to_bytes(2, "little")  # vocabulary 0..999
    bins[0].write_bytes(bytes(raw))
    for make in (lambda: TokenFile(bins[0]), lambda: _loader(bins)):
        with pytest.raises(ValueError) as ei:
            make()
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(f"{bins[0]} is corrupt: it holds token id 1,000 but its "
                                                  f"vocabulary has 1,000 ids") and "delete" in msg


def test_missing_token_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare"):
        TokenFile(tmp_path / "nope.bin")


# --------------------------------------------------------------------------------------------- batches
def test_batches_are_windows_of_the_data(bins):
    ld = _loader(bins)
    train = bins[2]
    for _ in range(5):
        x, y = ld.next_batch()
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            starts = [i for i in range(len(train) - 16) if np.array_equal(train[i:i + 16], row_x)]
            assert starts and np.array_equal(train[starts[0] + 1:starts[0] + 17], row_y)


def test_offsets_cover_the_whole_range(tmp_path):
    """Windows start anywhere in [0, n - block_size): first and last possible windows both appear."""
    t = write_token_file(tmp_path / "t.bin", np.arange(20), 20)
    ld = BatchLoader(t, t, 16, 8, seed=0)
    starts = set()
    for _ in range(20):
        starts.update(ld.next_batch()[0][:, 0].tolist())
    assert starts == {0, 1, 2, 3}


def test_same_seed_same_batches_different_seed_different(bins):
    a, b, c = _loader(bins), _loader(bins), _loader(bins, seed=124)
    for _ in range(4):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a.next_batch()[0], c.next_batch()[0])


def test_resume_draws_what_an_uninterrupted_run_draws(bins):
    ref = _loader(bins, grad_accum_steps=3)
    expected = [ref.next_batch() for _ in range(14)]
    first = _loader(bins, grad_accum_steps=3)
    got = [first.next_batch() for _ in range(7)]  # stop mid-step (micro 1 of step 2)
    state = first.state_dict()
    assert state == {"step": 2, "micro": 1}
    resumed = _loader(bins, grad_accum_steps=3)
    resumed.load_state_dict(dict(state))
    got += [resumed.next_batch() for _ in range(7)]
    for (xe, ye), (xg, yg) in zip(expected, got):
        assert torch.equal(xe, xg) and torch.equal(ye, yg)


def test_load_state_dict_validates(bins):
    ld = _loader(bins, grad_accum_steps=2)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        ld.load_state_dict({"step": 1, "micro": 5})


@pytest.mark.parametrize("world, accum", [(2, 1), (4, 1), (2, 2)])
def test_global_batch_independent_of_world_size(bins, world, accum):
    """Step s covers the same windows whether split across ranks or micro-steps."""
    total = world * accum
    single = _loader(bins, grad_accum_steps=total)
    ranks = [_loader(bins, grad_accum_steps=accum, rank=r, world_size=world) for r in range(world)]
    for _step in range(3):
        ref = [single.next_batch() for _ in range(total)]  # micro-steps m' = m * world + r
        for m in range(accum):
            for r in range(world):
                x, y = ranks[r].next_batch()
                xr, yr = ref[m * world + r]
                assert torch.equal(x, xr) and torch.equal(y, yr)
    assert single.state_dict() == {"step": 3, "micro": 0}
    assert all(rk.state_dict() == {"step": 3, "micro": 0} for rk in ranks)


def test_bigger_micro_batch_same_global_windows(bins):
    """batch_size=8 x accum=1 draws the rows of batch_size=4 x accum=2."""
    a = _loader(bins, batch_size=8)
    b = _loader(bins, batch_size=4, grad_accum_steps=2)
    for _ in range(3):
        xa, _ = a.next_batch()
        assert torch.equal(xa, torch.cat([b.next_batch()[0], b.next_batch()[0]]))


def test_eval_batches_fixed_and_independent_of_training(bins):
    a, b = _loader(bins), _loader(bins)
    ev = [a.eval_batch("val", i) for i in range(3)]
    for _ in range(5):
        a.next_batch()
    for i in range(3):  # same windows later, and on another loader
        assert torch.equal(a.eval_batch("val", i)[0], ev[i][0]) and torch.equal(b.eval_batch("val", i)[1], ev[i][1])
    # evaluating does not perturb the training draws
    c, d = _loader(bins), _loader(bins)
    for k in range(4):
        c.eval_batch("train", k)
        c.eval_batch("val", k)
        assert torch.equal(c.next_batch()[0], d.next_batch()[0])
    assert not torch.equal(a.eval_batch("val", 0)[0], a.eval_batch("val", 1)[0])
    assert not torch.equal(a.eval_batch("train", 0)[0], a.next_batch()[0])
    assert a.eval_batch("val", 0)[0].max() < 1000
    with pytest.raises(ValueError, match="unknown split"):
        a.eval_batch("test", 0)


def test_split_too_short_says_how_many_and_what_to_change(tmp_path):
    tr = write_token_file(tmp_path / "train.bin", np.arange(100) % 7, 7)
    va = write_token_file(tmp_path / "val.bin", np.arange(10) % 7, 7)
    with pytest.raises(ValueError) as ei:
        BatchLoader(tr, va, 32, 4, seed=0)
    msg = str(ei.value)
    assert "\n" not in msg
    assert "the val split has only 10 tokens but block_size=32 needs at least 33" in msg
    assert "lower block_size to at most 9" in msg and "raise val_fraction to keep more text for validation" in msg
    with pytest.raises(ValueError, match="the train split has only 100 tokens"):
        BatchLoader(tr, va, 128, 4, seed=0)
    BatchLoader(tr, va, 9, 4, seed=0).next_batch()  # exactly block_size + 1 tokens is enough
    # both splits short: the block size offered fits both (not just the first one checked)
    tr = write_token_file(tmp_path / "train.bin", np.arange(60) % 7, 7)
    va = write_token_file(tmp_path / "val.bin", np.arange(12) % 7, 7)
    with pytest.raises(ValueError) as ei:
        BatchLoader(tr, va, 64, 4, seed=0)
    assert str(ei.value).startswith("the train split has only 60 tokens and the val split has only 12 tokens but "
                                    "block_size=64 needs at least 65: lower block_size to at most 11 or use "
                                    "more text (at least 65 tokens in each split; prepared in ")
    BatchLoader(tr, va, 11, 4, seed=0).eval_batch("val", 0)


def test_a_text_too_small_to_train_on_says_so_and_what_it_needs(tmp_path):
    """Issue 43: a 12-character text was told "lower model.block_size to at most 1", a context of one token. A
    fix that leaves less than MIN_CONTEXT tokens is not offered: the text is too small, and how much is needed."""
    from data.loader import MIN_CONTEXT
    text = tmp_path / "short.txt"
    text.write_text("hello world\n", encoding="utf-8")
    p = prepare(DataConfig(name="text", path=str(text)), progress=False)
    assert (p.train_tokens, p.val_tokens) == (10, 2)
    with pytest.raises(ValueError) as ei:
        BatchLoader(p.train_path, p.val_path, 64, 4, seed=0)
    assert str(ei.value) == (f"the text is too small to train on: the train split has only 10 tokens and the val split "
                             f"has only 2 tokens but block_size=64 needs at least 65 in each split: use a longer text "
                             f"(at least 650 tokens with val_fraction=0.1; the text: {text})")
    # ~MIN_CONTEXT tokens in the val split: a context of that size is offered, one token fewer is not
    for n, offered in ((10 * (MIN_CONTEXT + 1), True), (10 * MIN_CONTEXT, False)):
        text.write_text("ab" * (n // 2), encoding="utf-8")
        p = prepare(DataConfig(name="text", path=str(text)), progress=False)
        with pytest.raises(ValueError) as ei:
            BatchLoader(p.train_path, p.val_path, 64, 4, seed=0)
        assert ("lower block_size to at most" in str(ei.value)) == offered, str(ei.value)
        assert str(ei.value).startswith("the text is too small") != offered


def test_bad_loader_arguments(bins):
    for kw, match in [({"batch_size": 0}, "batch_size"), ({"rank": 2, "world_size": 2}, "rank"),
                      ({"grad_accum_steps": 1.5}, "grad_accum_steps")]:
        with pytest.raises(ValueError, match=match):
            _loader(bins, **kw)


def test_loader_on_prepared_data(tiny_corpus):
    p = prepare(DataConfig(name="text", path=str(tiny_corpus)), progress=False)
    ld = BatchLoader(p.train_path, p.val_path, block_size=32, batch_size=2, seed=1)
    x, y = ld.next_batch()
    text = tiny_corpus.read_text()
    for row in x.tolist():
        assert p.tokenizer.decode(row) in text
    assert int(x.max()) < p.tokenizer.vocab_size


def test_header_layout_is_documented():
    assert HEADER_SIZE == 32 and struct.calcsize("<8sIIQII") == 32 and MAGIC == b"TGPTTOK\0"


@pytest.mark.cuda
def test_cuda_batches_are_on_device(bins):
    ld = _loader(bins, device="cuda")
    x, y = ld.next_batch()
    assert x.is_cuda and y.is_cuda and x.dtype == torch.int64
    ref = _loader(bins)
    xr, yr = ref.next_batch()
    assert torch.equal(x.cpu(), xr) and torch.equal(y.cpu(), yr)
