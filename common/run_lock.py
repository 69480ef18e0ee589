"""One run per directory: an exclusive lock on `<dir>/.lock`, held until the process exits.

POSIX: `flock` on the file. Windows: msvcrt's lock on one byte far past the record, since Windows locks are
mandatory and the record must stay readable. Either way the OS drops the lock when its holder dies (kill -9
too), so a dead run's lock is taken over with no clean-up. The file records who holds it (pid, host, start,
command) for the refusal to name, and stays after the run: removing it could let two runs lock two
different files of the same name.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

try:
    import fcntl
    msvcrt = None
    BUSY = (errno.EWOULDBLOCK, errno.EAGAIN)
except ImportError:  # Windows
    import msvcrt
    fcntl = None
    BUSY = (errno.EACCES, errno.EDEADLOCK)  # what msvcrt.locking raises while another process holds the byte

LOCK_NAME = ".lock"
WINDOWS_LOCK_AT = 1 << 30  # the byte msvcrt locks: far past any record, so readers never touch it
_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation
_held: dict[str, int] = {}  # resolved directory -> the open, locked file descriptor
_before: dict[str, bytes | None] = {}  # resolved directory -> its lock file's bytes before acquire (None: none)


class DirectoryInUse(Exception):
    """Another live process holds the directory's lock; str() describes that process."""


def _describe(raw: bytes) -> str | None:
    try:
        h = json.loads(raw.decode())
        cmd = h["command"] if len(h["command"]) <= 120 else h["command"][:117] + "..."
        return f"pid {h['pid']} on host {h['host']}, started {h['started']}: {cmd}"
    except (ValueError, KeyError, TypeError):  # not written yet, or not a tinygpt lock file
        return None


def _lock(fd: int, shared: bool = False) -> None:
    """Lock `fd` without waiting; OSError with an errno in BUSY while another process holds it."""
    if fcntl is not None:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    else:  # no shared locks on Windows: a probe takes the byte for a moment
        os.lseek(fd, WINDOWS_LOCK_AT, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)


def _close(fd: int, locked: bool) -> None:
    """Close `fd`, dropping its lock (Windows unlocks first: a closed handle's lock may linger a moment)."""
    if locked and msvcrt is not None:
        os.lseek(fd, WINDOWS_LOCK_AT, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    os.close(fd)


def _record(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096)


def acquire(directory: str | os.PathLike) -> bool:
    """Create `directory` and lock it for this process (again in the same process: no-op). False where the
    filesystem has no locks; DirectoryInUse naming the holder where another process has it; OSError else."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(d)
    if key in _held:
        return True
    existed = (d / LOCK_NAME).exists()
    try:  # os.open's descriptors are not inherited by child processes (PEP 446)
        fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT | _BINARY, 0o644)
    except PermissionError:  # someone else's lock file: it can still be locked, not written
        fd = os.open(d / LOCK_NAME, os.O_RDONLY | _BINARY)
    for attempt in range(3):  # a few tries: holder() may be probing the lock for a moment
        try:
            _lock(fd)
            break
        except OSError as e:
            if e.errno in BUSY and attempt < 2:
                time.sleep(0.05)
                continue
            raw = _record(fd)
            os.close(fd)
            if e.errno in BUSY:
                raise DirectoryInUse(_describe(raw) or "details not yet written") from None
            if e.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                return False
            raise
    _held[key] = fd
    _before[key] = _record(fd) if existed else None
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join([os.path.basename(sys.executable), *sys.argv])}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(me) + "\n").encode())
    except OSError:  # read-only lock file: the lock holds all the same
        pass
    return True


def holder(directory: str | os.PathLike) -> str | None:
    """Who holds `directory`'s lock, when another live tinygpt process does; else None. A probe: keeps nothing."""
    lock = Path(directory) / LOCK_NAME
    if os.path.realpath(directory) in _held or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | _BINARY)
    except OSError:
        return None
    locked = False
    try:
        _lock(fd, shared=True)
        locked = True
        return None
    except OSError as e:
        return _describe(_record(fd)) if e.errno in BUSY else None
    finally:
        _close(fd, locked)


def claim(given: str, key: str, refusal: Optional[Callable[[Path], Optional[str]]] = None) -> Optional[str]:
    """Lock `given` as this process's run (or sweep) directory for its life (given as the setting `key`), else the
    one-line reason why not; `refusal(path)`: a reason of the caller's (a new run's directory that holds one)."""
    path = Path(given)
    if path.resolve() == Path.cwd().resolve():
        return (f"{key}={given or repr(given)} is the current directory, where the run's files (last.pt, "
                f"train.log, .hydra/) would mix with yours: give the run a directory of its own, e.g. "
                f"{key}=runs/demo, or leave {key} out for a new dated one")
    busy = "wait for it to finish, or choose another " + key
    for up in (path.resolve(), *path.resolve().parents):  # a live run's or sweep's directory, or one inside it
        if who := holder(up):
            return (f"{key}={given} is in use by another training run ({who}): {busy}" if up == path.resolve() else
                    f"{key}={given} is inside {up}, which another training run is using ({who}): {busy}")
    if refusal is not None and (reason := refusal(path)):
        return reason
    parent = next(d for d in (path, *path.parents) if d.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{key}={path} cannot be created: {parent} is " + (
            f"not writable: choose another {key} or fix its permissions" if parent.is_dir() else
            f"a file, not a directory: choose another {key}")
    try:
        if not acquire(path):
            print(f"warning: {path} cannot be locked on this filesystem: make sure no other run uses it",
                  file=sys.stderr, flush=True)
    except DirectoryInUse as e:  # it started a moment ago
        return f"{key}={given} is in use by another training run ({e}): {busy}"
    except OSError as e:
        return f"{key}={path} cannot be created: {e.strerror or e}: choose another {key}"
    return refusal(path) if refusal is not None else None  # one that ended meanwhile


def release(directory: str | os.PathLike, *, undo: bool = False) -> None:
    """Unlock now (tests); exiting the process does the same. undo: the lock file as it was before acquire (a
    refused resume leaves its directory byte-identical)."""
    key = os.path.realpath(directory)
    fd, before = _held.pop(key, None), _before.pop(key, None)
    if fd is None:
        return
    if undo and before is not None:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, before)
    _close(fd, locked=True)
    if undo and before is None:
        Path(directory, LOCK_NAME).unlink(missing_ok=True)
