"""Train a tinygpt model: `python train.py [key=value ...]` (Hydra; configs in conf/, the loop in training/loop.py).
Every check runs before the run directory is touched, so a mistake is one `error: ...` line; a run's .hydra/ and
train.log are written once it is accepted (a refused resume leaves its directory as it was). A sweep (-m) and
Hydra's own flags (--cfg, --help, ...) go through hydra.main. docs/design.md ("Training loop", train.py).
"""
from __future__ import annotations

NOT_STARTED = "stopped by SIGTERM before step 1: nothing was saved and nothing needs resuming"
if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too (docs/faults.md)
    from common.interrupt import stop_quietly
    stop_quietly(NOT_STARTED)

from common.platform import configure_threads

configure_threads()  # before torch is imported (so the imports below come after it): see common/platform.py

import itertools
import logging
import os
import signal
import sys
from logging.handlers import MemoryHandler
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import configure_log
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from checkpoint.manager import overwrite_refusal
from common import run_lock
from common.files import write_text_atomic
from launch import memory
from runtime import console, ranks
from launch.failure import Failed, failure
from runtime.console import to_files
from model.device import resolve_device
from training.config import check_override, register_configs, to_dataclass, train_keys

CPU_NOTE = ("no CUDA GPU found: using the CPU preset experiment=cpu (nanoGPT's CPU-sized model, trained with "
            "Muon) instead of the GPU baby GPT; pass experiment=shakespeare_char to force the full run")
ERRORS = (ValueError, HydraException, OmegaConfBaseException)  # a user's mistake, told in one line


def compose(args: list[str], return_hydra_config: bool = False) -> DictConfig:
    with hydra.initialize(config_path="conf", version_base=None, job_name="train"):
        return hydra.compose("config", overrides=args, return_hydra_config=return_hydra_config)


