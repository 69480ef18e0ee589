"""CPU threads that keep their speed when another process shares the cores.

Spinning OpenMP threads burn their time slice waiting for a partner that is not running: on 2 cores with one
busy, training ran at 740 tokens/s against 7,700 with sleeping threads (on a quiet machine spinning is faster).
So PASSIVE is chosen only when other processes use the CPUs at start-up, before `import torch` (the runtime
reads the policy once); OMP_WAIT_POLICY or OMP_NUM_THREADS set by the user wins.
"""
from __future__ import annotations

import os

BUSY_CORES = 0.5  # other processes using at least half a core: threads must not spin


def busy_cores():
    """How many cores other processes keep busy: the 1-minute load average where the OS has one (no module to
    import, no wait); elsewhere (Windows) common.platform measures CPU time."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        from common.platform import busy_cores as measured
        return measured()


def configure_threads() -> None:
    """Call first thing in an entry point (train.py, sample.py, ...), before torch is imported."""
    if "OMP_WAIT_POLICY" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    busy = busy_cores()
    if busy is not None and busy >= BUSY_CORES:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
