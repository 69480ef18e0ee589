"""Train a tinygpt model: `python train.py [key=value ...]` (Hydra; configs in conf/, the loop in
training/loop.py).

Compose, check, run: the command line is checked before Hydra runs (a mistake is one `error: ...`
line), the run is set up as every run is (launch/run.py: config, job, device, memory, its directory
claimed) and trained. A sweep (-m) and Hydra's own flags (--cfg, --help, ...) go through Hydra's job
runner (launch/sweep.py). docs/design.md.
"""
from __future__ import annotations

NOT_STARTED = "stopped by SIGTERM before step 1: nothing was saved and nothing needs resuming"
# first, so that a Ctrl-C during the imports below ends quietly too (docs/faults.md)
if __name__ == "__main__":
    from common.interrupt import stop_quietly
    stop_quietly(NOT_STARTED)

from common import startup

# TINYGPT_TRACE=startup: each start-up phase's seconds (common/startup.py)
startup.mark("python start-up")
from common.platform import configure_threads

# before torch is imported (so the imports below come after it): see common/platform.py
configure_threads()

import sys

# torch's and Hydra's imports without garbage collections that find nothing to free
with startup.gc_paused():
    import torch

    startup.mark("torch import")
    from common.files import keep_tool_caches
    from launch.config import (ERRORS, NO_PRESET, check_command_line, compose, no_preset,
                               register_configs,
                               with_override)
    from launch.run import Failed, HydraRun, say_failure, sweep_cpu_notes
    from runtime.console import to_stderr
    from training.loop import train
startup.mark("imports (Hydra, tinygpt)")

HELP = ("-h", "--help", "--hydra-help", "-sc", "--shell-completion", "--version")


def hydra_job(cfg):
    """A job Hydra's runner runs (a sweep's, or a run with Hydra's flags), defined here so that
    Hydra names the job after this file (its log: train.log)."""
    from launch import sweep
    return sweep.hydra_job(cfg)


def as_composed(args: list[str], cuda: bool) -> tuple[list[str], bool]:
    """The user's arguments as train.py composes them, and whether the CPU preset was picked for the
    user: experiment=null (or ~) as Hydra's ~experiment, nanoGPT's habits refused (Failed, one
    line), and experiment=gpu (on CUDA) or experiment=cpu added when no experiment is chosen (a
    laptop never starts an hours-long run)."""
    args = no_preset(args)
    chosen = any(a in HELP or a.lstrip("+~").split("=")[0].split("@")[0] == "experiment"
                 for a in args)
    if not all(("=" in a and not a.startswith("-")) or NO_PRESET.fullmatch(a) for a in args):
        from launch.overrides import habit_hint  # nanoGPT's habits, a value the shell split
        if hint := habit_hint([a for a in args if not NO_PRESET.fullmatch(a)]):
            raise Failed(hint)
    if chosen:
        return args, False
    return with_override(args, f"experiment={'gpu' if cuda else 'cpu'}"), not cuda


def main(args: list[str]) -> int:
    # matplotlib's font cache, torch.compile's graphs and kernels: in tinygpt's cache
    keep_tool_caches()
    multirun, run = bool({"-m", "--multirun"} & set(args)), None
    try:
        args, auto_cpu = as_composed(args, torch.cuda.is_available())
        startup.mark("CUDA check")
        register_configs(sweep=multirun)
        # compose + check: every job's overrides, before anything runs
        jobs = check_command_line(args, multirun)
        if not multirun and not any(a.startswith("-") for a in args):
            cfg = compose(args, return_hydra_config=True)
            startup.mark("config composed (Hydra)")
            # set up: checked, its directory claimed; then
            # trained inside its guarantees (launch/run.py)
            run = HydraRun(cfg, auto_cpu)
            with run.guarantees() as edge:
                edge.outcome = train(run.setup.config, edge, run.setup.device, run.setup.source)
            return run.exit_code
        if auto_cpu and multirun:  # each job's run, as a single run's note says it
            for note in sweep_cpu_notes(jobs):
                to_stderr(note)
        from launch import sweep
        return sweep.run_with_hydra(args, jobs, hydra_job)
    except (Failed,) + ERRORS as e:
        if run is not None:
            run.refuse()
        return say_failure(e if isinstance(e, Failed) else Failed(e))
    except KeyboardInterrupt:
        to_stderr("error: interrupted: stopped at once without saving (checkpoints already "
                  "written are intact)")
        return 130
    finally:
        if run is not None:
            run.refuse()  # a resume that crashed before it started: nothing of it written


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
