"""The console: the one logging handler that prints a run's lines on stdout (train.log is Hydra's file handler).
It writes through tqdm.write, so lines print above a progress bar; a per-interval train line the bar's postfix
shows (`extra={"on_bar": True}`) goes to train.log only. When stdout's reader leaves (`train.py | head`) it goes
quiet (stdout then writes to the null device) and `reader_gone()` tells the loop to stop as on Ctrl-C
(docs/faults.md), even before the next line would have failed: a pipe whose reader closed is seen between two
steps. train.py's own stderr lines go through `to_stderr`, the same way (`train.py 2>&1 | head`). A failed run's
line: launch/run.py.
"""
from __future__ import annotations

import logging
import os
import select
import stat
import sys
import threading
import time
from logging.handlers import MemoryHandler
from typing import Callable, Optional

from tqdm import tqdm

_gone = threading.Event()  # stdout's reader has left


class Console(logging.StreamHandler):
    """stdout, message only, above any progress bar; quiet once the reader has left."""

    def __init__(self):
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if _gone.is_set() or getattr(record, "on_bar", False):
            return
        try:
            tqdm.write(self.format(record), file=self.stream)  # (tqdm.contrib.logging's way; no bar: a plain write)
            self.flush()
        except (BrokenPipeError, ConnectionResetError):
            _left(self.stream)
        except Exception:  # noqa: BLE001 - logging must never break training
            self.handleError(record)


def setup() -> Console:
    """The console handler on the root logger, once (Hydra's job logging gives each job train.log only)."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, Console)), None)
    if handler is None:
        handler = Console()
        root.addHandler(handler)
    return handler


def _left(stream) -> None:
    try:  # later writes (and the final flush at exit) go nowhere, quietly
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, stream.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass
    _gone.set()


def to_stderr(line: str) -> None:
    """`line` on stderr, at once (one write: under torchrun ranks' lines never run together); if its reader has left
    (`train.py 2>&1 | head`), quietly nothing, and the run stops as when stdout's reader leaves."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, ConnectionResetError):
        _left(sys.stderr)


def reader_gone() -> bool:
    """Has stdout's reader left? A write said so, or (a pipe, where poll() can tell) the pipe says so now."""
    if not _gone.is_set() and hasattr(select, "poll"):
        try:
            fd = sys.stdout.fileno()
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                p = select.poll()
                p.register(fd, 0)  # POLLERR / POLLHUP only: a pipe with no reader reports POLLERR
                if p.poll(0):
                    _left(sys.stdout)
        except (OSError, ValueError, AttributeError):  # a replaced stdout (tests): only a failed write tells
            pass
    return _gone.is_set()


def progress_bar(total: int, initial: int, show: bool) -> tqdm:
    """A tqdm bar on stderr (drawn only when `show`), to use as a context manager; the console writes above it."""
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, disable=not show, file=sys.stderr,
                smoothing=0.05, leave=True)


class Progress:
    """`progress(done, total)` through a wait between steps (an evaluation's batches), for a run
    never to sit silent: on a drawn bar, `what done/total` as its postfix (redrawn at most every
    REDRAW_S; the bar's own postfix, the train line, put back when done); with no bar (not a
    terminal), a plain line through `say` once the wait has lasted PLAIN_AFTER_S and every EVERY_S
    after, so that a wait of seconds adds no line and one of minutes a few."""
    REDRAW_S, PLAIN_AFTER_S, EVERY_S = 0.5, 10.0, 30.0

    def __init__(self, what: str, bar: Optional[tqdm], say: Callable[[str], None],
                 clock: Callable[[], float] = time.perf_counter):
        self.what, self.say, self.clock = what, say, clock
        self.bar = bar if bar is not None and not bar.disable else None
        self.kept = self.bar.postfix if self.bar is not None else None
        self.start = self.drawn = clock()
        # the first plain line comes PLAIN_AFTER_S in
        self.said = self.start + self.PLAIN_AFTER_S - self.EVERY_S

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self.bar is not None and done >= total:
            self.bar.set_postfix_str(self.kept or "")
        elif self.bar is not None and now - self.drawn >= self.REDRAW_S:
            self.drawn = now
            self.bar.set_postfix_str(f"{self.what} {done}/{total}")
        elif self.bar is None and done < total and now - self.said >= self.EVERY_S:
            self.said = now
            self.say(f"{self.what}: {done}/{total} batches in {now - self.start:.0f} s")


def to_files(message: str, level: int = logging.ERROR) -> None:
    """A line for train.log only (not the console)."""
    for h in [h for h in logging.getLogger().handlers if isinstance(h, (logging.FileHandler, MemoryHandler))]:
        h.handle(logging.LogRecord("train", level, __file__, 0, message, None, None))
