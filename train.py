"""Train a tinygpt model: `python train.py [key=value ...]` (Hydra; configs in conf/, the loop in training/loop.py).
Around Hydra, so a mistake is one `error: ...` line before anything runs: docs/design.md ("Training loop", train.py).
"""
from __future__ import annotations

from common.threads import configure_threads

configure_threads()  # before torch is imported (so the imports below come after it): see common/threads.py

import itertools
import logging
import os
import re
import signal
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write
from omegaconf.errors import OmegaConfBaseException

from checkpoint.manager import overwrite_refusal
from common import run_lock
from common.text import one_line
from launch import console, memory, ranks
from model.device import resolve_device
from training.config import check_override, register_configs, to_dataclass, train_keys

RANK = os.environ.get("RANK", "0").strip() or "0"
CPU_OOM = ("can't allocate memory", "DefaultCPUAllocator: not enough memory")  # torch's CPU allocator failing
CPU_NOTE = ("no CUDA GPU found: using the CPU preset experiment=cpu (nanoGPT's CPU-sized model, trained with "
            "Muon) instead of the GPU baby GPT; pass experiment=shakespeare_char to force the full run")
_auto_cpu = _told = _raise_hydra_errors = None  # set by the command line
_config = _source = _rt = _device = None  # Checks' work, done once: the Config, its fine-tune source, DistInfo, device
_clean = False  # main's run ended, or stopped on a signal every rank agreed on: ranks leave together
_record = None  # a resume's run dir as it was: put back if the resume is refused
_failure: tuple[str, str] | None = None  # (status, error line) of the last _fail: a sweep job's outcome


def _log_to_files(message: str, level: int = logging.ERROR) -> None:
    for h in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]:  # train.log
        h.handle(logging.LogRecord("train", level, __file__, 0, message, None, None))


def _fail(message: object, code: int = 2, where: str = "", status: str = "failed") -> None:
    """One `error: ...` line on stderr and in train.log, then exit (of a Hydra/OmegaConf error: its first line);
    a refused resume's run dir is put back as it was first (train.log then does not get the line)."""
    global _failure
    if isinstance(message, (HydraException, OmegaConfBaseException)):
        message = next((ln for ln in str(message).splitlines() if ln.strip()), type(message).__name__)
    line = f"error: {'' if RANK == '0' else f'[rank {RANK}] '}{one_line(message)}{where}"
    if _record is not None:
        _record.restore()
    _log_to_files(line)
    _failure = (status, line)
    sys.stderr.write(line + "\n")  # one write: under torchrun, ranks' lines never run together
    sys.stderr.flush()
    sys.exit(code)


def _say_cpu_preset() -> None:
    global _told  # once, on rank 0, after the checks (so a mistake stays one line)
    if _auto_cpu and not _told and RANK == "0":
        print(CPU_NOTE, file=sys.stderr, flush=True)
    _told = True


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> object:
    """One run; a sweep's job returns its outcome instead of exiting, so that the sweep goes on (launch/sweep.py)."""
    console.setup()  # the console's one handler (`train.py | head`: the run stops as on Ctrl-C, quietly)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return _run(cfg)
    from launch import sweep
    try:
        _run(cfg)
    except SystemExit as e:
        if e.code not in (0, None, 2):  # stopped by a signal: so is the sweep
            raise
        return sweep.outcome(*_failure) if e.code == 2 and _failure else sweep.outcome("completed")
    except Exception as e:  # noqa: BLE001 (a bug in one job: its traceback in its train.log, the sweep goes on)
        logging.getLogger(__name__).exception(f"sweep job failed: {type(e).__name__}: {one_line(e)}")
        return sweep.outcome("failed", f"error: {type(e).__name__}: {one_line(e)}")
    return sweep.outcome("completed")


def _run(cfg: DictConfig) -> None:
    global _clean
    if _raise_hydra_errors:  # the job's own errors get Hydra's usual report
        os.environ.pop("HYDRA_FULL_ERROR", None)
    from training.loop import TrainingDiverged, train
    if _auto_cpu:
        _log_to_files(CPU_NOTE, logging.INFO)
    out = Path(HydraConfig.get().runtime.output_dir)
    if out.resolve().is_relative_to(Path.cwd().resolve()):  # paths as the user sees them
        out = Path(os.path.relpath(out))
    oom = (f"with train.batch_size={cfg.train.batch_size}, model.block_size={cfg.model.block_size}: lower "
           f"train.batch_size (and raise train.grad_accum_steps to keep the same global batch) or use a smaller model")
    try:
        result = train(_config or cfg, out, cli_overrides=list(HydraConfig.get().overrides.task), source=_source,
                       rt=_rt, on_start=_record.keep if _record else None, device=_device)  # (a sweep's job:
        # train() sets itself up)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # trained and closed: a late Ctrl-C must not escape
        _clean = result.clean
    except torch.OutOfMemoryError:
        _fail("out of memory on the GPU " + oom)
    except (MemoryError, RuntimeError) as e:  # numpy's _ArrayMemoryError is a MemoryError; torch's CPU one is not
        if not isinstance(e, MemoryError) and not any(s in str(e) for s in CPU_OOM):
            raise
        size = re.search(r"allocate (\d+) bytes|allocate ([\d.]+ \w+)", str(e))
        what = f" (allocating {memory.gib(int(size[1])) if size[1] else size[2]} failed)" if size else ""
        _fail(f"out of memory on the CPU{what} " + oom)
    except TrainingDiverged as e:
        _fail(str(e), status="diverged")
    except (ValueError, OSError) as e:
        _fail(str(e) or type(e).__name__)
    except KeyboardInterrupt:
        _fail("interrupted: stopped at once without saving (checkpoints already written are intact)", code=130)
    if result.exit_code:
        sys.exit(result.exit_code)


