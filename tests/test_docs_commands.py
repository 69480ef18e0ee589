"""Every command the docs show runs as written: each `python train.py ...` (and `torchrun ... train.py`) in the
README, docs/, BENCHMARKS.md, conf/'s comments, the code's docstrings and the CLIs' --help composes and validates as
train.py would run it, and each sample/eval/export/explore/bench command parses with its flags as written. In
process: compose + validate, or the CLI's own parse_args, with the files the command names made in a scratch dir."""
from __future__ import annotations

import ast
import contextlib
import copy
import functools
import io
import json
import math
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPTS = ("train", "sample", "eval", "export", "explore", "bench")
CMD = re.compile(rf"(?:\btorchrun\b(?:\\\n|[^`\n])*?|\bpython3?\s+)\b({'|'.join(SCRIPTS)})\.py\b((?:\\\n|[^`\n#|;])*)")
NOT_OURS = ("config/train_shakespeare_char.py",)  # nanoGPT's own train.py, quoted for comparison
NAMES_A_FLAG = {("export", ("--hf",))}  # prose: "the `python export.py --hf` export" (docs/explore.md)
PLACEHOLDERS = {  # a documented placeholder (a word, or a value after key=) -> what a user types there (None: nothing)
    "...": None, "ARGS": None, "group=option": "model=tiny", "key=value": "train.seed=1", "a=1,2": "train.seed=1,2",
    "key=a,b": "train.seed=1,2"}
SPANS = {"<your overrides>": "", "<that run>": "outputs/latest"}  # placeholders of several words
MADE = {  # flags whose file or directory a CLI checks as it parses: made in the scratch dir first
    "--checkpoint": "file", "--prompt-file": "text", "--init": "hf", "--nanogpt": "nanogpt"}
FAILS = {  # commands the docs show failing, and the start of the line they fail with
    "train.max_iter=500": "unknown config key 'train.max_iter' (did you mean train.max_iters?)",
    "--out_dir=out-shakespeare-char": "sample.py takes --run out-shakespeare-char, not --out_dir"}
HELLASWAG = {"ctx": "A man is", "endings": ["a", "b", "c", "d"], "label": 0}


@functools.lru_cache(maxsize=None)
def _texts() -> list[tuple[str, str]]:
    """(where, text) of every place a command is shown: Markdown, conf/'s YAML, docstrings, the CLIs' --help."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = []
    for f in files:
        if f.startswith("tests/"):
            continue
        if f.endswith(".md") or (f.startswith("conf/") and f.endswith(".yaml")):
            out.append((f, (REPO / f).read_text(encoding="utf-8")))
        elif f.endswith(".py"):
            tree = ast.parse((REPO / f).read_text(encoding="utf-8"))
            out += [(f, d) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                    and (d := ast.get_docstring(n))]
    for script in SCRIPTS[1:]:  # its lines joined (argparse wraps them), less the usage line (syntax, not a command)
        out.append((f"{script}.py --help", " ".join(re.sub(r"^usage:.*(\n .*)*", "", _help(script)).split())))
    return out


def _help(script: str) -> str:
    module = __import__(script)
    with contextlib.redirect_stdout(io.StringIO()) as text, pytest.raises(SystemExit):
        module.parse_args(["--help"])
    return text.getvalue()


def _words(script: str, tail: str) -> list[str]:
    """The command's arguments: placeholders filled in, optional [parts] kept, prose after the command left out."""
    tail = tail.replace("\\\n", " ")
    if tail.count(")") > tail.count("("):  # (the command in brackets) and prose
        tail = tail[:tail.index(")")]
    for k, v in SPANS.items():
        tail = tail.replace(k, v)
    words = [w.strip("[]") for w in shlex.split(re.sub(r"\[(-[^]\s]+(?: [^]\s]+)?)\]", r"\1", tail))]
    words = [PLACEHOLDERS.get(w, w) for w in words if not w.endswith("=...")]
    args: list[str] = []
    for w in filter(None, words):
        flag_value = args and args[-1].startswith("-") and "=" not in args[-1] and not w.startswith("-")
        bare = "=" not in w and not w.startswith(("-", "~"))
        if bare and not flag_value and (script == "train" or (args and not args[-1].startswith("-"))):
            break  # words of the sentence around the command
        args.append(w)
    return args


