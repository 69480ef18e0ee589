"""The one `error: ...` line a run ends with, on the console and in train.log: `Failed` carries it (its exit code
and the status a sweep's table gives it), `failure` turns what a run raised into it (out of memory: what to lower)."""
from __future__ import annotations

import os

from common.cli import one_line
from launch import memory

RANK = os.environ.get("RANK", "0").strip() or "0"


class Failed(Exception):
    """The one `error: ...` line a run ends with (of a Hydra/OmegaConf error: its first line), its exit code and
    the status a sweep's table gives it."""

    def __init__(self, message: object, code: int = 2, status: str = "failed", where: str = ""):
        if type(message).__module__.split(".")[0] in ("hydra", "omegaconf"):  # (not imported here)
            message = next((ln for ln in str(message).splitlines() if ln.strip()), type(message).__name__)
        self.line = f"error: {'' if RANK == '0' else f'[rank {RANK}] '}{one_line(message)}{where}"
        self.code, self.status = code, status
        super().__init__(self.line)



def failure(e: Exception, config) -> Exception:
    """What train() raised, as the run's Failed line (out of memory: what to lower); a bug: itself."""
    if oom := memory.out_of_memory(e, config):
        return Failed(oom)
    if isinstance(e, (ValueError, OSError)):  # a user's mistake; training.step.TrainingDiverged: status "diverged"
        return Failed(str(e) or type(e).__name__, status=getattr(e, "status", "failed"))
    return e
