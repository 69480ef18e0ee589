"""Stopping a run cleanly on SIGINT/SIGTERM.

Design: the handlers only set a flag (`StopRequest.signum`); the loop polls it between steps, finishes the
step, writes last.pt and returns the conventional exit code (`EXIT_CODES`: 130 for SIGINT, 143 for
SIGTERM). A second Ctrl-C raises KeyboardInterrupt at once: the atomic checkpoint writes keep the files
intact whatever moment it lands. Handlers are installed only from the main thread (Python's rule) and
restored when the run ends.
"""
from __future__ import annotations

import signal
import threading
from typing import Optional

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopRequest:
    """SIGINT/SIGTERM -> a flag the loop polls between steps. A second SIGINT aborts immediately."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

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

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""
