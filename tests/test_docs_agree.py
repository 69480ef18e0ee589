"""The docs say what the code does: the tables of keys and optimizers are the code's
(launch/keys.py), every preset is named where the presets are listed, and the default runs'
transcripts (README, docs/training.md) show the presets' own numbers. (That every command the docs
show runs: tests/test_docs_commands.py.)"""
from __future__ import annotations

import dataclasses
import re

from tests.helpers import REPO
from training.config import SCHEMA_KEYS, Config

README, TRAINING, CONFIGURATION = (REPO / p for p in ("README.md", "docs/training.md", "docs/configuration.md"))


def _read(path) -> str:
    return path.read_text(encoding="utf-8")


def test_the_tables_of_keys_and_optimizers_are_the_code_s():
    """docs/configuration.md's tables are written from the dataclasses' fields and comments and
    from training.optim.OPTIMIZERS (launch/keys.py); when stale, the failure names the command."""
    from launch import keys
    doc = _read(CONFIGURATION)
    assert keys.written(doc) == doc, f"{CONFIGURATION.name}'s tables are stale: run {keys.COMMAND}"
    assert all(f"| `{key}` |" in doc for key in SCHEMA_KEYS if key not in keys.LEFT_OUT)


def test_the_tables_defaults_are_what_experiment_null_composes():
    """The tables show training.config.Config()'s defaults: the group defaults' presets list
    nothing, so `python train.py experiment=null` trains with exactly those."""
    from launch.config import compose, register_configs
    from omegaconf import OmegaConf
    register_configs()
    composed = OmegaConf.to_container(compose(["~experiment"]))
    schema = dataclasses.asdict(Config())
    wrong = [k for k in SCHEMA_KEYS if composed[k.split(".")[0]][k.split(".")[1]] !=
             schema[k.split(".")[0]][k.split(".")[1]]]
    assert not wrong, wrong


def test_every_preset_is_named_where_the_presets_are_listed():
    """conf/config.yaml's defaults list names each group's options in a comment, and docs/configuration.md in its
    first paragraph and its presets table (they had missed `gpu`, `baby_modern`, `modern`, ...)."""
    from launch.config import PRESETS
    config = _read(REPO / "conf" / "config.yaml")
    docs = _read(CONFIGURATION)
    paragraph = docs[docs.index("## Overrides"):docs.index("```")]
    table = docs[docs.index("## The presets"):docs.index("## The keys")]
    missing = []
    for group, options in PRESETS.items():
        line = re.search(rf"^  - {group}: .*(\n {{20,}}#.*)*", config, re.M)[0]
        for option in options:
            missing += [f"conf/config.yaml's {group} line: {option}"] * (option not in line.split("#", 1)[-1])
            missing += [f"configuration.md's Overrides: {group}/{option}"] * (f"`{option}`" not in paragraph)
            missing += [f"configuration.md's presets table: {group}/{option}"] * (f"`{option}`" not in table)
    assert not missing, "\n".join(missing)


def test_the_default_runs_transcripts_show_the_presets_numbers():
    """README's and docs/training.md's "What you will see": the CPU preset's model, batch and steps as
    experiment=cpu sets them, the GPU run's evaluations every gpu.yaml's eval_interval (the README said 250)."""
    from launch.config import preset
    cpu, gpu = preset("experiment", "cpu"), preset("experiment", "gpu")
    model = preset("model", next(d["override /model"] for d in cpu["defaults"] if "override /model" in d))
    t = cpu["train"]
    tokens = t["batch_size"] * model["block_size"] * t["grad_accum_steps"]
    lines = [f"({model['n_layer']} layers, {model['n_head']} heads, {model['n_embd']} wide, context "
             f"{model['block_size']}, vocab 65, dropout {model['dropout']:g})",
             f"global batch: {tokens:,} tokens per step ({t['batch_size']} sequences x {model['block_size']} tokens x "
             f"{t['grad_accum_steps']} accumulation x 1 process); {t['max_iters']} steps to go",
             f"step {t['max_iters']}/{t['max_iters']}: train loss", f"done: {t['max_iters']} steps",
             f"the GPU run every {gpu['train']['eval_interval']} steps"]
    for page in (README, TRAINING):
        text = " ".join(_read(page).split())
        assert not [line for line in lines if line not in text], page.name
