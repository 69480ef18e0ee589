"""train.py's command line as Hydra reads it: every job's overrides checked before Hydra runs, values quoted for
Hydra's override grammar (so a printed command, e.g. the resume command, pastes back whatever the path), and one line
with the fix for arguments that are not overrides (nanoGPT's `--batch_size=32` and `config/train_x.py`, a path the
shell split at a space, a value Hydra's lexer refuses).
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException

from common.platform import command_line, script
from launch.config import ERRORS, PRESETS, check_override, compose, to_dataclass
from training.config import KEYS, SCHEMA_KEYS

HYDRA_FLAGS = ("-h", "--help", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--run",
               "-r", "--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn",
               "--config-dir", "-cd", "--info", "-i", "--experimental-rerun")
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
               "--info", "-i", "--experimental-rerun")  # Hydra's flags followed by their value (`--cfg job`)
NANOGPT_KEYS = {  # nanoGPT's train.py globals -> tinygpt's keys
    "learning_rate": "optim.lr", "min_lr": "optim.min_lr", "lr_decay_iters": "optim.decay_iters",
    "warmup_iters": "optim.warmup_iters", "weight_decay": "optim.weight_decay", "beta1": "optim.beta1",
    "beta2": "optim.beta2", "grad_clip": "optim.grad_clip", "gradient_accumulation_steps": "train.grad_accum_steps",
    "dataset": "data", "out_dir": "hydra.run.dir", "wandb_log": "logger", "wandb_project": "logger.project",
    "wandb_run_name": "logger.run_name", "init_from": "model.init_from"}
_PLAIN = re.compile(r"[A-Za-z0-9_./\-]+")  # a value Hydra reads unquoted as the same string


def quote(value: object) -> str:
    """`value` as Hydra's override grammar reads it back unchanged: as is when plain, else single-quoted (a quote
    escaped as \\', a backslash doubled where it precedes a quote or ends the value)."""
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null") and not _number(text):
        return text
    return "'" + re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text).replace("'", "\\'") + "'"


def _number(text: str) -> bool:
    try:
        float(text.replace("_", ""))
        return True
    except ValueError:
        return False


def override(key: str, value: object) -> str:
    """`key=value` with the value quoted for Hydra (give it to common.platform.command_line for the shell)."""
    return f"{key}={quote(value)}"


def _key_for(name: str) -> Optional[str]:
    name = name.replace("-", "_")
    if name in SCHEMA_KEYS or name in PRESETS:
        return name
    if name in KEYS or name in NANOGPT_KEYS:
        return KEYS.get(name) or NANOGPT_KEYS[name]
    leaf = {k.rsplit(".", 1)[1]: k for k in SCHEMA_KEYS}
    return leaf.get(name)


def flag_hint(arg: str) -> Optional[str]:
    """Why a `--name[=value]` argument is not for train.py (nanoGPT's style), with the override to write; None for
    Hydra's own flags."""
    name, eq, value = arg.lstrip("-").partition("=")
    if arg.split("=")[0] in HYDRA_FLAGS or not arg.startswith("--"):
        return None
    key = _key_for(name)
    if not key:
        shown = "key=value"
    else:
        shown = f"{key}={value if _PLAIN.fullmatch(value) else quote(value)}" if eq else f"{key}=..."
    return (f"{arg} is a --flag, but train.py takes Hydra overrides (key=value, no dashes): write {shown} "
            f"(python train.py --cfg job lists every key)")


def word_hint(arg: str, before: Optional[str]) -> Optional[str]:
    """Why a bare argument (no `=`) is not an override: a nanoGPT config file, or the rest of a value the shell
    split at a space (`before`: the argument before it); None when it has an `=`."""
    if "=" in arg:
        return None
    if arg.endswith(".py"):
        stem = re.sub(r"^(train|config)_", "", arg.replace("\\", "/").rsplit("/", 1)[-1][:-3])
        fix = (f"experiment={stem}" if stem in PRESETS.get("experiment", ()) else
               f"an experiment preset ({', '.join(PRESETS.get('experiment', ()))}) or key=value overrides")
        return (f"{arg} is a Python config file (nanoGPT's style): train.py takes Hydra presets and overrides "
                f"instead: use {fix}")
    if before is not None and "=" in before and not before.startswith("-"):
        key, _, value = before.partition("=")
        return (f"{arg} is not an override (key=value): if it belongs to {before} (a value with a space), quote "
                f"the value for Hydra and the shell: \"{override(key, f'{value} {arg}')}\"")
    return f"{arg} is not an override: write key=value (e.g. train.max_iters=500); python train.py --help shows more"