def claim(given: str, key: str, resume: object = None) -> str | None:
    """Lock `given` as this process's run (or sweep) directory for its life; else the one-line reason why not."""
    path = Path(given)
    if path.resolve() == Path.cwd().resolve():
        return (f"{key}={given or repr(given)} is the current directory, where the run's files (last.pt, "
                f"train.log, .hydra/) would mix with yours: give the run a directory of its own, e.g. "
                f"{key}=runs/demo, or leave {key} out for a new dated one")
    busy = "wait for it to finish, or choose another " + key
    for up in (path.resolve(), *path.resolve().parents):  # a live run's or sweep's directory, or one inside it
        if who := run_lock.holder(up):
            return (f"{key}={given} is in use by another training run ({who}): {busy}" if up == path.resolve() else
                    f"{key}={given} is inside {up}, which another training run is using ({who}): {busy}")
    if resume is False and (refusal := overwrite_refusal(path)):
        return refusal
    parent = next(d for d in (path, *path.parents) if d.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{key}={path} cannot be created: {parent} is " + (
            f"not writable: choose another {key} or fix its permissions" if parent.is_dir() else
            f"a file, not a directory: choose another {key}")
    try:
        if not run_lock.acquire(path):
            print(f"warning: {path} cannot be locked on this filesystem: make sure no other run uses it",
                  file=sys.stderr, flush=True)
    except run_lock.DirectoryInUse as e:  # it started a moment ago
        return f"{key}={given} is in use by another training run ({e}): {busy}"
    except OSError as e:
        return f"{key}={path} cannot be created: {e.strerror or e}: choose another {key}"
    return overwrite_refusal(path) if resume is False else None  # one that ended meanwhile


class Checks(Callback):
    """Checks the composed config before Hydra makes the run directory (it would turn an exception into a warning)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        global _config, _source, _rt, _device, _record
        try:
            _config = c = to_dataclass(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
            if c.model.init_from:  # a fine-tune's shape is its source's
                from training import init_from
                _source = init_from.apply(c, list(config.hydra.overrides.task))
            with train_keys():  # a bad device is told as train.device=...
                _rt = rt = ranks.init(c.train.device, c.train.parallel)  # joins the torchrun job, if any
                _device = device = resolve_device(c.train.device, rt.local_rank)  # the run's, resolved once
            if rt.distributed:  # rank 0's run directory for all (the default is a timestamp)
                with read_write(config.hydra):
                    config.hydra.run.dir = ranks.broadcast_object(str(config.hydra.run.dir), rt)
                    if not rt.is_main:  # rank 0 alone records the config in .hydra/
                        config.hydra.output_subdir = None
            # rank 0 checks memory (before any allocation) and claims the directory for all
            problem = memory.check(c, device, rt.world_size, rt.local_world_size) if rt.is_main else None
        except (ValueError, HydraException, OmegaConfBaseException) as e:
            _fail(e)
        if rt.is_main and c.train.resume is not False:  # before claim() and Hydra write into the run dir
            from launch.hydra_record import RecordSnapshot
            _record = RecordSnapshot(config.hydra.run.dir, config.hydra.output_subdir)
        if rt.is_main and not problem:
            problem = claim(str(config.hydra.run.dir), "hydra.run.dir", c.train.resume)
        if problem := ranks.broadcast_object(problem, rt):
            _fail(problem)
        _say_cpu_preset()
        if rt.is_main and c.data.path and c.data.name != "text":  # data.path alone: said to be read as the preset's
            from launch.overrides import data_path_note
            if note := data_path_note(c.data.name, c.data.path, list(config.hydra.overrides.task)):
                print(note, file=sys.stderr, flush=True)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        """A sweep owns its sweep directory (before multirun.yaml is written): its jobs' directories are inside."""
        if problem := claim(str(config.hydra.sweep.dir), "hydra.sweep.dir"):
            _fail(problem)


