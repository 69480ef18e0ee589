"""One run per directory: an exclusive lock on `<dir>/.lock`, held until the process exits.

filelock locks the file (flock; on Windows LockFileEx on byte 0), so the OS drops the lock when its holder dies
(kill -9 too) and a dead run's lock is taken over with no clean-up. The file records who holds it (pid, host,
start, command) for the refusal to name, from byte 1 on: Windows locks are mandatory, so others cannot read byte 0.
It stays after the run: removing it could let two runs lock two different files of the same name.
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

from filelock import lock_descriptor, unlock_descriptor

LOCK_NAME = ".lock"
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)  # a filesystem that cannot lock files
_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation
_held: dict[str, tuple[int, bytes | None]] = {}  # resolved directory -> (its locked descriptor, its bytes before)


class DirectoryInUse(Exception):
    """Another live process holds the directory's lock; str() describes that process."""


def _describe(raw: bytes) -> str | None:
    try:
        h = json.loads(raw.decode())
        cmd = h["command"] if len(h["command"]) <= 120 else h["command"][:117] + "..."
        return f"pid {h['pid']} on host {h['host']}, started {h['started']}: {cmd}"
    except (ValueError, KeyError, TypeError):  # not written yet, or not a tinygpt lock file
        return None


def _open(path: Path, create: bool) -> int:
    """os.open's descriptors are not inherited by child processes (PEP 446)."""
    try:
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | _BINARY, 0o644)
    except PermissionError:  # someone else's lock file: it can still be locked, not written
        return os.open(path, os.O_RDONLY | _BINARY)


def _lock(fd: int) -> bool:
    """Lock `fd` without waiting, in a few tries (another process may probe it for a moment, see holder()); False
    while another process holds it, OSError where it cannot be locked."""
    for attempt in range(3):
        if lock_descriptor(fd, blocking=False):
            return True
        if attempt < 2:
            time.sleep(0.05)
    return False


def _close(fd: int, locked: bool) -> None:
    """Close `fd`, dropping its lock (unlocked first: on Windows a closed handle's lock may linger a moment)."""
    if locked:
        unlock_descriptor(fd)
    os.close(fd)


def _read(fd: int, start: int) -> bytes:
    os.lseek(fd, start, os.SEEK_SET)
    return os.read(fd, 4096)


def _write(fd: int, data: bytes) -> None:
    """The file's bytes become `data` (truncated after it, never before byte 1: byte 0 is Windows' lock)."""
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.ftruncate(fd, len(data))


def acquire(directory: str | os.PathLike) -> bool:
    """Create `directory` and lock it for this process (again in the same process: no-op). False where the
    filesystem has no locks; DirectoryInUse naming the holder where another process has it; OSError else."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(d)
    if key in _held:
        return True
    existed = (d / LOCK_NAME).exists()
    fd = _open(d / LOCK_NAME, create=True)
    try:
        locked = _lock(fd)
    except OSError as e:
        os.close(fd)
        if e.errno in NO_LOCKS:
            return False
        raise
    if not locked:
        raw = _read(fd, 1)
        os.close(fd)
        raise DirectoryInUse(_describe(raw) or "details not yet written")
    _held[key] = fd, _read(fd, 0) if existed else None  # None: no lock file before (release(undo=True))
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "command": " ".join([os.path.basename(sys.executable), *sys.argv])}
    try:
        _write(fd, ("\n" + json.dumps(me) + "\n").encode())  # the record from byte 1 on
    except OSError:  # read-only lock file: the lock holds all the same
        pass
    return True


def holder(directory: str | os.PathLike) -> str | None:
    """Who holds `directory`'s lock, when another live tinygpt process does; else None. A probe: keeps nothing."""
    lock = Path(directory) / LOCK_NAME
    if os.path.realpath(directory) in _held or not lock.is_file():
        return None
    try:
        fd = _open(lock, create=False)
    except OSError:
        return None
    locked = False
    try:
        locked = _lock(fd)
        return None if locked else _describe(_read(fd, 1))
    except OSError:  # no locks here (acquire says so)
        return None
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
    fd, before = _held.pop(os.path.realpath(directory), (None, None))
    if fd is None:
        return
    if undo and before is not None:
        _write(fd, before)
    _close(fd, locked=True)
    if undo and before is None:
        Path(directory, LOCK_NAME).unlink(missing_ok=True)
