"""CPU threads that keep their speed when another process shares the cores.

OpenMP threads spin while they wait for each other at the end of every parallel region. When another
process holds one of the cores, a spinning thread burns its time slice waiting for a partner that is not
running, and a two-thread run on two busy cores became 3-6x slower than one thread (sampling 8x).
Sleeping instead of spinning (OpenMP's PASSIVE wait policy) removes the collapse. The runtime reads the
policy once, when torch loads it, so `configure_threads()` runs before `import torch`; a value the user
set wins.
"""
from __future__ import annotations

import os


def configure_threads() -> None:
    """Call first thing in an entry point (train.py, sample.py, ...), before torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
