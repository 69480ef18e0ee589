"""The docs say what the code does: the key table gives each key's default (conf/config.yaml's own), every preset is
named where the presets are listed, and the default runs' transcripts (README, docs/training.md) show the presets'
own numbers. (That every command the docs show runs: tests/test_docs_commands.py.)"""
from __future__ import annotations

import re

from tests.helpers import REPO

README, TRAINING, CONFIGURATION = (REPO / p for p in ("README.md", "docs/training.md", "docs/configuration.md"))


def _read(path) -> str:
    return path.read_text(encoding="utf-8")


def _same(doc: str, value) -> bool:
    if doc == "null":
        return value is None
    try:
        return float(doc) == float(value) and not isinstance(value, bool)
    except (TypeError, ValueError):
        return doc.lower() == str(value).lower()


def test_the_key_table_gives_each_key_s_default():
    """docs/configuration.md's "The keys": `| key, key | default, default | meaning |` against what
    `python train.py experiment=null` composes, and every key of the schema there (a group's name: its preset)."""
    from launch.config import compose, register_configs
    from omegaconf import OmegaConf
    from training.config import SCHEMA_KEYS
    register_configs()
    cfg = OmegaConf.to_container(compose(["~experiment"]))
    text = _read(CONFIGURATION)
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]*) \|", text[text.index("## The keys"):text.index("\n## ", text.index("## The keys") + 1)], re.M)
    checked, wrong = set(), []
    for keys, defaults in rows:
        keys = re.findall(r"`([\w.]+)`", keys)
        values = [v.strip() for v in re.sub(r"\([^)]*\)", "", defaults).replace("`", "").split(",")]
        assert len(keys) == len(values), (keys, values)
        for key, doc in zip(keys, values):
            group, _, name = key.partition(".")
            value = cfg[group][name] if name else cfg[group]["name"]
            checked.add(key if name else f"{key}.name")
            if not _same(doc, value):
                wrong.append(f"{key}: the docs say {doc}, the code {value}")
    missing = set(SCHEMA_KEYS) - checked - {"model.vocab_size", "data.name", "logger.name"}  # (the tokenizer's; presets)
    assert not wrong and not missing, "\n".join(wrong + [f"{key}: not in the table" for key in sorted(missing)])


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
