"""launch/hydra_record.py: the .hydra/ files and train.log of a run dir put back byte for byte (and time)."""
from __future__ import annotations

import logging
import os

from launch.hydra_record import RecordSnapshot


def _state(d):
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_refused_resume_leaves_every_file_as_it_was(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("old: 1\n")
    (run / "train.log").write_text("[..] old line\n")
    (run / "last.pt").write_bytes(b"ckpt")
    for p in run.rglob("*"):
        os.utime(p, ns=(1_000_000_000, 1_000_000_000))
    before = _state(run)
    snap = RecordSnapshot(run)
    (run / ".hydra" / "config.yaml").write_text("new: 2\n")  # what Hydra writes for the refused resume
    (run / ".hydra" / "overrides.yaml").write_text("- model.n_layer=3\n")
    handler = logging.FileHandler(run / "train.log")
    logging.getLogger().addHandler(handler)
    logging.getLogger().error("error: refused")
    snap.restore()
    assert handler not in logging.getLogger().handlers
    assert _state(run) == before


def test_a_started_run_keeps_what_hydra_wrote(tmp_path):
    snap = RecordSnapshot(tmp_path)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("new\n")
    snap.keep()
    snap.restore()
    assert (tmp_path / ".hydra" / "config.yaml").read_text() == "new\n"
    fresh = RecordSnapshot(tmp_path / "new")  # a directory Hydra made: its .hydra/ goes again
    (tmp_path / "new" / ".hydra").mkdir(parents=True)
    (tmp_path / "new" / ".hydra" / "hydra.yaml").write_text("x\n")
    fresh.restore()
    assert not (tmp_path / "new" / ".hydra").exists()
