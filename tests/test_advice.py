"""Advice that can be followed (issue 50): every suggestion a message makes works when followed.

Each row makes one mistake through the real check (launch.config.to_dataclass over Hydra's
composition, GPTConfig, checkpoint.fit.check_fits, training.init_from, the nanoGPT reader, the
memory pre-flight), reads the advice out of the message as a user would (`advice`), follows every
alternative it offers, and asserts the check then passes. A suggested value must fit the whole
config, so the rows include mistakes whose fix touches other settings (model.n_head=3 on
experiment=cpu: n_embd for rope's even head size, n_kv_head to divide the heads)."""
from __future__ import annotations

import copy
import dataclasses
import functools
import re

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from checkpoint.file import (CheckpointError, load_checkpoint, load_for_inference, read_checkpoint,
                             save_checkpoint)
from checkpoint.fit import check_fits
from checkpoint.locate import check_hf_dir
from checkpoint.manager import CheckpointManager
from data.tokenizer import CharTokenizer
from launch import memory
from launch.config import register_configs, to_dataclass
from launch.overrides import flag_hint
from model.config import GPTConfig
from tests.helpers import REPO, run_cli, save_run, tiny_model
from tests.test_checkpoint_manager import ONE, _parts
from tests.test_checkpoint_manager import _meta as manager_meta
from tests.test_checkpoint_nanogpt import write_nanogpt_run
from training import init_from
from training.config import RULES, notes
from training.state import TrainState

register_configs()
NANOGPT = REPO / "tests" / "fixtures" / "nanogpt"
KEY = r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*"
OVERRIDE = re.compile(rf"(?<![\w.=-])({KEY})=([^\s,;()]+)")
LEAVE_OUT = re.compile(rf"leave ({KEY}) out|instead of ({KEY})")


def advice(message: str) -> list[tuple[dict, set]]:
    """What a message tells a user to do: its last `: `-separated part that writes an override or
    leaves one out, split into alternatives at ', ' and ' or '; each alternative as (the overrides
    it writes, the keys it leaves out). ("key=value" is the syntax, not a setting.)"""
    parts = [part.replace("key=value", "") for part in message.split(": ")]
    told = next((p for p in reversed(parts) if OVERRIDE.search(p) or LEAVE_OUT.search(p)), "")
    out = []
    for part in re.split(r",? or |, ", told):
        writes = dict(OVERRIDE.findall(part))
        leaves = {a or b for a, b in LEAVE_OUT.findall(part)} - {"it"}
        if writes or leaves or "leave it out" in part:
            out.append((writes, leaves))
    return out


def follow(args: list[str], writes: dict, leaves: set, fill: dict | None = None) -> list[str]:
    """`args` with one alternative followed: its keys' old values gone, its overrides added (a
    placeholder value, <...> or PATH, filled from `fill`)."""
    fill = fill or {}
    for key, value in writes.items():
        placeholder = value.startswith("<") or value == "PATH"
        assert not placeholder or key in fill, f"a placeholder for {key}: fill it"
    kept = [a for a in args if a.lstrip("+~").split("=")[0] not in {*writes, *leaves}]
    return kept + [f"{k}={fill.get(k, v)}" for k, v in writes.items()]


@functools.lru_cache(maxsize=None)
def _composed(groups: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(groups))


def _config(args: list[str]):
    """`args` as train.py's config (its presets composed once per set, each key=value then set as
    Hydra reads it; hydra.* is Hydra's own), checked by launch.config.to_dataclass."""
    groups = tuple(a for a in args if "." not in a.split("=")[0])
    cfg = copy.deepcopy(_composed(groups))
    values = [a for a in args if a not in groups and not a.startswith("hydra.")]
    for o in OverridesParser.create().parse_overrides(values):
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return to_dataclass(cfg)


def assert_advice_works(args: list[str], fill: dict | None = None) -> str:
    """`args` are refused with advice, and each alternative of it, followed, validates."""
    with pytest.raises(ValueError) as e:
        _config(args)
    message, told = str(e.value), advice(str(e.value))
    assert told, f"nothing to follow in: {message}"
    for writes, leaves in told:
        fixed = follow(args, writes, leaves, fill)
        try:
            _config(fixed)
        except ValueError as again:
            pytest.fail(f"{' '.join(args)}\n  told: {message}\n  followed: {' '.join(fixed)}\n"
                        f"  refused: {again}")
    return message


