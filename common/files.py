"""Where tinygpt keeps files (`cache_dir()`: downloads, prepared data, tokenizers) and how it writes them: durably,
a file is replaced whole or not at all, so a kill or a full disk never leaves half of one.

The pattern (temp file beside the target, fsync, os.replace, fsync the directory) lives here once; the
checkpoint, data-cache, metrics, plot and download code all call it. `replace_dir` is the same for a
directory (an HF export, a sharded checkpoint). On Windows a rename fails while another program has the
target open (sample.py reading last.pt): `replace` waits a few seconds for it, then says so in one line.
Permissions are what open(path, "w") would leave: a new file follows the umask, a replaced one (or directory)
keeps its own (`open_mode`), also for files a library writes itself (safetensors' 0600 temp files: `with_open_mode`).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
import time
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Iterator

import platformdirs

from common.interrupt import held, on_stop
from common.platform import is_windows

SHAKESPEARE_FILE = "tinyshakespeare/input.txt"  # in the cache: data/sources.py downloads it there


def cache_dir(check: bool = False) -> Path:
    """Where every download and prepared data set is kept: `$TINYGPT_CACHE` if set (and non-empty), else the OS's
    (platformdirs: ~/.cache/tinygpt on Linux, ~/Library/Caches/tinygpt on macOS, %LOCALAPPDATA%\\tinygpt\\Cache on
    Windows), or ~/.cache/tinygpt where an earlier tinygpt filled it and the OS's is not there yet. Not created
    here; `check`: a one-line ValueError when it is a file."""
    env, old = os.environ.get("TINYGPT_CACHE"), Path("~/.cache/tinygpt").expanduser()
    d = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("tinygpt", appauthor=False))
    if not env and not d.exists() and old.is_dir():  # (on Linux they are the same)
        d = old
    if check and d.exists() and not d.is_dir():
        raise ValueError(f"the tinygpt cache {d} is a file, not a directory: set TINYGPT_CACHE to a directory "
                         f"(or move the file away)")
    return d


def keep_tool_caches() -> None:
    """matplotlib's font cache and torch.compile's (inductor's graphs and kernels, Triton's binaries) under the tinygpt
    cache, not in ~/.cache or /tmp: a second run of the same shapes then compiles in seconds. Before they are used;
    a variable the user set wins."""
    for var, sub in (("MPLCONFIGDIR", "matplotlib"), ("TORCHINDUCTOR_CACHE_DIR", "compile/inductor"),
                     ("TRITON_CACHE_DIR", "compile/triton")):
        os.environ.setdefault(var, str(cache_dir() / sub))


REPLACE_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0)  # seconds between tries: ~4.5 s in all


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in `path` durable (best effort: some platforms cannot open directories)."""
    with suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_path(path: str | os.PathLike) -> Path:
    """A unique hidden name beside `path` (`.name.<pid>.<id>.tmp`), so a stale one can be recognised."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def remove_quietly(path: str | os.PathLike) -> None:
    with suppress(OSError):
        os.unlink(path)


def replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """os.replace, retried on Windows while another process has `dst` (or `src`) open; a rename that still
    fails there is a PermissionError naming the file and what to do."""
    waits = REPLACE_WAITS if is_windows() else ()
    for wait in waits:
        try:
            return os.replace(src, dst)
        except PermissionError:
            time.sleep(wait)
    try:
        os.replace(src, dst)
    except PermissionError:
        if not waits:
            raise
        raise PermissionError(errno.EACCES, f"{dst} stayed open in another program for {sum(waits):.0f} s "
                              f"(a viewer, an editor, a virus scanner?): close it and run again") from None


def _own_mode(path: str | os.PathLike) -> int | None:
    """The permission bits of the file at `path` (rwx for user, group, others), or None if there is none."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & 0o777
    except OSError:
        return None


def open_mode(path: str | os.PathLike) -> int:
    """The permission bits open(path, "w") would leave `path` with: an existing file keeps its own; a new one gets
    what a file created in its directory gets (0o666 less the umask, or the directory's default ACL), found by
    creating one: reading the umask would mean changing it, for every thread of the process."""
    if (own := _own_mode(path)) is not None:
        return own
    probe = temp_path(path)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode) & 0o777
    finally:
        os.close(fd)
        remove_quietly(probe)


@contextmanager
def with_open_mode(path: str | os.PathLike) -> Iterator[None]:
    """`with with_open_mode(p): library_writes(p)`: `p` ends with the permissions open() would have given it,
    whatever the library chose (safetensors' save_file writes 0600 through a temp file). POSIX only: Windows
    has no such bits."""
    mode = None if is_windows() else open_mode(path)
    yield
    if mode is not None:
        os.chmod(path, mode)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", **open_kw) -> Iterator[IO]:
    """`with atomic_write(p) as f: f.write(...)`: `p` appears whole when the block ends, or not at all; on any
    error (KeyboardInterrupt too) the temp file is removed and the error propagates unchanged, and so on a
    Ctrl-C that ends the process at once (common/interrupt.py). A new `p` follows the umask (the temp file is made
    by open()); a replaced one keeps its permission bits, as open(p, "w") does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with on_stop(lambda: remove_quietly(tmp)):
            with open(tmp, mode.replace("w", "x"), **open_kw) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            if (own := _own_mode(path)) is not None and not is_windows():
                os.chmod(tmp, own)
            replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(path)


@held()  # a Ctrl-C waits for the swap
def replace_dir(tmp: str | os.PathLike, path: str | os.PathLike, old: str | os.PathLike | None = None) -> None:
    """Swap the finished directory `tmp` in as `path`. An existing `path` is first renamed to `old` (default: a
    hidden per-process name beside it), put back if the swap fails, and deleted only once `tmp` is in place; its
    permission bits carry over to `tmp`, as a replaced file's do."""
    tmp, path = Path(tmp), Path(path)
    old = Path(old) if old is not None else path.with_name(f".{path.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    if (own := _own_mode(path)) is not None and not is_windows():
        os.chmod(tmp, own)
    if path.exists():
        replace(path, old)
    try:
        replace(tmp, path)
    except OSError:
        if old.exists():
            replace(old, path)
        raise
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
