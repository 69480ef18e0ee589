"""One run per directory: an exclusive `flock` on `<dir>/.lock`, held until the process exits.

The kernel drops the lock when its holder dies (kill -9 too), so a dead run's lock is taken over with no
clean-up. The file records who holds it (pid, host, start, command) for the refusal to name, and stays
after the run: removing it could let two runs lock two different files of the same name.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

LOCK_NAME = ".lock"
_held: dict[str, int] = {}  # resolved directory -> the open, locked file descriptor


class DirectoryInUse(Exception):
    """Another live process holds the directory's lock; str() describes that process."""


def _describe(raw: bytes) -> str | None:
    try:
        h = json.loads(raw.decode())
        cmd = h["command"] if len(h["command"]) <= 120 else h["command"][:117] + "..."
        return f"pid {h['pid']} on host {h['host']}, started {h['started']}: {cmd}"
    except (ValueError, KeyError, TypeError):  # not written yet, or not a tinygpt lock file
        return None


def acquire(directory: str | os.PathLike) -> bool:
    """Create `directory` and lock it for this process (again in the same process: no-op). False where the
    filesystem has no locks; DirectoryInUse naming the holder where another process has it; OSError else."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(d)
    if key in _held:
        return True
    try:
        fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:  # someone else's lock file: it can still be locked, not written
        fd = os.open(d / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    for attempt in range(3):  # a few tries: holder() may be probing the lock for a moment
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and attempt < 2:
                time.sleep(0.05)
                continue
            raw = os.pread(fd, 4096, 0)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DirectoryInUse(_describe(raw) or "details not yet written") from None
            if e.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                return False
            raise
    _held[key] = fd
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join([os.path.basename(sys.executable), *sys.argv])}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    except OSError:  # read-only lock file: the lock holds all the same
        pass
    return True


def holder(directory: str | os.PathLike) -> str | None:
    """Who holds `directory`'s lock, when another live tinygpt process does; else None. A probe: keeps nothing."""
    lock = Path(directory) / LOCK_NAME
    if os.path.realpath(directory) in _held or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError as e:
        return _describe(os.pread(fd, 4096, 0)) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)


def release(directory: str | os.PathLike) -> None:
    """Unlock now (tests); exiting the process does the same."""
    fd = _held.pop(os.path.realpath(directory), None)
    if fd is not None:
        os.close(fd)
