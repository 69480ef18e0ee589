"""Small helpers shared by the tests: the repo path and a subprocess runner for the CLIs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_cli(args: list[str], cwd: Path | str | None = None, timeout: float = 300,
            env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run `python <args>` from the repo in a subprocess and capture text output.

    Scripts are given relative to the repo (e.g. ["train.py", "train.max_iters=2"]); the child inherits
    the test's environment (TINYGPT_CACHE, WANDB_MODE) plus `env`, and PYTHONPATH points at the repo so
    `python -m data.prepare` works from any cwd.
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    first = args[0]
    if first.endswith(".py") and not os.path.isabs(first):
        args = [str(REPO / first), *args[1:]]
    proc = subprocess.run([sys.executable, *args], cwd=str(cwd) if cwd else None, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc
