"""checkpoint/file.py: atomic saves and safe loads with one-line errors (format 1 round trip); which checkpoint a
path, a run directory or the newest run means, reading it, and loading it for inference."""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from checkpoint import file as ck
from checkpoint.file import (CheckpointError, check_vocab, save_checkpoint, checkpoint_in_run, load_for_inference,
                             model_from_checkpoint, read_checkpoint)
from checkpoint.locate import find_newest_checkpoint, resolve_checkpoint
from training.state import capture_rng_state
from tests.helpers import find_non_plain, save_run, tiny_model


def _ckpt(tiny_gpt_config, **extra):
    from model.gpt import GPT
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config)
    d = {"format": "tinygpt", "version": 1, "step": 3, "best_val_loss": 1.5,
         "model": model.state_dict(), "model_config": tiny_gpt_config.to_dict(),
         "tokenizer": {"type": "char", "chars": "ab"}, "optimizer": None, "scaler": None, "config": {},
         "rng": capture_rng_state(), "loader": {"step": 3, "micro": 0}, "wandb_run_id": None}
    d.update(extra)
    return d, model


@pytest.fixture
def rd(tmp_path):
    """An empty directory (tmp_path itself also holds the hermetic fixture's cache dir)."""
    out = tmp_path / "run"
    out.mkdir()
    return out


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_round_trip_is_plain_and_weights_only(rd, tiny_gpt_config):
    d, model = _ckpt(tiny_gpt_config)
    assert find_non_plain(d) is None
    p = ck.save_checkpoint(d, rd / "last.pt")
    raw = torch.load(p, weights_only=True)  # the contract: plain containers only
    assert raw["step"] == 3
    loaded = ck.load_checkpoint(p)
    rebuilt = model_from_checkpoint(loaded)
    assert not rebuilt.training
    for k, v in model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[k], v)
    assert [f.name for f in rd.iterdir()] == ["last.pt"]  # no temp files left