def lexer_hint(arg: str) -> Optional[str]:
    """The fix for a `key=value` Hydra's lexer cannot read (spaces, non-ASCII, quotes): the value quoted."""
    key, eq, value = arg.partition("=")
    if not eq or not re.fullmatch(r"[+~]{0,2}[\w.@/-]+", key) or value[:1] in ("'", '"', "[", "{"):
        return None
    return (f"cannot read the override {arg}: Hydra needs quotes around a value with spaces, quotes or non-ASCII "
            f"characters: write \"{key}={quote(value) if quote(value) != value else repr(value)}\"")


def habit_hint(args: list[str]) -> Optional[str]:
    """The user's own arguments (before train.py adds any): nanoGPT's --key=value and config files, and values the
    shell split at a space, each refused in one line with the override to write; None: nothing to say."""
    for i, a in enumerate(args):
        before = args[i - 1] if i else None
        if hint := flag_hint(a) if a.startswith("-") else None if before in VALUE_FLAGS else word_hint(a, before):
            return hint
    return None


def data_path_note(name: str, path: object, overrides: list[str]) -> Optional[str]:
    """One line when data.path is given but the data set is not chosen on the command line: the file is then
    read as that preset's text (a local copy of Tiny Shakespeare), which a user may not mean."""
    if name == "text" or not path or any(o.lstrip("+~").split("=")[0].split("@")[0] == "data" for o in overrides):
        return None
    return (f"note: data.path={path} is read as data={name}'s text (a local copy of it) and the run is labelled "
            f"{name}: to train on your own text add data=text")


def resume_command(run_dir: Path, cli_overrides: Optional[list[str]], ranks=None) -> str:
    """The command that resumes this run, launched as it was: its overrides, run dir and train.resume=true, from
    the directory it was launched in (train.py's path from there: common.platform.script)."""
    keep = [o for o in (cli_overrides or []) if not o.startswith(("train.resume=", "hydra.run.dir=", "hydra.sweep."))]
    launch = ["python"]
    if ranks is not None and ranks.distributed:
        local = ranks.local_world_size
        nodes = max(1, ranks.world_size // max(1, local))
        launch = ["torchrun", "--standalone", f"--nproc_per_node={local}"] if nodes == 1 else \
            ["torchrun", f"--nnodes={nodes}", "--node-rank=NODE_RANK", f"--nproc_per_node={local}",
             "--rdzv-backend=c10d", "--rdzv-endpoint=HOST:PORT"]
    # (the user's overrides are as Hydra read them, quoted already; the run dir is quoted for Hydra here)
    return command_line([*launch, script("train.py"), *keep, override("hydra.run.dir", run_dir), "train.resume=true"])


def with_override(args: list[str], override: str) -> list[str]:
    """args plus one override, beside the user's own (Hydra wants them together; first if none: `--info x`)."""
    i = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), 0)
    return [*args[:i], override, *args[i:]]


def _parse(overrides: list[str], multirun: bool) -> Optional[list[list[str]]]:
    """A sweep's jobs: the product of its a=1,2 values, as Hydra's basic sweeper makes them (one job without -m);
    None for glob() / interval() sweeps, which only Hydra's sweeper expands."""
    try:
        lists = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if multirun and
                 o.is_sweep_override() else [o.input_line] for o in OverridesParser.create().parse_overrides(overrides)]
    except OverrideParseException as e:
        key, _, value = str(e.override).partition("=")
        if value.startswith("~"):  # the shell leaves ~ alone after `key=`, and Hydra refuses it unquoted
            raise ValueError(f"cannot read the override {e.override}: Hydra takes ~ only inside quotes: write "
                             f"\"{key}='{value}'\" (tinygpt expands the ~), or {key}=$HOME{value[1:]} for the shell "
                             f"to expand") from None
        raise ValueError(lexer_hint(str(e.override)) or f"cannot read the override {e.override}: {e}") from None
    except HydraException:
        return None
    return [list(job) for job in itertools.product(*lists)]


def check_command_line(args: list[str], multirun: bool) -> list[list[str]]:
    """Before Hydra runs: every job's overrides checked (a sweep's jobs also composed and validated), so a mistake
    is one line before anything starts. Returns the jobs' overrides ([] for Hydra's own --flags)."""
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    if any(a.startswith("-") for a in overrides):
        return []
    jobs = _parse(overrides, multirun) or []
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
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)  # Hydra's: 1st line
            raise ValueError(first + where) from None
    return jobs
