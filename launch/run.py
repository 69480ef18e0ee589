"""One run's setup, edge and one-line failure, alike for `python train.py`, a sweep's job and an in-process `train()`:
config checked into dataclasses, fine-tune weights opened, job joined, device resolved, memory checked, run directory
claimed, before anything is written; then `execute` has training/loop.py train inside the guarantees kept here.
`HydraRun` adds Hydra's job runner's part (.hydra/, train.log), held back until a resume is accepted.
"""
from __future__ import annotations

import logging
import os
import signal
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from logging.handlers import MemoryHandler
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from checkpoint.manager import overwrite_refusal, starts_afresh
from common import run_lock, startup
from common.cli import one_line
from launch import memory
from launch.config import to_dataclass
from launch.notes import cpu_note, start_notes, sweep_cpu_notes  # noqa: F401 (sweep_cpu_notes: train.py's)
from model.device import resolve_device
from runtime import console
from runtime.console import to_files, to_stderr
from runtime.ranks import Ranks, torchrun_env
from runtime.signals import SIGPIPE, run_under_way
from training import loop
from training.config import Config, train_keys
from training.edge import Edge
from training.state import TrainResult
from training.step import TrainingDiverged

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


def join_job(device: str, parallel: str) -> Ranks:
    """This process's place in the job: a torchrun job's process group (runtime/distributed.py, imported only
    then, or when train.parallel asks for one and is told why not), else one process."""
    if torchrun_env() or parallel != "none":
        from runtime import distributed
        return distributed.join(device, parallel)
    return Ranks()


@dataclass
class Setup:
    """A run checked and ready: its config, directory, place in the job, device and fine-tune source."""
    config: Config
    run_dir: Path
    ranks: Ranks
    device: torch.device
    overrides: list[str] = field(default_factory=list)  # the command line's, as Hydra read them
    source: Any = None  # training.init_from.Source, when model.init_from is set
    claimed: Optional[str] = None  # the run directory this process locked
    created: bool = False  # and made: it did not exist before

    def unclaim(self) -> None:
        """A run refused before it started: the lock file as it was, a directory it made removed (when empty)."""
        if self.claimed:
            run_lock.release(self.claimed, undo=True)
            if self.created and not any(Path(self.claimed).iterdir()):
                Path(self.claimed).rmdir()
            self.claimed = None

    def resume_command(self) -> str:
        from launch.overrides import resume_command
        return resume_command(self.run_dir, self.overrides, self.ranks)


def set_up(cfg: Any, run_dir: Optional[str | os.PathLike] = None, overrides: Optional[list[str]] = None, *,
           claim: bool = True) -> Setup:
    """The checks every run passes, in order, before it writes anything; a ValueError (one line) for a mistake.
    `claim`: lock the run directory (a sweep's job is inside its sweep's, locked already)."""
    config, overrides = to_dataclass(cfg), list(overrides or [])
    startup.mark("config checked")
    source = None
    if config.model.init_from:  # a fine-tune's shape is its source's
        from training import init_from
        source = init_from.apply(config, overrides)
    with train_keys():  # a bad device is told as train.device=...
        ranks = join_job(config.train.device, config.train.parallel)
    try:
        with train_keys():
            device = resolve_device(config.train.device, ranks.local_rank)  # the run's, resolved once
        startup.mark("device resolved")
        # rank 0's directory for all (by default a dated one); rank 0 checks memory and claims the directory
        dated = datetime.now().strftime("outputs/%Y-%m-%d/%H-%M-%S")
        given = str(ranks.broadcast_object(str(run_dir if run_dir is not None else dated)))
        run_dir = Path(given)
        problem = memory.check(config, device, ranks.world_size, ranks.local_world_size) if ranks.is_main else None
        startup.mark("memory check (on CUDA: its context made)")
        claimed, created = None, not run_dir.exists()
        if ranks.is_main and not problem:
            key = "hydra.run.dir" if claim else "hydra.sweep.dir"  # (a sweep's job: its sweep's directory)
            refusal = (lambda d: overwrite_refusal(d, key)) if starts_afresh(config.train.resume, run_dir) else None
            problem = run_lock.claim(given, key, refusal) if claim else refusal and refusal(run_dir)
            claimed = given if claim and not problem else None
        if problem := ranks.broadcast_object(problem):
            raise ValueError(problem)
    except BaseException:
        ranks.destroy()
        raise
    return Setup(config, run_dir, ranks, device, overrides, source, claimed, created)