class Run:
    """One run (not a sweep's job): checked, its directory claimed, then trained. Until it is accepted (a resume:
    its checkpoint read and found to match), train.log's lines are held back and .hydra/ is not written."""

    def __init__(self, auto_cpu: bool):
        self.auto_cpu, self.rt, self.clean, self.held, self.accepted = auto_cpu, None, False, [], False
        self.claimed = None

    def check(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        try:
            self.config = c = to_dataclass(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
            self.source = None
            if c.model.init_from:  # a fine-tune's shape is its source's
                from training import init_from
                self.source = init_from.apply(c, list(cfg.hydra.overrides.task))
            with train_keys():  # a bad device is told as train.device=...
                from training.loop import join_job
                self.rt = rt = join_job(c.train.device, c.train.parallel)  # joins the torchrun job, if any
                self.device = resolve_device(c.train.device, rt.local_rank)  # the run's, resolved once
            with read_write(cfg.hydra):
                if rt.distributed:  # rank 0's run directory for all (the default is a timestamp)
                    cfg.hydra.run.dir = rt.broadcast_object(str(cfg.hydra.run.dir))
                cfg.hydra.runtime.output_dir = str(Path(str(cfg.hydra.run.dir)).resolve())
                cfg.hydra.mode = RunMode.RUN
            # rank 0 checks memory (before any allocation) and claims the directory for all
            problem = memory.check(c, self.device, rt.world_size, rt.local_world_size) if rt.is_main else None
        except ERRORS + (OSError,) as e:  # OSError: a file a setting names (train.hellaswag=...) is missing
            raise Failed(e) from None
        if rt.is_main and not problem:
            problem = run_lock.claim(str(cfg.hydra.run.dir), "hydra.run.dir",
                                         overwrite_refusal if c.train.resume is False else None)
        if problem := rt.broadcast_object(problem):
            raise Failed(problem)
        self.claimed = rt.is_main and str(cfg.hydra.run.dir)  # refused before it starts: the lock file as it was
        if rt.is_main and c.data.path and c.data.name != "text":  # data.path alone: read as the preset's
            from launch.overrides import data_path_note
            if note := data_path_note(c.data.name, c.data.path, list(cfg.hydra.overrides.task)):
                console.to_stderr(note)

    def open(self) -> None:
        """What Hydra's run_job does for a job: its config, run directory and train.log (held for a resume)."""
        HydraConfig.instance().set_config(self.cfg)
        Path(self.cfg.hydra.runtime.output_dir).mkdir(parents=True, exist_ok=True)
        configure_log(self.cfg.hydra.job_logging, self.cfg.hydra.verbose)
        console.setup()  # the console's one handler (`train.py | head`: the run stops as on Ctrl-C, quietly)
        root = logging.getLogger()
        if self.config.train.resume is not False:
            for fh in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
                mh = MemoryHandler(1 << 30, logging.CRITICAL + 1, fh, flushOnClose=False)
                root.removeHandler(fh)
                root.addHandler(mh)
                self.held.append((fh, mh))
        else:
            self.accept()

    def start(self) -> None:
        """train()'s on_start: set up (a resume accepted), before step 1."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (until now it said nothing was saved: no longer true)
        self.accept()
        if self.auto_cpu and self.rt.is_main:  # said only when the run starts on it, not ahead of a mistake
            console.to_stderr(CPU_NOTE)  # (`2>&1 | head` closed: the run stops before step 1, as for stdout)
            to_files(CPU_NOTE, logging.INFO)

    def accept(self) -> None:
        """The run goes ahead: .hydra/ written as Hydra writes it (rank 0), train.log's held lines let through."""
        if self.accepted:
            return
        self.accepted, cfg, root = True, self.cfg, logging.getLogger()
        if self.rt.is_main and cfg.hydra.output_subdir is not None:
            record = Path(cfg.hydra.runtime.output_dir) / cfg.hydra.output_subdir
            record.mkdir(parents=True, exist_ok=True)
            for name, node in (("config.yaml", OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])),
                               ("hydra.yaml", OmegaConf.masked_copy(cfg, "hydra")),
                               ("overrides.yaml", cfg.hydra.overrides.task)):
                write_text_atomic(record / name, OmegaConf.to_yaml(node))  # whole, or not at all (a Ctrl-C)
        for fh, mh in self.held:
            mh.flush()
            root.removeHandler(mh)
            root.addHandler(fh)
        self.held = []

    def refuse(self) -> None:
        """Before it was accepted: train.log's held lines dropped, so its directory stays as it was."""
        for fh, mh in self.held:
            logging.getLogger().removeHandler(mh)
            mh.buffer.clear()
            fh.close()
        self.held = []
        if self.claimed and not self.accepted:
            run_lock.release(self.claimed, undo=True)
            self.claimed = None

    def train(self) -> int:
        from training.loop import train
        cfg = self.cfg
        self.open()
        out = Path(cfg.hydra.run.dir)
        if out.resolve().is_relative_to(Path.cwd().resolve()):  # paths as the user sees them
            out = Path(os.path.relpath(out))
        try:
            result = train(self.config, out, cli_overrides=list(cfg.hydra.overrides.task), source=self.source,
                           rt=self.rt, on_start=self.start, device=self.device)
        except Exception as e:  # noqa: BLE001 (re-raised unless a user's mistake or out of memory)
            raise failure(e, self.config) from None
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # trained and closed: a late Ctrl-C must not escape
        self.clean = result.clean
        return result.exit_code


def hydra_job(cfg: DictConfig) -> object:
    """A job hydra.main runs (a sweep's, or a run with Hydra's flags; defined here: Hydra names the job after
    this file): launch.sweep.hydra_job."""
    from launch import sweep
    return sweep.hydra_job(cfg)


def with_override(args: list[str], override: str) -> list[str]:
    """args plus one override, beside the user's own (Hydra wants them together; first if none: `--info x`)."""
    i = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), 0)
    return [*args[:i], override, *args[i:]]