# ------------------------------------------------------------------------ the config's checks
CONFIG_ROWS = [
    # the issue's: n_embd (rope: a multiple of 2 x 3) and n_kv_head both
    ["experiment=cpu", "model.n_head=3"],
    # divisible, but an odd head size under rope
    ["experiment=cpu", "model.n_head=3", "model.n_embd=129"],
    ["experiment=cpu", "model.n_embd=100"],
    # model=baby_modern's n_kv_head=3
    ["experiment=gpu", "model.n_head=4"],
    ["experiment=gpu", "model.n_kv_head=4"],
    ["experiment=gpu", "model.head_dim=33"],
    ["model.n_head=5"],
    ["model=gpt2", "model.n_head=7"],
    # optim.lr's example is at least optim.min_lr, optim.min_lr's at most a tenth of optim.lr
    ["optim.lr=0", "optim.min_lr=5e-3"],
    ["optim.lr=1e-5", "optim.min_lr=-1"],
    ["optim.min_lr=0.1"],
    ["optim=muon", "train.parallel=fsdp"],
    # each data set is offered only what works with it
    ["data.tokenizer=sentencepiece"],
    ["data=shakespeare", "data.tokenizer=sentencepiece"],
    ["data=text", "data.path=notes.txt", "data.tokenizer=sentencepiece"],
    ["data.tokenizer=gpt2"],
    # shakespeare_char is char-level: told before the BPE's size
    ["data.tokenizer=bpe"],
    ["data.vocab_size=300"],
    ["data=shakespeare", "data.tokenizer=bpe"],
    ["data=shakespeare", "data.tokenizer=bpe", "data.vocab_size=100"],
    ["data=text"],
    ["logger.project=mine"],
    ["logger.name=tensorboard"],
    ["train.seed=-1"],
    ["train.seed=4294967296"],
]


@pytest.mark.parametrize("args", CONFIG_ROWS, ids=" ".join)
def test_a_config_mistakes_advice_validates_when_followed(args):
    assert_advice_works(args, fill={"data.path": "notes.txt"})


def test_n_head_3_on_the_cpu_preset_is_told_every_setting_at_once():
    """The issue's three errors in a row (n_embd=129, then n_kv_head, then rope's even head
    size): one line, naming both settings."""
    [(writes, _)] = advice(assert_advice_works(["experiment=cpu", "model.n_head=3"]))
    assert set(writes) == {"model.n_embd", "model.n_kv_head"} and writes["model.n_embd"] == "126"


# a value each of training.config's RULES refuses
BAD = {
    "optim.name": "sgd", "optim.schedule": "step", "optim.lr": "0", "optim.min_lr": "-1",
    "optim.weight_decay": "-1", "optim.beta1": "1.5", "optim.beta2": "1.5",
    "optim.warmup_iters": "-1", "optim.decay_iters": "0", "optim.grad_clip": "-1",
    "optim.cooldown_frac": "2", "optim.muon_lr": "0", "optim.muon_momentum": "1",
    "optim.muon_ns_steps": "0", "train.max_iters": "0", "train.batch_size": "0",
    "train.grad_accum_steps": "0", "train.eval_interval": "0", "train.eval_iters": "0",
    "train.log_interval": "0", "train.patience": "0", "train.probe_steps": "-1",
    "train.parallel": "zero", "train.device": "tpu", "logger.mode": "loud"}


def test_every_rule_has_a_bad_value_here():
    assert set(BAD) == set(RULES)


@pytest.mark.parametrize("preset", ["experiment=cpu", "experiment=gpu", "~experiment"])
@pytest.mark.parametrize("key", sorted(RULES))
def test_every_rules_example_validates_on_every_preset(key, preset):
    assert_advice_works([preset, f"{key}={BAD[key]}"])


# nanoGPT's train.py settings, as `--key=value` (its defaults and config/ files' values)
NANOGPT_FLAGS = [
    "out_dir=out-shakespeare-char", "eval_interval=250", "log_interval=10", "eval_iters=200",
    "eval_only=False", "always_save_checkpoint=False", "init_from=scratch", "init_from=resume",
    "init_from=gpt2", "wandb_log=False", "wandb_log=True", "wandb_project=shakespeare-char",
    "wandb_run_name=mini-gpt", "dataset=shakespeare_char", "dataset=shakespeare",
    "dataset=openwebtext", "gradient_accumulation_steps=1", "batch_size=64", "block_size=256",
    "n_layer=6", "n_head=6", "n_embd=384", "dropout=0.2", "bias=False", "learning_rate=1e-3",
    "max_iters=5000", "weight_decay=1e-1", "beta1=0.9", "beta2=0.99", "grad_clip=1.0",
    "decay_lr=True", "decay_lr=False", "warmup_iters=100", "lr_decay_iters=5000", "min_lr=1e-4",
    "backend=nccl", "device=cpu", "dtype=float32", "compile=False"]


