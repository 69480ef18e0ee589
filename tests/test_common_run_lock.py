"""common/run_lock.py: one live process per directory, a dead holder's lock taken over, the holder named."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from common import run_lock
from tests.helpers import REPO

HOLD = "import sys, time\nfrom common.run_lock import acquire\nacquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n"


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
        assert run_lock.acquire(d) is True
        assert run_lock.acquire(d) is True  # the same process again: a no-op
        info = json.loads((d / run_lock.LOCK_NAME).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert info["started"] and "python" in info["command"]
        assert run_lock.holder(d) is None  # this process is not "another" one
    finally:
        run_lock.release(d)


@pytest.mark.slow
def test_a_second_process_is_refused_and_told_who_holds_it(tmp_path, holder):
    p = holder(tmp_path / "run")
    with pytest.raises(run_lock.DirectoryInUse) as info:
        run_lock.acquire(tmp_path / "run")
    assert f"pid {p.pid} on host {socket.gethostname()}, started " in str(info.value)
    assert "python -c" in str(info.value)
    assert run_lock.holder(tmp_path / "run") == str(info.value)
    assert run_lock.holder(tmp_path) is None  # no lock file there


@pytest.mark.slow
def test_a_killed_holders_lock_is_taken_over(tmp_path, holder):
    d = tmp_path / "run"
    p = holder(d)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    try:
        assert run_lock.acquire(d) is True  # the kernel dropped the dead process's lock
        assert json.loads((d / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        run_lock.release(d)


@pytest.mark.slow
def test_release_lets_another_process_in(tmp_path, holder):
    d = tmp_path / "run"
    run_lock.acquire(d)
    run_lock.release(d)
    p = holder(d)  # would not print "held" if the lock were still ours
    assert str(p.pid) in run_lock.holder(d)
