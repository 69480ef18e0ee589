"""Train a tinygpt model: `python train.py [key=value ...]` (Hydra; configs in conf/).

This file is deliberately thin; the loop is `training.loop.train(cfg, run_dir)`, a plain function.
What it adds around Hydra:
- Without a CUDA GPU and without an `experiment=` override, it adds `experiment=cpu` (the CPU-sized
  preset) and says so in one line (after the pre-flight, so a mistake is still one line, and in train.log),
  so `python train.py` never starts a multi-hour run on a laptop.
- A pre-flight compose (of every job of a `-m` sweep too; skipped for Hydra's other --flags) turns a
  config mistake (unknown key, wrong type, unknown preset, invalid value) into one `error: ...` line,
  exit 2, before Hydra creates a run directory or runs a single job. It also refuses (single runs) a
  hydra.run.dir that cannot be created, or that holds an earlier run's last.pt without train.resume,
  before Hydra would (re)write that directory's .hydra/ files.
- matplotlib's font cache goes to the tinygpt cache (MPLCONFIGDIR, unless set): a run writes only its
  run directory and the cache directory.
- Under torchrun (`torchrun --standalone --nproc_per_node=N train.py ...`) it joins the process group
  before Hydra starts, so every rank runs in rank 0's run directory (Hydra's default directory is a
  timestamp, which could differ by a second between ranks) and only rank 0 writes `.hydra/`; the group
  is destroyed in a `finally`, also after errors and signals. See training/distributed.py.
- User errors from training (ValueError, OSError, a diverged loss, CUDA out of memory) become one
  `error: ...` line on stderr (also written to the run's train.log) and exit code 2; a run stopped by
  SIGINT/SIGTERM exits 130/143 after saving last.pt. Real bugs keep Hydra's traceback.
"""
from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from training.config import register_configs

CONF_DIR = Path(__file__).resolve().parent / "conf"
EXIT_USER_ERROR = 2

register_configs()


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _log_to_files(message: str, level: int = logging.ERROR) -> None:
    """Put a line printed on stderr into the run's train.log too (file handlers only)."""
    record = logging.makeLogRecord({"name": "train", "msg": message, "levelno": level,
                                    "levelname": logging.getLevelName(level)})
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            try:
                h.handle(record)
            except Exception:  # noqa: BLE001
                pass


def _fail(message: str, code: int = EXIT_USER_ERROR) -> None:
    rank = os.environ.get("RANK", "0").strip() or "0"
    line = f"error: {'' if rank == '0' else f'[rank {rank}] '}{_one_line(message)}"
    _log_to_files(line)
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    import torch
    from hydra.core.hydra_config import HydraConfig

    from training.loop import train

    hc = HydraConfig.get()
    if _auto_cpu:
        _log_to_files(CPU_NOTE, logging.INFO)
    out = Path(hc.runtime.output_dir)
    try:  # show paths relative to where the user ran the command, when they are below it
        out = Path(os.path.relpath(out)) if out.resolve().is_relative_to(Path.cwd().resolve()) else out
    except ValueError:
        pass
    try:
        result = train(cfg, out, cli_overrides=list(hc.overrides.task))
    except torch.OutOfMemoryError:
        _fail(f"out of memory on the GPU with train.batch_size={cfg.train.batch_size}, model.block_size="
              f"{cfg.model.block_size}: lower train.batch_size (and raise train.grad_accum_steps to keep the "
              f"same global batch) or use a smaller model")
    except (ValueError, OSError) as e:
        _fail(str(e) or type(e).__name__)
    except KeyboardInterrupt:
        _fail("interrupted: stopped at once without saving (checkpoints already written are intact)", code=130)
    if result.exit_code:
        sys.exit(result.exit_code)


# ------------------------------------------------------------------------------------- before Hydra

_HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-sc", "--shell-completion", "--version")


def _has_experiment(args: list[str]) -> bool:
    return any(re.match(r"^[+~]*experiment(@[^=]*)?(=|$)", a) for a in args)