def train(cfg: Any, run_dir: Optional[str | os.PathLike] = None, *, cli_overrides: Optional[list[str]] = None,
          claim: bool = True) -> TrainResult:
    """Set up and train in this process (`cfg`: a composed config, a dict or a Config), as `python train.py` does;
    the run directory is unlocked on return (a refused run's as it was)."""
    setup, started = set_up(cfg, run_dir, cli_overrides, claim=claim), []
    try:
        return execute(setup, on_start=lambda: started.append(True))
    finally:
        if not started:
            setup.unclaim()
        elif setup.claimed:
            run_lock.release(setup.claimed)


def execute(setup: Setup, on_start: Optional[Callable[[], None]] = None) -> TrainResult:
    """training/loop.py's train() of a set-up run, inside its guarantees."""
    with guarantees(setup, on_start) as edge:
        edge.outcome = loop.train(setup.config, edge, setup.device, setup.source)
    return edge.outcome


@contextmanager
def guarantees(setup: Setup, on_start: Optional[Callable[[], None]] = None) -> Iterator[Edge]:
    """The hooks (training/edge.py) a set-up run trains with, and what surrounds it: once set up (a resume
    accepted), `on_start()`, rank 0's warnings (launch/notes.py) and Ctrl-C the run's; rank 0's summary also
    after an error; a stopped run's closing line; the process group left together when the run ended well (else
    at once). The caller sets `edge.outcome` to what train() returned."""
    # clean: ended where every rank ends (ranks leave together)
    status, clean = "failed", False
    try:
        notes = start_notes(setup.config, setup.device, setup.overrides) if setup.ranks.is_main else []
        edge = Edge(setup.config, setup.run_dir, setup.ranks, setup.source)
        # under_way: from on_start to the closing line, Ctrl-C is the run's (runtime/signals.py); train_keys:
        # the data and model libraries' errors told in this config's keys (data.path, model.block_size)
        with ExitStack() as under_way, train_keys():
            def started() -> None:
                if on_start is not None:
                    on_start()
                for line in notes:
                    say(f"warning: {line}", logging.WARNING)
                under_way.enter_context(run_under_way())
            edge.on_start = started
            try:
                yield edge
                status, clean = edge.outcome.status, True
            # a second Ctrl-C (or one before the loop's handler), or a library's write that met the closed
            # pipe: no more saving
            except (KeyboardInterrupt, BrokenPipeError) as e:
                edge.stop_request.signum = SIGPIPE if isinstance(e, BrokenPipeError) else signal.SIGINT
                status = edge.stop_request.status
            except TrainingDiverged:
                status = "diverged"
                raise
            finally:
                edge.close()
                try:
                    edge.finish(status)
                # a Ctrl-C while finishing (every file is written atomically)
                except KeyboardInterrupt:
                    edge.outcome, clean = None, False
            edge.outcome = edge.closing(edge.outcome, setup.resume_command)
    finally:
        setup.ranks.destroy(together=clean)


