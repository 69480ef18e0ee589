"""The run's config at the edge: train.py's command line checked before Hydra runs, composed as Hydra composes it,
and turned into training/config.py's dataclasses once.

The schema is registered with Hydra's ConfigStore, so presets (conf/<group>/<option>.yaml, each listing only what it
changes) and overrides merge onto typed fields that hold every default. Every job's overrides are checked before Hydra
composes (a wrong key gets a "did you mean", a value Hydra's lexer refuses its quoted form: `quote`), and
`to_dataclass` is the one place a composed config becomes plain dataclasses (checked: GPTConfig's construction and
`check`; then `normalize`d). What train.py says of arguments that are not overrides: launch/overrides.py.
"""
from __future__ import annotations

import difflib
import itertools
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable, Optional

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from common.platform import command_line, script
from training.config import SCHEMA_KEYS, Config, check, normalize, train_keys

ERRORS = (ValueError, HydraException, OmegaConfBaseException)  # a user's mistake, told in one line
GROUPS = {f.name: f.default_factory for f in fields(Config)}  # model -> its defaults (GPTConfig), ...

CONF = Path(__file__).resolve().parents[1] / "conf"
PRESETS = {d.name: sorted(f.stem for f in d.glob("*.yaml"))  # conf/<group>/<option>.yaml, for `group=option`
           for d in CONF.iterdir() if d.is_dir() and d.name != "hydra"}


def preset(group: str, name: str) -> dict:
    """conf/<group>/<name>.yaml as a plain dict, over its group's defaults (a preset lists only what it changes) but
    an experiment's as written (benchmarks read the model sizes from the presets)."""
    path = CONF / group / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown {group} preset {name!r} ({path} does not exist): use one of "
                         f"{', '.join(PRESETS.get(group, ()))}")
    schema = OmegaConf.structured(GROUPS[group]()) if group in GROUPS else {}
    return OmegaConf.to_container(OmegaConf.merge(schema, OmegaConf.load(path)), resolve=True)


NO_PRESET = re.compile(r"~\w+")  # Hydra's `~group` (no preset of that group): an override without `=`


def no_preset(args: list[str]) -> list[str]:
    """`group=null` (e.g. `experiment=null`: conf/config.yaml's own defaults), `group=~`, and the home directory
    bash makes of an unquoted `experiment=~`, as Hydra's `~group` (Hydra refuses a null group override)."""
    def one(arg: str) -> str:
        key, eq, value = arg.partition("=")
        null = value.lower() in ("null", "~", "'~'", '"~"') or (value == os.path.expanduser("~") and value != "~")
        return f"~{key}" if eq and key in PRESETS and null else arg
    return [one(a) for a in args]


PLAIN = re.compile(r"[A-Za-z0-9_./\-]+")  # a value Hydra reads unquoted as the same string


def quote(value: object) -> str:
    """`value` as Hydra's override grammar reads it back unchanged: as is when plain, else single-quoted (a quote
    escaped as \\', a backslash doubled where it precedes a quote or ends the value)."""
    text = str(value)
    if PLAIN.fullmatch(text) and text.lower() not in ("true", "false", "null") and not _number(text):
        return text
    return "'" + re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text).replace("'", "\\'") + "'"


def _number(text: str) -> bool:
    try:
        float(text.replace("_", ""))
        return True
    except ValueError:
        return False


def with_override(args: list[str], override: str) -> list[str]:
    """args plus one override, beside the user's own (Hydra wants them together; first if none: `--info x`)."""
    i = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")), 0)
    return [*args[:i], override, *args[i:]]


def register_configs(sweep: bool = False) -> None:
    """Register the schema with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)  # first in conf/config.yaml's defaults
    # a sweep's (-m) report (launch/sweep.py), registered in code so that no YAML preset names code for Hydra to run
    callbacks = {"sweep": {"_target_": "launch.sweep.SweepReport"}} if sweep else {}
    cs.store(name="train_checks", node={"hydra": {"callbacks": callbacks}})
    # --help's header names the preset a plain run trains here (conf/config.yaml's hydra.help)
    OmegaConf.register_new_resolver("tinygpt_plain_run", plain_run_help, replace=True)


def plain_run_help() -> str:
    """The preset a plain `python train.py` trains on this machine (train.as_composed adds it) and
    the command that shows its config: --help shows conf/config.yaml's own (experiment=null), which
    a plain run never trains."""
    import torch
    name, machine = ("gpu", "a CUDA GPU") if torch.cuda.is_available() else ("cpu", "no CUDA GPU")
    # train.py by a path that runs from here
    train = ["python", script("train.py")]
    return (f"On this machine ({machine}) a plain `{command_line(train)}` trains "
            f"experiment={name};\n"
            f"its settings: {command_line([*train, f'experiment={name}', '--cfg', 'job'])}")


def compose(args: list[str], return_hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml with the overrides `args`, as `python train.py ARGS` composes it."""
    with hydra.initialize_config_dir(config_dir=str(CONF), version_base=None, job_name="train"):
        return hydra.compose("config", overrides=args, return_hydra_config=return_hydra_config)


