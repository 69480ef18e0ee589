"""checkpoint/file.py: atomic saves and safe loads with one-line errors (format 1 round trip)."""
from __future__ import annotations

import errno
import hashlib
import os
import pickle
import re
import shutil
import subprocess

import pytest
import torch

from checkpoint import file as ck
from checkpoint.file import model_from_checkpoint
from training.state import capture_rng_state
from tests.helpers import find_non_plain


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


def test_stale_temp_files_are_removed(rd):
    (rd / ".last.pt.123.abcd.tmp").write_bytes(b"x")
    (rd / "last.pt").write_bytes(b"keep")
    assert ck.remove_stale_temp_files(rd) == 1
    assert [f.name for f in rd.iterdir()] == ["last.pt"]
