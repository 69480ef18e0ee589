"""common/lock.py: one live process per directory, a dead holder's lock taken over, the holder named; on POSIX
(flock) and on a simulated Windows (no fcntl, no os.pread: msvcrt's byte lock, emulated with a record lock)."""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import types

import pytest

from common import run_lock
from tests.helpers import REPO

HOLD = "import sys, time\nfrom common.run_lock import acquire\nacquire(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(600)\n"

# msvcrt.locking as Windows behaves: one exclusive byte range, EACCES when another process holds it. Windows
# locks are mandatory (a locked range cannot be read), so the fake refuses to lock the holder record's bytes.
FAKE_MSVCRT = """
import errno, fcntl as _fcntl, os
LK_UNLCK, LK_LOCK, LK_NBLCK, LK_RLCK, LK_NBRLCK = 0, 1, 2, 3, 4
def locking(fd, mode, nbytes):
    start = os.lseek(fd, 0, os.SEEK_CUR)
    assert start >= 4096, "a lock over the holder record would make it unreadable on Windows"
    writable = _fcntl.fcntl(fd, _fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY  # a record lock's rule, not Windows'
    op = _fcntl.LOCK_UN if mode == LK_UNLCK else (_fcntl.LOCK_EX if writable else _fcntl.LOCK_SH) | _fcntl.LOCK_NB
    try:
        _fcntl.lockf(fd, op, nbytes, start, os.SEEK_SET)
    except OSError:
        raise OSError(errno.EACCES, "Permission denied") from None
"""
AS_WINDOWS = """
import os, sys, types
msvcrt = types.ModuleType("msvcrt")
exec(FAKE, msvcrt.__dict__)
sys.modules["msvcrt"], sys.modules["fcntl"] = msvcrt, None
del os.pread, os.pwrite, os.O_CLOEXEC
""".replace("FAKE", repr(FAKE_MSVCRT))


@pytest.fixture(params=["native", "simulated-windows"])
def lock(request, monkeypatch):
    """The run_lock module as this system has it, or as it loads on Windows (a fresh copy of the module)."""
    if request.param == "native":
        return run_lock
    if os.name == "nt":
        pytest.skip("this is Windows: the native case is the real one")
    msvcrt = types.ModuleType("msvcrt")
    exec(FAKE_MSVCRT, msvcrt.__dict__)
    monkeypatch.setitem(sys.modules, "msvcrt", msvcrt)
    monkeypatch.setitem(sys.modules, "fcntl", None)
    for name in ("pread", "pwrite", "O_CLOEXEC"):
        monkeypatch.delattr(os, name)
    spec = importlib.util.spec_from_file_location("run_lock_on_windows", REPO / "common" / "run_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.fcntl is None and module.msvcrt is msvcrt
    return module


@pytest.fixture
def holder(lock):
    """Start processes that lock a directory (with `lock`'s backend) and sleep; killed at the end of the test."""
    procs = []
    prelude = AS_WINDOWS if lock is not run_lock else ""

    def start(directory) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", prelude + HOLD, str(directory)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_acquire_makes_the_directory_and_records_the_holder(tmp_path, lock):
    d = tmp_path / "runs" / "a"
    try:
        assert lock.acquire(d) is True
        assert lock.acquire(d) is True  # the same process again: a no-op
        info = json.loads((d / lock.LOCK_NAME).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert info["started"] and "python" in info["command"]
        assert lock.holder(d) is None  # this process is not "another" one
    finally:
        lock.release(d)


@pytest.mark.slow
def test_a_second_process_is_refused_and_told_who_holds_it(tmp_path, lock, holder):
    p = holder(tmp_path / "run")
    with pytest.raises(lock.DirectoryInUse) as info:
        lock.acquire(tmp_path / "run")
    assert f"pid {p.pid} on host {socket.gethostname()}, started " in str(info.value)
    assert "python -c" in str(info.value)
    assert lock.holder(tmp_path / "run") == str(info.value)
    assert lock.holder(tmp_path) is None  # no lock file there


@pytest.mark.slow
def test_a_killed_holders_lock_is_taken_over(tmp_path, lock, holder):
    d = tmp_path / "run"
    p = holder(d)
    p.kill()  # SIGKILL; TerminateProcess on Windows
    p.wait()
    try:
        assert lock.acquire(d) is True  # the kernel dropped the dead process's lock
        assert json.loads((d / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release(d)


@pytest.mark.slow
def test_release_lets_another_process_in(tmp_path, lock, holder):
    d = tmp_path / "run"
    lock.acquire(d)
    lock.release(d)
    p = holder(d)  # would not print "held" if the lock were still ours
    assert str(p.pid) in lock.holder(d)