@pytest.mark.parametrize("flag", NANOGPT_FLAGS)
def test_a_nanogpt_flags_hint_validates_when_followed(flag):
    """train.py --key=value (nanoGPT's habit) is told the override to write, or to leave it out:
    either works (on nanoGPT's own shakespeare_char model, the one its values are meant for)."""
    hint = flag_hint(f"--{flag}")
    told = advice(hint)
    assert told or "eval.py --run" in hint, hint
    fill = {"data.path": "notes.txt", "model.init_from": "gpt2", "hydra.run.dir": "out"}
    for writes, leaves in told:
        _config(follow(["~experiment"], writes, leaves, fill))


# the warnings a run gives as it starts (training.config.notes), each with advice
NOTE_ROWS = [
    ["~experiment", "train.max_iters=50"],
    ["experiment=cpu", "optim.cooldown_frac=0.5"],
    ["~experiment", "optim.muon_lr=0.1"],
    ["~experiment", "optim.schedule=constant", "optim.min_lr=1e-5"],
]


def _given(args: list[str]) -> set[str]:
    return {a.split("=")[0] for a in args if "." in a.split("=")[0]}


@pytest.mark.parametrize("args", NOTE_ROWS, ids=" ".join)
def test_a_notes_advice_silences_it_when_followed(args):
    [note] = notes(_config(args), _given(args))
    told = advice(note)
    assert told, note
    for writes, leaves in told:
        fixed = follow(args, writes, leaves)
        assert notes(_config(fixed), _given(fixed)) == [], (note, fixed)


