"""An entry point's start-up, seen and cut. Seen: with `TINYGPT_TRACE=startup` it prints on stderr each start-up phase
as it ends, its seconds since the process started (the interpreter's own start-up included) and its own, on any
device (docs/training.md); call sites are one `mark` each, and off (the default) a mark returns at once, nothing is
imported for it and nothing runs per step. Cut: `gc_paused` around torch's import (docs/benchmarks.md).
"""
from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

SWITCH, VALUE = "TINYGPT_TRACE", "startup"  # the one switch, and its one value for now


class Trace:
    """One process's trace (`setting`: the switch's value): `mark` a phase as it ends, until the one that `end`s it."""

    def __init__(self, setting: str):
        setting = setting.strip()
        self.on, self.unknown = setting == VALUE, "" if setting == VALUE else setting  # unknown: warned at a mark
        self.origin = self.last = None  # perf_counter() at the process's start, at the last mark
        rank = os.environ.get("RANK", "0").strip() or "0"  # (torchrun's: a rank's lines say whose they are)
        self.tag = "" if rank == "0" else f"[rank {rank}] "

    def mark(self, phase: str, wait: Callable[[], object] | None = None, end: bool = False) -> None:
        """`phase` has ended: its line (after `wait()`, which waits for a device's queued work: an asynchronous
        GPU's step is not over when Python is); `end`: the last phase, marks after it print nothing."""
        if not self.on:
            if self.unknown:  # said once, at the first mark: a mistyped switch, and the run goes on
                print(f"warning: {SWITCH}={self.unknown} is not a trace tinygpt has: set {SWITCH}={VALUE} (each "
                      f"start-up phase's seconds on stderr) or unset it", file=sys.stderr, flush=True)
                self.unknown = ""
            return
        if wait is not None:
            wait()
        now = time.perf_counter()
        if self.origin is None:  # (now, then the trace's own import: not the phase's)
            from common.platform import process_age  # (psutil: only when tracing)
            age = process_age()
            self.origin = self.last = now if age is None else time.perf_counter() - age
        print(f"{self.tag}startup {now - self.origin:7.2f} s {now - self.last:+7.2f} s  {phase}", file=sys.stderr,
              flush=True)
        self.last, self.on = now, not end

    def first(self, items: Iterable, phase: str) -> Iterable:
        """`items` as they are, with `phase` (the last) marked once the first has been used (the next is asked for,
        or there is none): a decode loop's first token, printed, without a mark in the loop."""
        return self._after_first(items, phase) if self.on else items

    def _after_first(self, items: Iterable, phase: str) -> Iterator:
        it = iter(items)
        for item in it:
            yield item
            break
        self.mark(phase, end=True)
        yield from it


@contextmanager
def gc_paused() -> Iterator[None]:
    """Around an entry point's import of torch: no garbage collection inside, and what was made there frozen after.
    The import makes few cycles to free, yet each full collection walks its few hundred thousand objects again (0.19 s
    of 1.25 s to the config printed on a 2-core CPU); frozen, later ones skip them (cycles made inside are never
    freed). Nothing where torch was imported before (a test calling an entry point's main())."""
    if "torch" in sys.modules:
        yield
        return
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


def parse(text: str) -> list[tuple[str, float, float]]:
    """The trace's lines in `text` (a process's stderr): [(phase, seconds since the start, its own seconds), ...]."""
    import re
    line = re.compile(r"^(?:\[rank \d+\] )?startup +([\d.]+) s +\+([\d.]+) s  (.+)$", re.M)
    return [(m[3], float(m[1]), float(m[2])) for m in line.finditer(text)]


_trace = Trace(os.environ.get(SWITCH, ""))
mark, first = _trace.mark, _trace.first