class HydraRun:
    """`python train.py`'s run (not a sweep's job): Hydra's job runner's part done here, so that a refused resume
    leaves its directory as it was: train.log's lines are held back and .hydra/ is written once it is accepted."""

    def __init__(self, cfg, auto_cpu: bool):
        from omegaconf import OmegaConf, read_write
        from hydra.types import RunMode
        self.cfg, self.auto_cpu, self.held, self.accepted, self.setup = cfg, auto_cpu, [], False, None
        self.exit_code = 1
        self.job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # the run's config, without Hydra's
        try:
            self.setup = set_up(self.job, str(cfg.hydra.run.dir), list(cfg.hydra.overrides.task))
        except (ValueError, OSError) as e:  # (OSError: a file a setting names, e.g. train.hellaswag, is missing)
            raise Failed(e) from None
        with read_write(cfg.hydra):
            cfg.hydra.run.dir = str(self.setup.run_dir)
            cfg.hydra.runtime.output_dir = str(self.setup.run_dir.resolve())
            cfg.hydra.mode = RunMode.RUN
        data = self.setup.config.data
        if self.setup.ranks.is_main and data.path and data.name != "text":  # data.path alone: the preset's
            from launch.overrides import data_path_note
            if note := data_path_note(data.name, data.path, self.setup.overrides):
                to_stderr(note)

    @contextmanager
    def guarantees(self) -> Iterator[Edge]:
        """Hydra's logging set up, then the run's guarantees (as `guarantees` above); a user's mistake or an
        out-of-memory becomes the one error line; `exit_code` once it is over."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import configure_log
        HydraConfig.instance().set_config(self.cfg)
        Path(self.cfg.hydra.runtime.output_dir).mkdir(parents=True, exist_ok=True)
        configure_log(self.cfg.hydra.job_logging, self.cfg.hydra.verbose)
        # the console's one handler (`train.py | head`: the run stops as on Ctrl-C, quietly)
        console.setup()
        # train.log's lines wait until the resume is accepted
        if self.setup.config.train.resume is not False:
            root = logging.getLogger()
            for fh in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
                mh = MemoryHandler(1 << 30, logging.CRITICAL + 1, fh, flushOnClose=False)
                root.removeHandler(fh)
                root.addHandler(mh)
                self.held.append((fh, mh))
        else:
            self.accept()
        # paths as the user sees them
        if self.setup.run_dir.resolve().is_relative_to(Path.cwd().resolve()):
            self.setup.run_dir = Path(os.path.relpath(self.setup.run_dir))
        try:
            with guarantees(self.setup, on_start=self.start) as edge:
                yield edge
        # re-raised unless a user's mistake or out of memory
        except Exception as e:  # noqa: BLE001
            raise failure(e, self.setup.config) from None
        # trained and closed: a late Ctrl-C must not escape
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.exit_code = edge.outcome.exit_code

    def start(self) -> None:
        """The loop's on_start: set up (a resume accepted), before step 1."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (until now it said nothing was saved: no longer true)
        self.accept()
        if self.auto_cpu and self.setup.ranks.is_main:  # said only when the run starts on it, not ahead of a mistake
            say(cpu_note(self.setup.config), logging.INFO)

    def accept(self) -> None:
        """The run goes ahead: .hydra/ written as Hydra writes it (rank 0), train.log's held lines let through."""
        from omegaconf import OmegaConf
        from common.files import write_text_atomic
        if self.accepted:
            return
        self.accepted, cfg, root = True, self.cfg, logging.getLogger()
        if self.setup.ranks.is_main and cfg.hydra.output_subdir is not None:
            record = Path(cfg.hydra.runtime.output_dir) / cfg.hydra.output_subdir
            for name, node in (("config.yaml", self.job),
                               ("hydra.yaml", OmegaConf.masked_copy(cfg, "hydra")),
                               ("overrides.yaml", cfg.hydra.overrides.task)):
                write_text_atomic(record / name, OmegaConf.to_yaml(node))
        for fh, mh in self.held:
            mh.flush()
            root.removeHandler(mh)
            root.addHandler(fh)
        self.held = []

    def refuse(self) -> None:
        """Before it was accepted: train.log's held lines dropped, the lock file as it was (its directory too)."""
        for fh, mh in self.held:
            logging.getLogger().removeHandler(mh)
            mh.buffer.clear()
            fh.close()
        self.held = []
        if self.setup and not self.accepted:
            self.setup.unclaim()


def say(line: str, level: int) -> None:
    """A line for the user before the first step: on stderr and in train.log."""
    to_stderr(line)
    to_files(line, level)


def say_failure(f: Failed) -> int:
    """A run's one error line, in train.log and on stderr (in one write: under torchrun, ranks' lines never mix)."""
    to_files(f.line)
    to_stderr(f.line)
    return f.code


