"""What train.py says of a command line besides checking it (launch/config.py checks it): one line with the fix for
arguments that are not overrides (nanoGPT's `--batch_size=32` and `config/train_x.py`, a path the shell split at a
space), a note on data.path, and the commands it prints, quoted for Hydra and the shell (the resume command), so they
paste back whatever the path.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from common.platform import command_line, script
from launch.config import PLAIN, PRESETS, quote
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


def _true(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes", "on")


# nanoGPT's settings whose values tinygpt spells otherwise, or needs no setting for: value -> advice
NANOGPT_VALUES = {
    "init_from": lambda v: "leave it out (a new run starts from scratch)" if v == "scratch" else
    "write train.resume=true hydra.run.dir=<the run's directory> (nanoGPT's out_dir), or for a "
    "ckpt.pt nanoGPT wrote model.init_from=<out_dir>/ckpt.pt (a fine-tune from its weights)"
    if v == "resume" else None,
    "wandb_log": lambda v: "write logger=wandb" if _true(v) else
    "leave it out (no wandb without logger=wandb)",
    "decay_lr": lambda v: "leave it out (the rate decays by default)" if _true(v) else
    "write optim.schedule=constant",
    "dataset": lambda v: None if v in PRESETS.get("data", ()) else
    "write data=text data.path=<the path of your text> (with data.tokenizer=gpt2 for GPT-2 BPE, as "
    "nanoGPT's openwebtext)",
    "wandb_project": lambda v: f"write logger=wandb {override('logger.project', v)} (no wandb "
    "without logger=wandb)",
    "wandb_run_name": lambda v: f"write logger=wandb {override('logger.run_name', v)} (no wandb "
    "without logger=wandb)",
    "eval_only": lambda v: f"evaluate a run with python {script('eval.py')} --run DIR instead"
    if _true(v) else "leave it out",
    "always_save_checkpoint": lambda v: "leave it out (a run saves last.pt at every evaluation, "
    "best.pt at its best val loss)",
    "backend": lambda v: "leave it out (torchrun's processes use nccl on CUDA, gloo on the CPU)",
}


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
    told = NANOGPT_VALUES[name](value) if eq and name in NANOGPT_VALUES else None
    if told is None and not key:
        told = "write key=value"
    elif told is None:
        shown = value if PLAIN.fullmatch(value) else quote(value)
        told = f"write {key}={shown}" if eq else f"write {key}=..."
    return (f"{arg} is a --flag, but train.py takes Hydra overrides (key=value, no dashes): {told} "
            f"(python {script('train.py')} --cfg job lists every key)")


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
    chosen = any(o.lstrip("+~").split("=")[0].split("@")[0] == "data" for o in overrides)
    if name in ("text", "chat") or not path or chosen:
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