CPU_NOTE = ("no CUDA GPU found: using the CPU preset experiment=cpu (nanoGPT's CPU-sized model, trained with "
            "Muon) instead of the GPU baby GPT; pass experiment=shakespeare_char to force the full run")
_auto_cpu = False  # set by the command line below: main() then records CPU_NOTE in train.log


def needs_cpu_preset(args: list[str]) -> bool:
    """No CUDA GPU and no experiment chosen: experiment=cpu, so a laptop never starts a multi-hour run."""
    if _has_experiment(args) or any(a in _HYDRA_INFO_FLAGS for a in args):
        return False
    import torch
    return not torch.cuda.is_available()


def with_override(args: list[str], override: str) -> list[str]:
    """args plus one override, placed beside the user's own. Hydra's argparse reads the overrides as one
    positional run: after a flag (`model=baby --cfg job experiment=cpu`) it would refuse the added one,
    and with no override at all it must come first (`--info` takes an optional value)."""
    i = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), 0)
    return [*args[:i], override, *args[i:]]


def _all_keys(cfg) -> list[str]:
    from omegaconf import OmegaConf
    out = []

    def walk(node, prefix):
        for k in node.keys():
            v = node._get_node(k)
            key = f"{prefix}{k}"
            if OmegaConf.is_dict(v):
                walk(v, key + ".")
            else:
                out.append(key)
    walk(cfg, "")
    return out


def _explain_compose_error(e: BaseException, overrides: list[str]) -> str:
    """A Hydra/OmegaConf composition error as one line that says what to do."""
    msg = str(e)
    cause = e.__cause__ or e.__context__
    m = re.search(r"Could not override '([^']+)'", msg)
    if m:
        key = m.group(1)
        hint = ""
        try:
            from hydra import compose
            keys = _all_keys(compose("config", overrides=[]))
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            if close:
                hint = f" (did you mean {close[0]}?)"
        except Exception:  # noqa: BLE001
            pass
        return f"unknown config key '{key}'{hint}: check the spelling; python train.py --cfg job prints every key"
    m = re.search(r"Error merging override (\S+)", msg)
    if m:
        why = _one_line(cause).split(" full_key:")[0] if cause else "wrong type"
        key = m.group(1).split("=", 1)[0]
        return f"cannot set {m.group(1)}: {why}: give a value of the right type (python train.py --cfg job shows " \
               f"the current value of {key})"
    m = re.search(r"Could not find '([^']+)'", msg)
    if m:
        group, _, option = m.group(1).rpartition("/")
        options = re.findall(r"^\t(\S+)$", msg, flags=re.M)
        if group and options:
            return f"{group}={option} is not a preset: available {group} presets are {', '.join(options)}"
        return _one_line(msg.split("Config search path")[0])
    if "Ambiguous value for argument" in msg:
        return _one_line(msg.split("\n")[0]) + ": to sweep over the values add -m (python train.py -m ...), " \
                                               "to pass a list use key=[a,b]"
    from training.config import one_line
    text = one_line(e)
    if cause is not None:
        text += f" ({one_line(cause)})"
    return text


MAX_PREFLIGHT_JOBS = 64


