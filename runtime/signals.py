"""Stopping a run cleanly on SIGINT/SIGTERM or a closed output pipe (`train.py | head`, seen by runtime/console.py),
and the command line that continues it. The handlers only set a flag the loop polls between steps; a second
Ctrl-C aborts at once (the atomic saves keep every file intact). Before a run starts, train.py's Ctrl-C ends the
process at once (common/interrupt.py): `run_under_way` is the handover.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from runtime import console

if TYPE_CHECKING:
    from runtime.ranks import Ranks

SIGPIPE = 13  # POSIX's SIGPIPE number (Windows has no such signal, but a pipe's reader still leaves)
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, SIGPIPE: 128 + SIGPIPE}  # 141: what shells report
PIPE = "a closed output pipe (the output's reader went away)"  # what stopped the run, in words


class StopRequest:
    """SIGINT/SIGTERM -> a flag the loop polls; a second SIGINT aborts; `agreed()`: every rank stops together."""

    def __init__(self, ranks: Optional[Ranks] = None):
        self.signum: Optional[int] = None
        self.ranks, self._previous, self._pending, self._agreed = ranks, {}, None, 0

    def _handler(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for s in (signal.SIGINT, signal.SIGTERM):
            self._previous[s] = signal.signal(s, self._handler)

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()

    def agreed(self) -> bool:
        """Stop now? This process's signal, or under torchrun any rank's as posted at the previous call (each call
        posts this rank's to an async MAX), so that every rank stops after the same step."""
        if self.signum is None and console.reader_gone():
            self.signum = SIGPIPE
        agreed = int(self.signum or 0)
        if self.ranks is not None and self.ranks.distributed:
            agreed = self._agreed = self._agreed or self.finish()
            if not agreed:
                self._pending = self.ranks.max_async(int(self.signum or 0))
        self.signum = self.signum or agreed or None
        return bool(agreed)

    def finish(self) -> int:
        """Wait for the MAX in flight (every rank has exactly one), so none is left behind; its value, else 0."""
        pending, self._pending = self._pending, None
        return pending() if pending is not None else 0

    @property
    def name(self) -> str:
        return PIPE if self.signum == SIGPIPE else signal.Signals(self.signum).name if self.signum else ""

    @property
    def status(self) -> str:
        """The run's status in metrics.jsonl once this stopped it: a closed pipe "stopped" it (nobody reads it any
        more; nothing failed), a signal "interrupted" it."""
        return "stopped" if self.signum == SIGPIPE else "interrupted"

    def exit_code(self, aborted: bool = False) -> int:
        """141 for a closed pipe, else the signal's (130 Ctrl-C, 143 SIGTERM); 130 for a run a Ctrl-C `aborted`."""
        if self.signum == SIGPIPE or (self.signum and not aborted):
            return EXIT_CODES.get(self.signum, 128 + int(self.signum))
        return EXIT_CODES[signal.SIGINT]


@contextmanager
def run_under_way():
    """From a run's start (set up, a resume accepted) to its closing line, Ctrl-C is the run's: the loop's
    StopRequest takes the first as a stop; outside the loop (or a second one) it raises KeyboardInterrupt, which
    train() turns into the closing line. The handler before it (train.py's start-up one, which ends the process at
    once) is back after it: a sweep's next job sets up as the first did. Handlers change in the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a signal meanwhile: one or the other)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def closing_line(stop: str, step: int, run_dir: Path, last: Optional[Path], last_step: Optional[int], resume: str,
                 aborted: bool, stepped: bool = True) -> str:
    """The closing line of a run that `stop` (a signal's name, or PIPE) stopped after a step (saved), before this
    session's first step (`stepped` False: nothing new to save), or that a second Ctrl-C or a write to the closed
    pipe `aborted` mid-step."""
    if aborted:
        return interrupted_line(run_dir, last, last_step, resume, f"stopped by {stop} mid-step" if stop == PIPE else
                                "interrupted")
    if stepped:
        return f"stopped by {stop} after step {step}: saved {last}; resume with: {resume}"
    if last is not None and last_step is not None:  # a resumed run
        return f"stopped by {stop} before step {step + 1}: nothing new to save ({last} is from step {last_step}); " \
               f"resume with: {resume}"
    return f"stopped by {stop} before step {step + 1}: nothing to save and nothing needs resuming"


def interrupted_line(run_dir: Path, last: Optional[Path], last_step: Optional[int], resume: str,
                     head: str = "interrupted") -> str:
    """The closing line of a run a second Ctrl-C aborted (`head` says what else did); `last`: the last good
    checkpoint it knows of."""
    if last is not None and last_step is not None and Path(last).parent == run_dir:
        return f"{head}; last.pt is from step {last_step}: resume with: {resume}"
    if (run_dir / "last.pt").exists():  # stopped before the run had read it
        return f"{head}; last.pt is as it was: resume with: {resume}"
    return f"{head}; no checkpoint was written yet"