def _quoted(tail: str, rest: str) -> str:
    """`tail` and as many of the lines after it as a quoted value that spans lines needs (a multi-line prompt)."""
    lines = rest.split("\n")[1:]
    while lines and (tail.count('"') % 2 or tail.count("'") % 2):
        tail += "\n" + re.split(r"[`#|;]", lines.pop(0))[0]
    return tail


@functools.lru_cache(maxsize=None)
def commands() -> tuple[tuple[str, str, list[str], int], ...]:
    """(where, script, arguments, processes) of every documented command (read once, by the test that needs them)."""
    found = {}
    for where, text in _texts():
        for m in CMD.finditer(text):
            if not any(n in m.group(0) for n in NOT_OURS):
                nproc = [int(n.group(1) or 1) for n in
                         (re.search(rf"--{k}[= ](\d+)", m.group(0)) for k in ("nproc[-_]per[-_]node", "nnodes")) if n]
                args = _words(m.group(1), _quoted(m.group(2), text[m.end():]))
                if (m.group(1), tuple(args)) not in NAMES_A_FLAG:
                    found.setdefault((m.group(1), tuple(args), math.prod(nproc)), where)
    return tuple((where, script, list(args), nproc) for (script, args, nproc), where in found.items())


def _make(flag: str, path: str) -> None:
    p = Path(path).expanduser()
    kind = MADE.get(flag)
    if kind in ("file", "text"):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("ROMEO:" if kind == "text" else "", encoding="utf-8")
    elif kind == "hf":
        p.mkdir(parents=True, exist_ok=True)
        (p / "config.json").write_text("{}", encoding="utf-8")
    elif kind == "nanogpt":
        p.mkdir(parents=True, exist_ok=True)
        (p / "train.py").write_text("", encoding="utf-8")


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A directory holding what the commands name: a user's run, HF directory, HellaSwag file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/nanoGPT
    (tmp_path / "hellaswag_val.jsonl").write_text(json.dumps(HELLASWAG) + "\n", encoding="utf-8")
    return tmp_path


@functools.lru_cache(maxsize=None)
def _composed(groups: tuple[str, ...]):
    """conf/config.yaml with these group choices, composed by Hydra (a second or so each: shared by commands)."""
    from launch.config import compose
    return compose(list(groups))


def train_check(args: list[str], cuda: bool = False) -> None:
    """`python train.py ARGS` as train.py starts it (on a CUDA machine or not), up to the run: arguments read, every
    job's overrides checked, composed and validated (Hydra's own --flags: the overrides beside them). A sweep's jobs
    are composed by check_command_line itself; a single run's group choices by Hydra, its keys set on that config
    as Hydra sets them."""
    import train
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from launch.config import PRESETS, check_command_line, register_configs, to_dataclass
    from launch.overrides import VALUE_FLAGS
    args, _ = train.as_composed(args, cuda=cuda)
    if {"-m", "--multirun"} & set(args):
        register_configs(sweep=True)
        try:
            return check_command_line(args, True)
        finally:
            register_configs()
    check_command_line(args, False)
    flags = {i for i, a in enumerate(args) if a.startswith("-")}
    flags |= {i + 1 for i in flags if args[i] in VALUE_FLAGS}
    overrides = OverridesParser.create().parse_overrides([a for i, a in enumerate(args) if i not in flags])
    groups = [o for o in overrides if o.is_delete() or o.key_or_group.split("@")[0] in PRESETS]
    cfg = copy.deepcopy(_composed(tuple(o.input_line for o in groups)))
    for o in overrides:
        if o not in groups and not o.is_hydra_override():
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True, force_add=o.is_force_add())
    to_dataclass(cfg)


def test_the_collector_finds_the_documented_commands():
    """The commands are found where the docs show them, in code blocks, prose, YAML and docstrings alike."""
    shown = {(script, " ".join(args)) for _, script, args, _ in commands()}
    assert len(commands()) > 80
    assert ("train", "") in shown and ("train", "experiment=null") in shown
    assert ("train", "--cfg job") in shown  # the README's "# print every key..." comment left out
    assert ("train", "experiment=gpt2_124m data.path=fineweb_edu_10B/") in shown  # conf/experiment's comment
    assert ("sample", "--prompt ROMEO: --stop \\n\\n") in shown
    assert ("sample", "--checkpoint baby.pt --max-new-tokens 500 --seed 0 --no-stream --no-kv-cache") in shown
    assert ("bench", "--gpu-check --nanogpt DIR") in shown
    assert any(nproc == 8 for _, script, _, nproc in commands() if script == "train")
    assert not any("prints" in args for _, _, args, _ in commands())  # "python train.py --cfg job prints every key"