def with_override(args: list[str], override: str) -> list[str]:
    """args plus one override, beside the user's own (Hydra wants them together; first if none: `--info x`)."""
    i = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), 0)
    return [*args[:i], override, *args[i:]]


def habits(args: list[str]) -> None:
    """The user's own arguments (before train.py adds any): nanoGPT's --key=value and config files, and values the
    shell split at a space, each refused in one line with the override to write."""
    if all("=" in a and not a.startswith("-") for a in args):
        return
    from launch.overrides import VALUE_FLAGS, flag_hint, word_hint
    for i, a in enumerate(args):
        before = args[i - 1] if i else None
        hint = flag_hint(a) if a.startswith("-") else None if before in VALUE_FLAGS else word_hint(a, before)
        if hint:
            _fail(hint)


def preflight(args: list[str]) -> None:
    """Before Hydra runs: every job's overrides checked (a sweep's jobs also composed); other --flags are Hydra's."""
    multirun = bool({"-m", "--multirun"} & set(args))
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    if multirun and any(k in os.environ for k in ranks.TORCHRUN_ENV):
        from launch.distributed import launched_by_torchrun
        if launched_by_torchrun():
            _fail("sweeps (-m) cannot run under torchrun: start one torchrun per configuration")
    if any(a.startswith("-") for a in overrides):
        return
    try:  # a sweep's jobs: the product of its a=1,2 values, as Hydra's basic sweeper makes them
        lists = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if multirun and
                 o.is_sweep_override() else [o.input_line] for o in OverridesParser.create().parse_overrides(overrides)]
    except OverrideParseException as e:
        from launch.overrides import lexer_hint
        key, _, value = str(e.override).partition("=")
        if value.startswith("~"):  # the shell leaves ~ alone after `key=`, and Hydra refuses it unquoted
            _fail(f"cannot read the override {e.override}: Hydra takes ~ only inside quotes: write "
                  f"\"{key}='{value}'\" (tinygpt expands the ~), or {key}=$HOME{value[1:]} for the shell to expand")
        _fail(lexer_hint(str(e.override)) or f"cannot read the override {e.override}: {e}")
    except HydraException:  # glob() / interval() sweeps: only Hydra's sweeper expands them
        return
    jobs = [list(job) for job in itertools.product(*lists)]
    for job in jobs[:64]:  # composing takes a moment: a larger sweep is left to Hydra
        try:
            for o in OverridesParser.create().parse_overrides(job):
                if o.is_sweep_override() and not o.is_hydra_override():
                    raise ValueError(f"{o.input_line} gives several values: to sweep over them add -m (python "
                                     f"train.py -m ...), to pass a list use key=[a,b]")
                if not (o.is_hydra_override() or o.is_delete()):
                    check_override(o.key_or_group, o.value(), o.input_line)
            if multirun:
                with hydra.initialize(config_path="conf", version_base=None, job_name="train"):
                    to_dataclass(hydra.compose("config", overrides=job))
        except (ValueError, HydraException, OmegaConfBaseException) as e:
            _fail(e, where=f" (sweep job {' '.join(job)})" if len(jobs) > 1 else "")


if __name__ == "__main__":
    from data import cache_dir
    # matplotlib (loss.png) keeps its font cache in tinygpt's cache, not in ~/.cache or ~/.config
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    # no CUDA GPU and no experiment chosen: experiment=cpu, so a laptop never starts a multi-hour run
    _auto_cpu = not (torch.cuda.is_available() or any(
        a in ("-h", "--help", "--hydra-help", "-sc", "--shell-completion", "--version")
        or a.lstrip("+~").split("=")[0].split("@")[0] == "experiment" for a in sys.argv[1:]))
    habits(sys.argv[1:])
    register_configs(sweep=bool({"-m", "--multirun"} & set(sys.argv[1:])))
    if _auto_cpu:
        sys.argv[1:] = with_override(sys.argv[1:], "experiment=cpu")
    preflight(sys.argv[1:])
    if any(a.startswith("-") for a in sys.argv[1:]):  # a sweep, --cfg job, --info, ...: no on_run_start
        _say_cpu_preset()
    _raise_hydra_errors = "HYDRA_FULL_ERROR" not in os.environ  # so that a composition error the checks did
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # not foresee is raised to the except below (main() undoes it)
    try:
        main()
    except (HydraException, OmegaConfBaseException) as e:
        _fail(e)
    finally:
        if _record is not None:  # a resume that crashed before it started: its run dir as it was
            _record.restore()
        # after an error, leave at once; else together: a rank that left first would have torchrun kill the rest
        ranks.destroy(_rt, together=_clean)
    if "launch.sweep" in sys.modules and sys.modules["launch.sweep"].failed():  # (the table said which)
        sys.exit(1)
