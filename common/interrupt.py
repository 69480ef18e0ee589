"""Ctrl-C at any moment of a command (docs/faults.md): `stop_quietly()`, first thing in every entry point, ends the
process at once, exit 130, no traceback. Its handler never raises: an exception raised from a signal handler lands
wherever Python happens to be, a library's `except:` around an optional import swallows it, and the half-imported
module breaks later (issue 39). What must not be cut half-way is made safe instead: `on_stop` undoes it (a temp
file, a child process), `held` finishes it first (a swap of two directories). A training run's loop has its own
handler (runtime/signals.py). Standard library only, and few imports (no typing), so that it is in place within
milliseconds.
"""
from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C

_undo: dict[object, Callable[[], object]] = {}  # what a stop undoes first, in the order registered
_lines: dict[int, str] = {}  # signal -> the line a stop by it prints on stderr
_depth = 0  # inside `held` blocks
_pending: int | None = None  # a signal that came inside them
_stopping = False


def stop_quietly(sigterm_line: str | None = None) -> None:
    """A Ctrl-C from now on ends the process at once: whatever `on_stop` registered is undone, a newline ends the
    half-printed line on stdout, exit 130. With `sigterm_line`, SIGTERM does the same, prints it and exits 143
    (train.py until its first step: nothing is written yet that a kill could cut short)."""
    signal.signal(signal.SIGINT, _on_signal)
    if sigterm_line:
        _lines[signal.SIGTERM] = sigterm_line
        signal.signal(signal.SIGTERM, _on_signal)


def _on_signal(signum, frame) -> None:
    global _pending
    again, _pending = _pending is not None, signum  # (set before reading _depth: `held` sees one or the other)
    if _depth and not again:  # a second one stops at once all the same
        return
    stop_now(signum)


def stop_now(signum: int) -> None:
    """End the process as a stop by `signum` does (see stop_quietly); never returns."""
    global _stopping
    if _stopping:  # a signal while undoing: no more waiting
        os._exit(128 + signum)
    _stopping = True
    if signum == signal.SIGINT and _writable(1):
        _write(1, "\n")
    for undo in list(_undo.values()):
        try:
            undo()
        except Exception:  # noqa: BLE001 - best effort: the process ends either way
            pass
    if signum in _lines:
        say(_lines[signum])
    os._exit(128 + signum)


@contextmanager
def on_stop(undo: Callable[[], object]) -> Iterator[None]:
    """Inside the block, a stop (stop_quietly's) first calls undo(): what it would leave half-done (a temp file
    or directory removed, a child process killed, a line saying what is kept)."""
    key = object()
    _undo[key] = undo
    try:
        yield
    finally:
        _undo.pop(key, None)


@contextmanager
def held() -> Iterator[None]:
    """Inside the block, a Ctrl-C waits for it to end (a second one does not): for a few renames that must happen
    together."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            stop_now(_pending)


def say(line: str) -> None:
    """`line` on stderr from a signal handler or an `on_stop` (no buffer that the interrupted code may hold)."""
    _write(2, line + "\n")


def _write(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode("utf-8", "replace"))
    except OSError:  # closed, or its reader gone
        pass


def _writable(fd: int) -> bool:
    """Whether a byte written to `fd` now would not block (a pipe its reader stopped reading would hang the exit)."""
    try:
        return bool(select.select([], [fd], [], 0)[1])
    except (OSError, ValueError):  # Windows: select takes sockets only; a tty or file never blocks long
        return True