@pytest.mark.slow
def test_train_py_n_head_3_then_following_the_advice_trains(tmp_path, cache_with_shakespeare):
    """The issue's first example, end to end: the refused command, with the advice, trains."""
    run = ["experiment=cpu", "train.device=cpu", "train.max_iters=1", "train.eval_iters=1",
           "train.batch_size=2", "train.probe=false", f"hydra.run.dir={tmp_path / 'run'}",
           "model.n_head=3"]
    refused = run_cli(["train.py", *run], cwd=tmp_path)
    message = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and message.startswith("error: "), refused.stderr[-2000:]
    [(writes, leaves)] = advice(message)
    done = run_cli(["train.py", *follow(run, writes, leaves)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


# ------------------------------------------------------------------------ the model's own check
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_every_heads_mistake_is_told_settings_that_build(position):
    """GPTConfig's heads' rules over a grid: whatever is broken, the settings it suggests build
    (n_head kept)."""
    told = 0
    for n_head in range(1, 9):
        for n_embd in (24, 30, 33, 64, 100):
            for n_kv_head in (None, 1, 2, 3, 5):
                for head_dim in (None, 7, 8):
                    shape = dict(vocab_size=65, n_head=n_head, n_embd=n_embd, n_kv_head=n_kv_head,
                                 head_dim=head_dim, position=position)
                    try:
                        GPTConfig(**shape)
                        continue
                    except ValueError as e:
                        [(writes, leaves)] = advice(str(e))
                    assert "n_head" not in writes and not leaves, str(e)
                    GPTConfig(**{**shape, **{k: int(v) for k, v in writes.items()}})
                    told += 1
    # (the grid breaks the rules often)
    assert told > 100


# ------------------------------------------------------------------------ a resume's checkpoint
def _meta(args: list[str]) -> dict:
    """What a run of `args` records in its checkpoints and checks a resume against (its tokenizer
    stood in for by the data settings that make it)."""
    c = _config(args)
    d = c.data
    return {"model_config": c.model.with_vocab(65).to_dict(), "config": dataclasses.asdict(c),
            "tokenizer": {"data": [d.name, d.path, d.tokenizer, d.vocab_size]}}


def _checkpoint(args: list[str], drop: tuple = ()) -> dict:
    """A checkpoint of a run of `args` (an older tinygpt's: without the model settings `drop`)."""
    meta = _meta(args)
    kept = {k: v for k, v in meta["model_config"].items() if k not in drop}
    return {**meta, "model_config": kept}


# (the run's arguments, the checkpoint's run's arguments)
RESUME_ROWS = [
    (["experiment=cpu"], ["experiment=gpu"]),
    # the optimizer and the model: both at once
    (["~experiment"], ["experiment=cpu"]),
    (["experiment=cpu"], ["experiment=cpu", "model=gpt2"]),
    (["experiment=cpu"], ["experiment=cpu", "data=text", "data.path=t.txt", "data.tokenizer=bpe",
                          "data.vocab_size=300"]),
]


@pytest.mark.parametrize("run, trained", RESUME_ROWS, ids=lambda a: " ".join(a))
def test_a_resume_is_told_every_setting_of_the_checkpoint_at_once(run, trained, tmp_path):
    ckpt = _checkpoint(trained)
    with pytest.raises(ValueError) as e:
        check_fits(ckpt, tmp_path / "last.pt", _meta(run), describe=str)
    [(writes, leaves)] = advice(str(e.value))
    check_fits(ckpt, tmp_path / "last.pt", _meta(follow(run, writes, leaves)), describe=str)


def test_an_older_checkpoints_missing_settings_are_its_defaults_not_none(tmp_path):
    """A checkpoint from before the modern settings: told their defaults
    (model.position=learned), never None, which no override can write."""
    modern = ("position", "norm", "mlp", "n_kv_head", "qk_norm", "rope_theta")
    ckpt, run = _checkpoint(["~experiment"], drop=modern), ["~experiment", "model=baby_modern"]
    with pytest.raises(ValueError) as e:
        check_fits(ckpt, tmp_path / "last.pt", _meta(run), describe=str)
    [(writes, leaves)] = advice(str(e.value))
    assert "None" not in str(e.value) and writes["model.position"] == "learned"
    check_fits(ckpt, tmp_path / "last.pt", _meta(follow(run, writes, leaves)), describe=str)


def test_a_nanogpt_checkpoint_given_to_resume_is_told_the_fine_tune_that_continues_it():
    """train.resume=<nanoGPT ckpt.pt> listed 14 keys (model.rope_theta=None among them): it is
    model.init_from, whose own checks (shape, vocabulary, data) then pass."""
    path = NANOGPT / "out-bias" / "ckpt.pt"
    run = ["experiment=cpu", f"train.resume={path}"]
    ckpt = load_checkpoint(path)
    # (the run's data: Tiny Shakespeare's characters, the nanoGPT run's)
    meta = {**_meta(run), "tokenizer": ckpt["tokenizer"]}
    with pytest.raises(ValueError) as e:
        check_fits(ckpt, path, meta, describe=str)
    [(writes, leaves)] = advice(str(e.value))
    assert writes == {"model.init_from": str(path)} and leaves == {"train.resume"}
    fixed = follow(run, writes, leaves)
    c = _config(fixed)
    src = init_from.apply(c, fixed)
    assert src.written_by == "nanoGPT" and c.train.resume is False


# two train.py processes
@pytest.mark.slow
def test_train_py_resuming_a_nanogpt_run_then_following_the_advice_trains(tmp_path,
                                                                         cache_with_shakespeare):
    path = NANOGPT / "out-bias" / "ckpt.pt"
    run = ["experiment=cpu", "train.device=cpu", "train.max_iters=2", "train.eval_iters=1",
           "train.probe=false", f"hydra.run.dir={tmp_path / 'run'}", f"train.resume={path}"]
    refused = run_cli(["train.py", *run], cwd=tmp_path)
    message = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and message.startswith("error: "), message
    assert "Traceback" not in refused.stderr
    [(writes, leaves)] = advice(message)
    done = run_cli(["train.py", *follow(run, writes, leaves)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


# ------------------------------------------------------------------------ a fine-tune's source
@pytest.mark.parametrize("mistake", [["model.n_layer=4"], ["model.block_size=64"],
                                     ["model.bias=false"], ["data=shakespeare"], ["gpt2"]])
def test_a_fine_tunes_mistake_is_told_what_works_with_its_source(mistake, tmp_path):
    """model.init_from= a nanoGPT run (2 layers, context 32, biases, Tiny Shakespeare's
    characters), and one of GPT-2 BPE (no meta.pkl) given character data ("gpt2")."""
    args = ["experiment=cpu", f"model.init_from={NANOGPT / 'out-bias'}", *mistake]
    if mistake == ["gpt2"]:
        write_nanogpt_run(tmp_path / "out", vocab_size=50304, n_embd=4, n_head=1,
                          dataset="openwebtext")
        args = ["experiment=cpu", f"model.init_from={tmp_path / 'out'}"]
    with pytest.raises(ValueError) as e:
        init_from.apply(_config(args), args)
    told = advice(str(e.value))
    assert told, str(e.value)
    for writes, leaves in told:
        fixed = follow(args, writes, leaves, fill={"data.path": "notes.txt"})
        init_from.apply(_config(fixed), fixed)


# ------------------------------------------------------------------------ a file at odds with it
def test_a_checkpoint_whose_weights_do_not_fit_its_own_config_is_told_another_file(tmp_path):
    """Its settings are the file's: "use the model settings they were trained with" cannot be
    followed by sample.py or a fine-tune; the file beside it can be."""
    good = save_run(tmp_path, tiny_model(8), CharTokenizer("abcdefgh"), name="last.pt")
    bad = tmp_path / "best.pt"
    ckpt = torch.load(good, weights_only=True)
    save_checkpoint({**ckpt, "model_config": {**ckpt["model_config"], "n_layer": 3}}, bad)
    with pytest.raises(CheckpointError) as e:
        load_for_inference(bad)
    assert "do not match the model" in str(e.value) and "settings" not in str(e.value)
    assert str(e.value).endswith(f"use {good} beside it instead")
    # 16 wide: not divisible by 3 heads, and GPTConfig's advice is not for a file
    save_checkpoint({**ckpt, "model_config": {**ckpt["model_config"], "n_head": 3}}, bad)
    for refused in (lambda: load_for_inference(bad), lambda: init_from.open_source(str(bad))):
        with pytest.raises(ValueError) as e:
            refused()
        assert "n_embd=16 is not divisible by n_head=3" in str(e.value)
        assert "e.g." not in str(e.value)


def test_a_resumed_checkpoint_whose_weights_do_not_fit_its_own_config_is_told_so(tmp_path):
    """A resume checks the settings first (check_fits): weights that do not fit after that are
    the file's fault."""
    m, opt = _parts(0)
    states = {"model": m, "optimizer": opt, "train_state": TrainState(step=1)}
    CheckpointManager(tmp_path, states, manager_meta(m), str, ranks=ONE).save(1)
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    del ckpt["model"]["lm_head.weight"]
    save_checkpoint(ckpt, tmp_path / "last.pt")
    m2, opt2 = _parts(1)
    states = {"model": m2, "optimizer": opt2, "train_state": TrainState()}
    with pytest.raises(CheckpointError) as e:
        CheckpointManager(tmp_path, states, manager_meta(m2), str, ranks=ONE).resume(True)
    assert "do not fit its own model_config" in str(e.value) and "settings" not in str(e.value)


# ------------------------------------------------------------------------ the memory pre-flight
def test_the_batch_size_the_memory_check_suggests_fits(monkeypatch):
    """"lower train.batch_size to at most N (train.batch_size=N fits)": with it, the same check
    passes."""
    monkeypatch.setattr(memory, "available", lambda device: 512 << 20)
    args = ["experiment=cpu", "model.n_layer=8", "model.n_embd=512", "model.n_head=8",
            "model.block_size=256", "train.batch_size=256"]
    told = memory.check(_config(args), torch.device("cpu"))
    [(writes, _)] = [a for a in advice(told or "") if "train.batch_size" in a[0]] or [({}, set())]
    assert told and writes, told
    assert memory.check(_config(follow(args, writes, set())), torch.device("cpu")) is None


# ------------------------------------------------------------------------ a CLI's file arguments
def test_a_file_given_as_a_hugging_face_directory_is_told_the_option_that_takes_it(tmp_path):
    """sample.py/eval.py/explore.py --init FILE: a file of a Hugging Face directory is told the
    directory (--checkpoint would refuse a model.safetensors), a checkpoint --checkpoint."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as e:
        check_hf_dir(hf / "model.safetensors", "--init")
    assert str(e.value).endswith(f"--init {hf}")
    check_hf_dir(hf, "--init")
    pt = save_run(tmp_path, tiny_model(8), CharTokenizer("abcdefgh"), name="x.pt")
    with pytest.raises(FileNotFoundError) as e:
        check_hf_dir(pt, "--init")
    assert str(e.value).endswith(f"--checkpoint {pt}")
    read_checkpoint(pt, model=True)