@pytest.mark.slow  # about a hundred commands, a few seconds in all: Hydra composes each set of presets once
def test_every_documented_train_command_composes_and_validates(scratch, monkeypatch):
    import train
    from launch.config import ERRORS, register_configs
    register_configs()
    hellaswag = str(scratch / "hellaswag_val.jsonl")  # the user's file, wherever the command keeps it
    wrong = []
    for where, script, args, nproc in commands():
        if script != "train":
            continue
        monkeypatch.setenv("WORLD_SIZE", str(nproc))  # torchrun's: train.tokens_per_step divides by the processes
        expected = next((v for k, v in FAILS.items() if k in args), None)
        run = [f"train.hellaswag={hellaswag}" if a.startswith("train.hellaswag=") else a for a in args]
        for cuda in (False, True)[:1 + (train.as_composed(args, False) != train.as_composed(args, True))]:
            # (with no experiment= given, train.py picks one by the machine: both)
            said = f"{where}: python train.py {' '.join(args)}{' (on CUDA)' * cuda}"
            try:
                train_check(run, cuda)
            except ERRORS as e:
                if not (expected and str(e).startswith(expected)):
                    wrong.append(f"{said}: {e}")
            else:
                if expected:
                    wrong.append(f"{said} should fail with {expected}")
    assert not wrong, "documented commands that do not run:\n" + "\n".join(wrong)


def test_every_documented_cli_command_parses(scratch):
    wrong = []
    for where, script, args, _ in commands():
        if script == "train":
            continue
        args = [os.path.expanduser(a) if a.startswith("~/") else a for a in args]  # as the shell does
        for flag, value in zip(args, args[1:]):
            _make(flag, value)
        expected = next((v for k, v in FAILS.items() if k in args), None)
        try:
            __import__(script).parse_args(args)
        except SystemExit as e:  # argparse: an unknown flag or a bad value (0: --help)
            if e.code != 0:
                wrong.append(f"{where}: python {script}.py {shlex.join(args)} does not parse (exit {e.code})")
        except (ValueError, OSError) as e:
            if not (expected and str(e).startswith(expected)):
                wrong.append(f"{where}: python {script}.py {shlex.join(args)}: {e}")
        else:
            if expected:
                wrong.append(f"{where}: python {script}.py {shlex.join(args)} should fail with {expected}")
    assert not wrong, "documented commands that do not parse:\n" + "\n".join(wrong)


NEEDS = {"experiment=finetune_shakespeare": ["model.init_from=gpt2"], "data=text": ["data.path=notes.txt"],
         "experiment=gpt2_124m": ["data.path=notes.txt"], "data=chat": ["data.path=chat.jsonl"],
         "experiment=sft_cpu": ["model.init_from=gpt2", "data.path=chat.jsonl"]}  # what a preset's own comments say to add


@pytest.mark.slow  # Hydra composes each preset: a few seconds
def test_every_preset_and_key_the_docs_name_exists_and_each_preset_composes(scratch):
    """`experiment=null`, `model=baby_modern`, `train.compile=false` in the prose: every `group=option` the docs
    name composes alone (as train.py runs it), and every `key=` they name is a key (the typos they show aside)."""
    from launch.config import ERRORS, PRESETS, register_configs
    from training.config import SCHEMA_KEYS
    groups, keys = set(), set()
    for where, text in _texts():
        groups |= {(where, m[0]) for m in re.finditer(rf"(?<![\w.$/~-])(?:{'|'.join(PRESETS)})=(?:\w+|~)", text)}
        keys |= {(where, m[1]) for m in re.finditer(r"(?<![\w.$+-])((?:model|data|optim|train|logger)\.\w+)=", text)}
    assert ("README.md", "experiment=null") in groups and ("README.md", "model.block_size") in keys
    assert not [(w, k) for w, k in keys if k not in SCHEMA_KEYS and k + "=" not in "".join(FAILS)], \
        "keys the docs name that do not exist"
    register_configs()
    wrong = []
    for choice in sorted({g for _, g in groups}):
        try:
            train_check([choice, *NEEDS.get(choice, [])])
        except ERRORS as e:
            wrong.append(f"{next(w for w, g in groups if g == choice)}: {choice}: {e}")
    assert not wrong, "presets the docs name that do not compose:\n" + "\n".join(wrong)