def preflight(args: list[str], multirun: bool) -> list[str]:
    """Before Hydra runs: every job's overrides checked (a sweep's jobs also composed, its directory claimed);
    other --flags are Hydra's. Returns the arguments for hydra.main (a sweep: its directory pinned)."""
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    if multirun and ranks.torchrun_env():
        from runtime.distributed import launched_by_torchrun
        if launched_by_torchrun():
            raise Failed("sweeps (-m) cannot run under torchrun: start one torchrun per configuration")
    if any(a.startswith("-") for a in overrides):
        return args
    try:  # a sweep's jobs: the product of its a=1,2 values, as Hydra's basic sweeper makes them
        lists = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if multirun and
                 o.is_sweep_override() else [o.input_line] for o in OverridesParser.create().parse_overrides(overrides)]
    except OverrideParseException as e:
        from launch.overrides import lexer_hint
        key, _, value = str(e.override).partition("=")
        if value.startswith("~"):  # the shell leaves ~ alone after `key=`, and Hydra refuses it unquoted
            raise Failed(f"cannot read the override {e.override}: Hydra takes ~ only inside quotes: write "
                         f"\"{key}='{value}'\" (tinygpt expands the ~), or {key}=$HOME{value[1:]} for the shell "
                         f"to expand") from None
        raise Failed(lexer_hint(str(e.override)) or f"cannot read the override {e.override}: {e}") from None
    except HydraException:  # glob() / interval() sweeps: only Hydra's sweeper expands them
        lists = None
    jobs = [list(job) for job in itertools.product(*lists)] if lists else []
    for job in jobs[:64]:  # composing takes a moment: a larger sweep is left to Hydra
        try:
            for o in OverridesParser.create().parse_overrides(job):
                if o.is_sweep_override() and not o.is_hydra_override():
                    raise ValueError(f"{o.input_line} gives several values: to sweep over them add -m (python "
                                     f"train.py -m ...), to pass a list use key=[a,b]")
                if not (o.is_hydra_override() or o.is_delete()):
                    check_override(o.key_or_group, o.value(), o.input_line)
            if multirun:
                to_dataclass(compose(job))
        except ERRORS as e:
            where = f" (sweep job {' '.join(job)})" if len(jobs) > 1 else ""
            swept = [a for a in overrides if a.startswith("data.tokenizer=") and "," in a]
            if multirun and swept:  # a sweep gives every job the same settings: bpe's vocab_size would fail char
                mine = next(a for a in job if a.startswith("data.tokenizer="))
                where += (f": a sweep gives all its jobs the same other settings, so sweep each tokenizer on its "
                          f"own: python train.py {' '.join(mine if a in swept else a for a in args)} with the "
                          f"setting above, then the same for the other data.tokenizer values")
            raise Failed(e, where=where) from None
    if not multirun:
        return args
    # the sweep owns its directory (its jobs' are inside): claimed, and pinned for Hydra (the default is dated)
    first = jobs[0] if jobs else [a for a in overrides if a.startswith("hydra.")]
    sweep_dir = str(compose(first, return_hydra_config=True).hydra.sweep.dir)
    if problem := run_lock.claim(sweep_dir, "hydra.sweep.dir"):
        raise Failed(problem)
    from launch.overrides import override
    return [*args, override("hydra.sweep.dir", sweep_dir)]


def main(args: list[str]) -> int:
    from common.files import cache_dir
    # matplotlib (loss.png) keeps its font cache in tinygpt's cache, not in ~/.cache or ~/.config
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    # no CUDA GPU and no experiment chosen: experiment=cpu, so a laptop never starts a multi-hour run
    auto_cpu = not (torch.cuda.is_available() or any(
        a in ("-h", "--help", "--hydra-help", "-sc", "--shell-completion", "--version")
        or a.lstrip("+~").split("=")[0].split("@")[0] == "experiment" for a in args))
    multirun = bool({"-m", "--multirun"} & set(args))
    run = Run(auto_cpu)
    try:
        if not all("=" in a and not a.startswith("-") for a in args):  # nanoGPT's habits, a value the shell split
            from launch.overrides import habit_hint
            if hint := habit_hint(args):
                raise Failed(hint)
        register_configs(sweep=multirun)
        args = preflight(with_override(args, "experiment=cpu") if auto_cpu else args, multirun)
        if not any(a.startswith("-") for a in args):
            run.check(compose(args, return_hydra_config=True))
            return run.train()
        if auto_cpu and multirun:
            console.to_stderr(CPU_NOTE)
        sys.argv[1:] = args
        os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra's own errors raised to the except below
        hydra.main(version_base=None, config_path="conf", config_name="config")(hydra_job)()
        from launch import sweep
        return 1 if sweep.failed() else 0  # (the table said which)
    except (Failed,) + ERRORS as e:
        f = e if isinstance(e, Failed) else Failed(e)
        run.refuse()
        to_files(f.line)
        console.to_stderr(f.line)
        return f.code
    except KeyboardInterrupt:
        run.refuse()
        console.to_stderr("error: interrupted: stopped at once without saving (checkpoints already written are "
                          "intact)")
        return 130
    finally:
        run.refuse()  # a resume that crashed before it started: nothing of it written
        # after an error, leave at once; else together: a rank that left first would have torchrun kill the rest
        if run.rt is not None:
            run.rt.destroy(together=run.clean)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