def _group_hint(key: str, value: Any) -> Optional[str]:
    """`optimizer=adamw`: the config group the user meant (its preset, or `group.name=`), else None."""
    close = difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.6) if "." not in key else []
    if not close:
        return None
    group, named = close[0], f"{close[0]}.name"
    preset = f"{group}={value} (the {group} preset)" if str(value) in PRESETS[group] else \
        f"{group}=PRESET (presets: {', '.join(PRESETS[group])})"
    return f"{preset}{f', or {named}={value}' if named in SCHEMA_KEYS else ''}"


def _refuse_unknown(keys: Iterable[str], value: Any = None) -> None:
    for key in keys:
        if key not in SCHEMA_KEYS:
            close = _group_hint(key, value) or next(iter(difflib.get_close_matches(key, SCHEMA_KEYS, n=1,
                                                                                    cutoff=0.6)), None)
            raise ValueError(f"unknown config key '{key}'{f' (did you mean {close}?)' if close else ''}: check "
                             f"the spelling; python {script('train.py')} --cfg job prints every key")


def check_override(key: str, value: Any, text: str) -> None:
    """A command-line override (`text`, parsed: key, value) checked before Hydra composes: `group=option` needs
    conf/<group>/<option>.yaml, `key=value` a schema key and a value its type takes; else a one-line ValueError."""
    if key in PRESETS:
        if value is not None and str(value) not in PRESETS[key]:
            raise ValueError(f"{key}={value} is not a preset: available {key} presets are {', '.join(PRESETS[key])}")
        return
    _refuse_unknown([key], value)
    group, _, rest = key.partition(".")
    try:  # the field's own OmegaConf node (in its group's: quicker than the whole schema's) converts it, as composing
        OmegaConf.update(OmegaConf.structured(GROUPS[group]()), rest, value, merge=True)
    except OmegaConfBaseException as e:
        raise ValueError(f"cannot set {text}: {str(e).splitlines()[0]}: give a value of the right type "
                         f"(python {script('train.py')} --cfg job shows the current value of {key})") from None


def lexer_hint(arg: str) -> Optional[str]:
    """The fix for a `key=value` Hydra's lexer cannot read (spaces, non-ASCII, quotes): the value quoted."""
    key, eq, value = arg.partition("=")
    if not eq or not re.fullmatch(r"[+~]{0,2}[\w.@/-]+", key) or value[:1] in ("'", '"', "[", "{"):
        return None
    return (f"cannot read the override {arg}: Hydra needs quotes around a value with spaces, quotes or non-ASCII "
            f"characters: write \"{key}={quote(value) if quote(value) != value else repr(value)}\"")


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
                                     f"{script('train.py')} -m ...), to pass a list use key=[a,b]")
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
                          f"own: python {script('train.py')} {' '.join(mine if a in swept else a for a in args)} "
                          f"with the setting above, then the same for the other data.tokenizer values")
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)  # Hydra's: 1st line
            raise ValueError(first + where) from None
    return jobs


@train_keys()  # GPTConfig's and DataConfig's errors name their settings as the command line does (model.n_embd=)
def to_dataclass(cfg: Any) -> Config:
    """Composed config (DictConfig, dict or Config) -> `Config` of plain dataclasses, checked and normalized."""
    if not isinstance(cfg, Config):
        try:  # (plain: Hydra's typed nodes take `+model.foo=1`, the schema refuses it)
            plain = OmegaConf.to_container(OmegaConf.create(cfg))
            cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), plain))
        except OmegaConfBaseException as e:
            if isinstance(e, ConfigKeyError):  # a key not in the schema
                _refuse_unknown([e.full_key])
            where = f"{e.full_key}: " if getattr(e, "full_key", None) else ""
            raise ValueError(f"invalid config: {where}{str(e).splitlines()[0]}") from None
    check(cfg)
    normalize(cfg)
    return cfg