def _sweep_jobs(overrides: list[str]) -> list[list[str]] | None:
    """The per-job override lists of a `-m` sweep (Hydra's basic sweeper's expansion), None if unknown."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
        parsed = OverridesParser.create().parse_overrides(overrides)
        batches = BasicSweeper.split_arguments(parsed, None)
        return [job for batch in batches for job in batch]
    except Exception:  # noqa: BLE001 - a syntax error etc.: let Hydra report it its own way
        return None


def preflight(args: list[str]) -> None:
    """Compose and validate the config (every job of a -m sweep) before Hydra runs; mistake -> one line, exit 2."""
    multirun = [a for a in args if a in ("-m", "--multirun")]
    rest = [a for a in args if a not in multirun]
    if any(a.startswith("-") for a in rest):  # --cfg, --help, -cn, ...: Hydra's own handling
        return
    jobs = _sweep_jobs(rest) if multirun else [rest]
    if not jobs or len(jobs) > MAX_PREFLIGHT_JOBS:
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from training.config import to_dataclass
    for job in jobs:
        where = f" (sweep job {' '.join(job)})" if multirun and len(jobs) > 1 else ""
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="train"):
                try:
                    cfg = compose("config", overrides=job)
                except (HydraException, OmegaConfBaseException) as e:
                    _fail(_explain_compose_error(e, job) + where)
                c = to_dataclass(cfg)
                if not multirun:
                    try:
                        run_dir = str(compose("config", overrides=job, return_hydra_config=True).hydra.run.dir)
                    except Exception:  # noqa: BLE001 - an unusual hydra.run.dir: Hydra reports it its own way
                        run_dir = None
                    if run_dir:
                        check_run_dir(run_dir, c.train.resume)
        except ValueError as e:
            _fail(str(e) + where)


def check_run_dir(run_dir: str, resume) -> None:
    """Hydra creates the run directory and (re)writes its .hydra/ files before main() runs: a directory
    that cannot be created, or an earlier run's directory without train.resume, is refused first."""
    p = Path(run_dir)
    if resume is False and (p / "last.pt").exists():
        _fail(f"{p} already holds last.pt from an earlier run: continue it with train.resume=true, or choose "
              f"another hydra.run.dir (nothing was overwritten)")
    for parent in (p, *p.parents):
        if parent.exists():
            if not parent.is_dir():
                _fail(f"hydra.run.dir={run_dir} cannot be created: {parent} is a file, not a directory: choose "
                      f"another hydra.run.dir")
            if not os.access(parent, os.W_OK | os.X_OK):
                _fail(f"hydra.run.dir={run_dir} cannot be created: {parent} is not writable: choose another "
                      f"hydra.run.dir or fix its permissions")
            return


def torchrun_main(args: list[str]) -> None:
    """Under torchrun: start the process group, agree on rank 0's run directory, run main(), end the group."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from training import distributed as dist_lib
    from training.device import resolve_device
    if any(a in ("-m", "--multirun") for a in args):
        _fail("sweeps (-m) cannot run under torchrun: start one torchrun per configuration")
    if any(a.startswith("-") for a in args):  # --cfg job, --help, ...: nothing is trained
        main()
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name="train"):
        cfg = compose("config", overrides=args, return_hydra_config=True)
    try:
        device = resolve_device(cfg.train.device, dist_lib.env_info()[2])
        info = dist_lib.init(device, cfg.train.parallel)
    except ValueError as e:
        _fail(str(e))
    try:
        if info.distributed:
            if not any(a.startswith("hydra.run.dir=") for a in args):
                run_dir = dist_lib.broadcast_object(str(OmegaConf.select(cfg, "hydra.run.dir")), info)
                sys.argv[1:] = with_override(sys.argv[1:], f"hydra.run.dir={run_dir}")
            if not info.is_main:  # rank 0 alone records the config in .hydra/
                sys.argv[1:] = with_override(sys.argv[1:], "hydra.output_subdir=null")
        main()
    finally:
        dist_lib.destroy(info)


if __name__ == "__main__":
    from data.sources import cache_dir
    # matplotlib (loss.png) keeps its font cache in tinygpt's cache, not in ~/.cache or ~/.config
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    _auto_cpu = needs_cpu_preset(sys.argv[1:])
    if _auto_cpu:
        sys.argv[1:] = with_override(sys.argv[1:], "experiment=cpu")
    preflight(sys.argv[1:])
    if _auto_cpu and (os.environ.get("RANK", "0").strip() or "0") == "0":  # after the pre-flight: an error stays one line
        print(CPU_NOTE, file=sys.stderr, flush=True)
    from training.distributed import launched_by_torchrun
    if launched_by_torchrun():
        torchrun_main(sys.argv[1:])
    else:
        main()
