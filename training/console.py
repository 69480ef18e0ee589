"""Console output while training: log lines above a tqdm progress bar, never through it; the per-interval train
lines (`extra={"progress": True}`) go to the bar's postfix instead (train.log still gets them).
"""
from __future__ import annotations

import contextlib
import logging
import sys


class TqdmHandler(logging.StreamHandler):
    def emit(self, record):
        try:
            from tqdm import tqdm
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never break training
            self.handleError(record)


def hide_progress(record: logging.LogRecord) -> bool:
    return not getattr(record, "progress", False)


@contextlib.contextmanager
def console_with_bar(enabled: bool):
    """While the bar is shown: route console log handlers through tqdm.write, hide per-interval lines."""
    if not enabled:
        yield
        return
    root = logging.getLogger()
    swapped = []
    for h in list(root.handlers):
        if type(h) is logging.StreamHandler and getattr(h, "stream", None) in (sys.stdout, sys.stderr):
            th = TqdmHandler(h.stream)  # the same level, format and filters, and no per-interval lines
            th.level, th.formatter, th.filters = h.level, h.formatter, [*h.filters, hide_progress]
            root.removeHandler(h)
            root.addHandler(th)
            swapped.append((h, th))
    try:
        yield
    finally:
        for h, th in swapped:
            root.removeHandler(th)
            root.addHandler(h)