def test_failed_save_keeps_the_previous_file(rd, tiny_gpt_config, monkeypatch):
    d, _ = _ckpt(tiny_gpt_config)
    p = ck.save_checkpoint(d, rd / "last.pt")
    before = _sha(p)
    real_save = torch.save

    def half_then_fail(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 partial bytes")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(OSError, match="could not write checkpoint .*: no space left on device .*intact") as info:
        ck.save_checkpoint(dict(d, step=4), p)
    assert "\n" not in str(info.value)
    assert _sha(p) == before
    assert [f.name for f in rd.iterdir()] == ["last.pt"]

    def runtime_fail(obj, f, *a, **kw):  # torch's zip writer reports a full disk as RuntimeError
        real_save({"x": 1}, f)
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", runtime_fail)
    with pytest.raises(OSError, match="could not write checkpoint"):
        ck.save_checkpoint(dict(d, step=5), p)
    assert _sha(p) == before and ck.load_checkpoint(p)["step"] == 3


NO_SPACE = "no space left on device (the previous last.pt, if any, is intact): free some disk space and resume"


def test_full_disk_reported_by_torchs_zip_writer_says_no_space_left(rd, tiny_gpt_config, monkeypatch):
    """torch's zip writer turns ENOSPC into "[enforce fail at inline_container.cc:672] . unexpected pos ...",
    sometimes with the OSError in the chain, sometimes without: both read "no space left on device"."""
    d, _ = _ckpt(tiny_gpt_config)
    p = ck.save_checkpoint(d, rd / "last.pt")
    before = _sha(p)
    zip_error = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"

    def chained(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 partial bytes")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(zip_error)

    def bare(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 partial bytes")
        raise RuntimeError(zip_error)

    real_usage = shutil.disk_usage
    for save, free in ((chained, None), (bare, 4096)):
        monkeypatch.setattr(torch, "save", save)
        if free is not None:  # a full disk: the partial temp file took the last bytes
            monkeypatch.setattr(shutil, "disk_usage", lambda d: real_usage(d)._replace(free=free))
        with pytest.raises(OSError) as info:
            ck.save_checkpoint(dict(d, step=4), p)
        msg = str(info.value)
        assert msg.startswith(f"could not write checkpoint {p}: {NO_SPACE}") and "\n" not in msg, msg
        assert f"hydra.run.dir=<a directory there> train.resume={rd}" in msg and "unexpected pos" not in msg
        assert info.value.errno == errno.ENOSPC
        assert _sha(p) == before and [f.name for f in rd.iterdir()] == ["last.pt"]
    monkeypatch.setattr(shutil, "disk_usage", real_usage)  # room left: torch's own words stay
    with pytest.raises(OSError, match="could not write checkpoint .*: \\[enforce fail at inline_container"):
        ck.save_checkpoint(dict(d, step=5), p)


@pytest.mark.slow
def test_a_really_full_filesystem_says_no_space_left(rd, tiny_gpt_config):
    """The real thing, where a 1 MiB tmpfs can be mounted (root on Linux): torch.save's own error."""
    small = rd / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        d, _ = _ckpt(tiny_gpt_config)
        ck.save_checkpoint(d, small / "last.pt")
        before = _sha(small / "last.pt")
        with pytest.raises(OSError, match=f"could not write checkpoint .*: {re.escape(NO_SPACE)}"):
            ck.save_checkpoint(dict(d, big=torch.zeros(1 << 20)), small / "last.pt")  # 4 MiB
        assert _sha(small / "last.pt") == before and [f.name for f in small.iterdir()] == ["last.pt"]
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_unwritable_directory_is_one_line_oserror(rd, tiny_gpt_config):
    d, _ = _ckpt(tiny_gpt_config)
    (rd / "file").write_text("a file where a directory should be")  # fails even for root
    with pytest.raises(OSError, match="could not write checkpoint") as info:
        ck.save_checkpoint(d, rd / "file" / "last.pt")
    assert "\n" not in str(info.value)


def test_link_keeps_old_bytes_when_source_is_replaced(rd, tiny_gpt_config):
    d, _ = _ckpt(tiny_gpt_config)
    last = ck.save_checkpoint(d, rd / "last.pt")
    best = ck.link_checkpoint(last, rd / "best.pt")
    ck.save_checkpoint(dict(d, step=9), last)
    assert ck.load_checkpoint(best)["step"] == 3
    assert ck.load_checkpoint(last)["step"] == 9


class Payload:  # a class the weights-only unpickler must refuse
    def __init__(self):
        self.x = 1


def test_pickled_object_is_refused(rd):
    p = rd / "evil.pt"
    torch.save({"format": "tinygpt", "version": 1, "obj": Payload()}, p)
    with pytest.raises(ck.CheckpointError, match="pickled Python object .*Payload.*refuses to load") as info:
        ck.load_checkpoint(p)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind, match", [
    ("missing", "does not exist"),
    ("empty", "is empty"),
    ("truncated", "truncated or corrupt"),
    ("garbage", r"not a PyTorch checkpoint \(unreadable pickle data\)"),  # torch's unpickler: IndexError
    ("short_text", r"not a PyTorch checkpoint \(unreadable pickle data\)"),  # KeyError, not "(KeyError)"
    ("raw_pickle", r"not a PyTorch checkpoint \(unreadable pickle data\)"),
    ("not_tinygpt", "not a tinygpt checkpoint"),
    ("newer", "newer tinygpt"),
    ("incomplete", "lacks model"),
    ("directory", "is a directory"),
])
def test_unusable_files_give_one_line_errors(rd, tiny_gpt_config, kind, match):
    p = rd / "x.pt"
    d, _ = _ckpt(tiny_gpt_config)
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "truncated":
        ck.save_checkpoint(d, p)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif kind == "garbage":
        p.write_bytes(b"this is not a checkpoint at all" * 10)
    elif kind == "short_text":
        p.write_bytes(b"hello\n")
    elif kind == "raw_pickle":
        p.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    elif kind == "not_tinygpt":
        torch.save({"weights": torch.ones(2)}, p)
    elif kind == "newer":
        ck.save_checkpoint(dict(d, version=99), p)
    elif kind == "incomplete":
        ck.save_checkpoint({k: v for k, v in d.items() if k != "model"}, p)
    elif kind == "directory":
        p.mkdir()
    with pytest.raises(ck.CheckpointError, match=match) as info:
        ck.load_checkpoint(p)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_an_unusable_checkpoint_advises_one_that_reads_never_itself(rd, tiny_gpt_config):
    """Issue 43: a corrupt best.pt said "use another checkpoint, e.g. best.pt" while a good last.pt sat beside it.
    The advice names the run's other checkpoint when that one reads (also through sample.py's --run, which picks
    best.pt), and no file when none does (the other one corrupt too, or a hard link of the same bytes)."""
    d, _ = _ckpt(tiny_gpt_config)
    save_checkpoint(d, rd / "last.pt")
    good = (rd / "last.pt").read_bytes()
    beside = f"use {rd / 'last.pt'} beside it instead"
    for bad, what in ((good[: len(good) // 2], f"checkpoint {rd / 'best.pt'} is truncated or corrupt ("),
                      (b"", f"checkpoint {rd / 'best.pt'} is empty (0 bytes; an interrupted copy?): "),
                      (b"not a checkpoint" * 10, f"{rd / 'best.pt'} is not a PyTorch checkpoint (unreadable pickle "
                                                 f"data): ")):
        (rd / "best.pt").write_bytes(bad)
        for path in (rd / "best.pt", rd):  # (a run directory: best.pt first)
            with pytest.raises(CheckpointError) as info:
                read_checkpoint(path, model=True, run_dir=True)
            msg = str(info.value)
            assert msg.startswith(what) and beside in msg and "e.g. best.pt" not in msg, msg
    save_checkpoint({k: v for k, v in d.items() if k != "model"}, rd / "best.pt")
    with pytest.raises(CheckpointError, match=f"lacks model: it is incomplete; {re.escape(beside)}"):
        read_checkpoint(rd / "best.pt")
    (rd / "best.pt").write_bytes(good[:100])
    (rd / "last.pt").write_bytes(good[:200])  # both corrupt: no file named
    with pytest.raises(CheckpointError, match=r"truncated or corrupt \(.*\): use another checkpoint, or train again$"):
        read_checkpoint(rd / "best.pt")
    (rd / "best.pt").unlink()
    os.link(rd / "last.pt", rd / "best.pt")  # the same bytes under both names (train.py links them)
    with pytest.raises(CheckpointError, match="use another checkpoint, or train again$"):
        read_checkpoint(rd / "last.pt")


def test_stale_temp_files_are_removed(rd):
    (rd / ".last.pt.123.abcd.tmp").write_bytes(b"x")
    (rd / "last.pt").write_bytes(b"keep")
    assert ck.remove_stale_temp_files(rd) == 1
    assert [f.name for f in rd.iterdir()] == ["last.pt"]


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))


def test_checkpoint_in_run_prefers_best(tmp_path):
    _touch(tmp_path / "run" / "last.pt", time.time())
    assert checkpoint_in_run(tmp_path / "run") == tmp_path / "run" / "last.pt"
    _touch(tmp_path / "run" / "best.pt", time.time() - 100)
    assert checkpoint_in_run(tmp_path / "run") == tmp_path / "run" / "best.pt"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no best.pt or last.pt: has its training saved a checkpoint yet"):
        checkpoint_in_run(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="run directory .*nope does not exist"):
        checkpoint_in_run(tmp_path / "nope")


def test_find_newest_checkpoint_prefers_newest_run_then_best(tmp_path):
    t = time.time()
    _touch(tmp_path / "outputs/2026-01-01/10-00-00/best.pt", t - 500)
    _touch(tmp_path / "outputs/2026-01-02/10-00-00/best.pt", t - 300)
    _touch(tmp_path / "outputs/2026-01-02/10-00-00/last.pt", t - 100)  # newer, but best.pt is preferred
    _touch(tmp_path / "multirun/2026-01-01/09-00-00/0/last.pt", t - 200)
    assert find_newest_checkpoint() == Path("outputs/2026-01-02/10-00-00/best.pt")
    _touch(tmp_path / "multirun/2026-01-01/09-00-00/1/last.pt", t - 10)
    assert find_newest_checkpoint() == Path("multirun/2026-01-01/09-00-00/1/last.pt")
    assert find_newest_checkpoint(roots=("nowhere",)) is None


def test_resolve_checkpoint(tmp_path, capsys):
    assert resolve_checkpoint(checkpoint="x.pt") == Path("x.pt")
    with pytest.raises(FileNotFoundError, match=r"no trained model found under \./outputs or \./multirun .* --hf DIR"):
        resolve_checkpoint(other="--hf DIR")
    _touch(tmp_path / "outputs/a/last.pt", time.time())
    assert resolve_checkpoint() == Path("outputs/a/last.pt")
    assert resolve_checkpoint(run="outputs/a") == Path("outputs/a/last.pt")
    assert capsys.readouterr().err.splitlines() == ["using outputs/a/last.pt (newest run)", "using outputs/a/last.pt"]


@pytest.mark.parametrize("fsdp", [False, True])
def test_load_for_inference(tmp_path, fsdp):
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer("abcdefgh")
    model = tiny_model(10, bias=False, tie_weights=False)
    path = save_run(tmp_path, model, tok, name="last.pt", fsdp=fsdp)
    loaded, tok_dict, ckpt = load_for_inference(path, "cpu")
    assert tok_dict == tok.to_dict() and ckpt["step"] == 10 and not loaded.training
    assert next(loaded.parameters()).dtype == torch.float32
    idx = torch.tensor([[1, 2, 3, 9]])
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    check_vocab(8, loaded)
    with pytest.raises(ValueError, match="the tokenizer has 11 tokens but the model only 10"):
        check_vocab(11, loaded)


def test_load_for_inference_errors(tmp_path):
    from data.tokenizer import CharTokenizer
    model = tiny_model(8)
    path = save_run(tmp_path, model, CharTokenizer("abcdefgh"))
    ckpt = torch.load(path, weights_only=True)
    for change, message in ((dict(tokenizer=None), "has no tokenizer: it was not written by train.py"),
                            (dict(model=None), "holds no model weights"),
                            (dict(model_config={**ckpt["model_config"], "n_layer": 3}), "do not match the model")):
        bad = {**ckpt, **change}
        if change.get("tokenizer", 0) is None:
            del bad["tokenizer"]
        save_checkpoint(bad, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match=message):
            load_for_inference(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="does not exist"):
        load_for_inference(tmp_path / "missing.pt")


def test_model_from_checkpoint_fits_or_says_why_in_one_line():
    model = tiny_model(8)
    ckpt = {"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},  # torch.compile's prefixes
            "model_config": model.config.to_dict()}
    rebuilt = model_from_checkpoint(ckpt)
    assert not rebuilt.training and torch.equal(rebuilt.lm_head.weight, model.lm_head.weight)
    ckpt["model_config"]["n_embd"] = 32
    with pytest.raises(ValueError, match="the weights in the checkpoint do not match the model") as info:
        model_from_checkpoint(ckpt)
    assert "\n" not in str(info.value)


def test_read_checkpoint_run_dir_rule_and_model(tmp_path):
    from data.tokenizer import CharTokenizer
    model, tok = tiny_model(8), CharTokenizer("abcdefgh")
    last = save_run(tmp_path, model, tok, name="last.pt")
    assert read_checkpoint(tmp_path, run_dir=True, model=True)[0] == last
    best = save_run(tmp_path, model, tok, name="best.pt")
    assert read_checkpoint(tmp_path, run_dir=True, model=True)[0] == best
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        read_checkpoint(tmp_path, model=True)
    (tmp_path / "sub").mkdir()
    with pytest.raises(FileNotFoundError, match="has no best.pt or last.pt"):
        read_checkpoint(tmp_path / "sub", run_dir=True, model=True)
