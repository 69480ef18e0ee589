"""common/run_lock.py: one live process per directory, a dead holder's lock taken over, the holder named (its
record read from byte 1 on, as Windows needs), a refused resume's lock file restored, a filesystem without locks."""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from common import run_lock as lock
from tests.helpers import REPO

HOLD = "import sys, time\nfrom common.run_lock import acquire\nacquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n"


def record(d) -> dict:
    """The holder record, read as other processes must while it is held (from byte 1: Windows locks byte 0)."""
    with open(d / lock.LOCK_NAME, "rb") as f:
        f.seek(1)
        return json.loads(f.read())


@pytest.fixture
def holder():
    """Start processes that lock a directory and sleep; killed at the end of the test."""
    procs = []

    def start(directory) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_acquire_makes_the_directory_and_records_the_holder(tmp_path):
    d = tmp_path / "runs" / "a"
    try:
        assert lock.acquire(d) is True
        assert lock.acquire(d) is True  # the same process again: a no-op
        info = record(d)
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert info["started"] and "python" in info["command"]
        assert lock.holder(d) is None  # this process is not "another" one
    finally:
        lock.release(d)


def test_a_refused_resume_leaves_the_lock_file_as_it_was(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / lock.LOCK_NAME).write_bytes(b'\n{"pid": 1, "host": "h", "started": "then", "command": "c"}\n')
    before = (tmp_path / "old" / lock.LOCK_NAME).read_bytes()
    for d in (tmp_path / "old", tmp_path / "new"):
        assert lock.acquire(d) and record(d)["pid"] == os.getpid()
        lock.release(d, undo=True)
    assert (tmp_path / "old" / lock.LOCK_NAME).read_bytes() == before
    assert list((tmp_path / "new").iterdir()) == []


def test_a_filesystem_without_locks_is_said_not_refused(tmp_path, monkeypatch, capsys):
    def no_locks(fd, blocking):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock, "lock_descriptor", no_locks)
    assert lock.acquire(tmp_path / "run") is False
    assert lock.holder(tmp_path / "run") is None
    assert lock.claim(str(tmp_path / "nfs"), "hydra.run.dir") is None
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'nfs'} cannot be locked on this filesystem: make sure "
                                       f"no other run uses it\n")


@pytest.mark.slow
def test_a_second_process_is_refused_and_told_who_holds_it(tmp_path, holder):
    p = holder(tmp_path / "run")
    with pytest.raises(lock.DirectoryInUse) as info:
        lock.acquire(tmp_path / "run")
    assert f"pid {p.pid} on host {socket.gethostname()}, started " in str(info.value)
    assert "python -c" in str(info.value)
    assert lock.holder(tmp_path / "run") == str(info.value)
    assert lock.holder(tmp_path) is None  # no lock file there
    if os.name != "nt":  # byte 0, the one Windows locks (unreadable to others there), garbled: never read
        with open(tmp_path / "run" / lock.LOCK_NAME, "r+b") as f:
            f.write(b"\xff")
        assert lock.holder(tmp_path / "run") == str(info.value)


@pytest.mark.slow
def test_a_killed_holders_lock_is_taken_over(tmp_path, holder):
    d = tmp_path / "run"
    p = holder(d)
    p.kill()  # SIGKILL; TerminateProcess on Windows
    p.wait()
    try:
        assert lock.acquire(d) is True  # the kernel dropped the dead process's lock
        assert record(d)["pid"] == os.getpid()
    finally:
        lock.release(d)


@pytest.mark.slow
def test_release_lets_another_process_in(tmp_path, holder):
    d = tmp_path / "run"
    lock.acquire(d)
    lock.release(d)
    p = holder(d)  # would not print "held" if the lock were still ours
    assert str(p.pid) in lock.holder(d)
