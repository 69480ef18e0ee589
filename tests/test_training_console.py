"""training/console.py: console handlers go through tqdm.write while a bar is shown, then come back."""
from __future__ import annotations

import io
import logging
import sys

from training.console import TqdmHandler, console_with_bar


def test_console_handlers_are_swapped_and_restored(monkeypatch):
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    logfile = logging.StreamHandler(io.StringIO())  # not a console stream: left alone
    monkeypatch.setattr(root, "handlers", [console, logfile])
    written = []
    monkeypatch.setattr("tqdm.tqdm.write", staticmethod(lambda msg, file=None: written.append(msg)))
    log = logging.getLogger("tinygpt-console-test")
    with console_with_bar(True):
        assert [type(h) for h in root.handlers] == [logging.StreamHandler, TqdmHandler]
        log.warning("an eval line")
        log.warning("a train line", extra={"progress": True})  # the bar's postfix shows these
    assert written == ["an eval line"]  # above the bar; the progress line hidden from the console
    assert logfile.stream.getvalue() == "an eval line\na train line\n"  # files keep everything
    assert root.handlers == [logfile, console]  # the original handler is back (appended)


def test_without_a_bar_nothing_changes(monkeypatch):
    root = logging.getLogger()
    before = list(root.handlers)
    with console_with_bar(False):
        assert root.handlers == before
