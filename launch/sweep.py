"""Hydra's job runner, for sweeps (`python train.py -m a=1,2`) and runs with Hydra's own flags: a failed job
(diverged, bad data, a refused resume) is recorded and the sweep goes on; at its end one table (job, overrides,
status, best val, bpb) in the terminal and in the sweep dir (summary.md, summary.jsonl), and train.py exits 1 if any
job failed. Hydra calls `SweepReport` (registered in launch.config.register_configs); each job returns its outcome.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from common.cli import one_line
from common.files import atomic_write
from launch.config import CONF, compose, to_dataclass
from launch.run import Failed, failure
from runtime import console
from runtime.console import to_files
from training.metrics import read_metrics

JOBS: list[dict] = []  # this process's sweep, one record per finished job
OUTCOME = "tinygpt_job"  # the key of main()'s return value that holds a job's outcome


def outcome(status: str, error: Optional[str] = None) -> dict:
    """What main() returns for a sweep job: its status ("completed", "failed", ...) and its one error line."""
    return {OUTCOME: {"status": status, "error": error}}


def _best(run_dir: Path) -> tuple[Optional[float], Optional[float]]:
    """(best val loss, its val bpb) from a job's metrics.jsonl; Nones before its first evaluation."""
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("type") == "eval"
             and isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])]
    best = min(evals, key=lambda r: r["val_loss"], default=None)
    return (best["val_loss"], best.get("val_bpb")) if best else (None, None)


def record(num: int, overrides: list[str], run_dir: Path, value: Any) -> dict:
    """A finished job's record: `value` is main()'s return value (an outcome) or the exception that escaped."""
    if isinstance(value, dict) and OUTCOME in value:
        status, error = value[OUTCOME]["status"], value[OUTCOME]["error"]
    else:
        status, error = "failed", f"error: {type(value).__name__}: {value}" if isinstance(value, BaseException) \
            else None
    best, bpb = _best(run_dir)
    return {"job": num, "overrides": list(overrides), "status": status, "best_val_loss": best, "val_bpb": bpb,
            "run_dir": str(run_dir), "error": error}


def table(jobs: list[dict]) -> str:
    """The sweep's table (Markdown); overrides that every job shares are left out of it."""
    shared = set.intersection(*(set(j["overrides"]) for j in jobs)) if len(jobs) > 1 else set()
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = ["| job | overrides | status | best val | bpb |", "|---|---|---|---|---|"]
    rows += [f"| {j['job']} | {' '.join(o for o in j['overrides'] if o not in shared) or '(none)'} | {j['status']} | "
             f"{fmt(j['best_val_loss'], '.4f')} | {fmt(j['val_bpb'], '.3f')} |" for j in jobs]
    errors = [f"- job {j['job']}: {j['error']}" for j in jobs if j["error"]]
    return "\n".join(rows + ([""] + errors if errors else []))


def write_summary(sweep_dir: Path, jobs: list[dict]) -> str:
    """summary.md and summary.jsonl in the sweep dir; returns the table."""
    text = table(jobs)
    with atomic_write(sweep_dir / "summary.md", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with atomic_write(sweep_dir / "summary.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(j) + "\n" for j in jobs)
    return text


def failed() -> int:
    """How many of this process's sweep jobs did not complete."""
    return sum(j["status"] != "completed" for j in JOBS)


class SweepReport(Callback):
    """Collects each sweep job's record; prints and writes the table when the sweep ends."""

    def on_multirun_start(self, config, **kwargs) -> None:
        JOBS.clear()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        value = job_return._return_value  # (the property re-raises a job's exception)
        JOBS.append(record(int(config.hydra.job.num), job_return.overrides or [],
                           Path(config.hydra.runtime.output_dir), value))

    def on_multirun_end(self, config, **kwargs) -> None:
        if not JOBS:
            return
        text = write_summary(Path(config.hydra.sweep.dir), JOBS)
        n = failed()
        print(f"\nsweep: {len(JOBS) - n} of {len(JOBS)} jobs completed"
              f"{f', {n} did not' if n else ''} (also in {Path(config.hydra.sweep.dir) / 'summary.md'})\n{text}",
              flush=True)


def hydra_job(cfg: DictConfig) -> object:
    """A job hydra.main runs (a sweep's, or a run with Hydra's flags): a sweep's job returns its outcome instead of
    raising its error, so that the sweep goes on. Set up as every run is (launch.run.set_up); a sweep's directory
    is locked already, so its jobs' (inside it) are not."""
    from launch import run
    console.setup()
    hc = HydraConfig.get()
    sweeping = hc.mode == RunMode.MULTIRUN
    try:
        setup = run.set_up(cfg, hc.runtime.output_dir, list(hc.overrides.task), claim=not sweeping)
        result = run.execute(setup)
    except Exception as e:  # noqa: BLE001
        f = failure(e, to_dataclass(cfg))
        if not sweeping:
            raise f from None
        if isinstance(f, Failed):
            to_files(f.line)
            console.to_stderr(f.line)
            return outcome(f.status, f.line)
        # a bug in one job: its traceback in its train.log, the sweep goes on
        logging.getLogger(__name__).exception(f"sweep job failed: {type(e).__name__}: {one_line(e)}")
        return outcome("failed", f"error: {type(e).__name__}: {one_line(e)}")
    if result.exit_code:  # stopped by a signal: so is the sweep
        sys.exit(result.exit_code)
    return outcome("completed")


def run_with_hydra(args: list[str], jobs: list[list[str]], task: Callable[[DictConfig], object]) -> int:
    """`task` (train.py's hydra_job: Hydra names the job after its file, so the log is train.log) under hydra.main,
    for a sweep (its directory claimed first and pinned: the default is dated) or Hydra's own flags."""
    from checkpoint.manager import sweep_refusal
    from common import run_lock
    from runtime.ranks import torchrun_env
    if {"-m", "--multirun"} & set(args):
        if torchrun_env():
            raise Failed("sweeps (-m) cannot run under torchrun: start one torchrun per configuration")
        if not any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
            first = jobs[0] if jobs else [a for a in args if a.startswith("hydra.")]
            cfg = compose(first, return_hydra_config=True)
            sweep_dir, fresh = str(cfg.hydra.sweep.dir), cfg.train.resume is False  # (an earlier sweep's runs: kept)
            if problem := run_lock.claim(sweep_dir, "hydra.sweep.dir", sweep_refusal if fresh else None):
                raise Failed(problem)
            from launch.overrides import override
            args = [*args, override("hydra.sweep.dir", sweep_dir)]
    sys.argv[1:] = args
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra's own errors raised to train.py's one-line failure
    hydra.main(version_base=None, config_path=str(CONF), config_name="config")(task)()
    return 1 if failed() else 0  # (the table said which)
