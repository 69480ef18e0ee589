"""`model.init_from`: fine-tune from a local Hugging Face GPT-2 directory or a tinygpt run /
checkpoint; optimizer, schedule and step count start fresh. The weights fit one shape, so the source
sets it over any preset (why: docs/design.md, "Fine-tuning and early stopping"); a smaller
model.block_size crops the position embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import torch

from checkpoint.file import CheckpointError, read_checkpoint
from common.cli import count
from data.chat_template import without_chat
from data.hf_tokenizer import hf_tokenizer_dict
from data.prepare import encode_with
from data.tokenizer import data_setting, describe_tokenizer, vocab_size_of
from model import hf
from model.config import GPTConfig, pad_vocab
from model.gpt import clean_state_dict, model_with_weights
from training import chat_source

SHAPE = ("n_layer", "n_head", "n_embd", "bias", "tie_weights",  # the source's, always
         "position", "rope_theta", "norm", "norm_eps", "mlp", "mlp_hidden", "n_kv_head", "head_dim", "qk_norm",
         "logit_softcap")
WHAT = ("a local Hugging Face GPT-2, Llama or Qwen3 directory (config.json + model.safetensors), a tinygpt run "
        "directory, a nanoGPT out_dir or a .pt file")


@dataclass
class Source:
    """Where the weights come from: `path` (a HF directory or a checkpoint file), its shape and
    tokenizer."""
    key: str  # "model.init_from=<as given>", for messages
    path: Path
    config: GPTConfig
    tokenizer: dict  # the tokenizer's to_dict(); a GPT-2 directory reads GPT-2 BPE
    hf_dir: bool = False  # a Hugging Face directory (else a tinygpt checkpoint)
    # a tinygpt checkpoint, read once (dropped once its weights are in the model)
    ckpt: Optional[dict] = None
    # a checkpoint's: tinygpt, or nanoGPT (its ckpt.pt, read as checkpoint/nanogpt.py says)
    written_by: str = "tinygpt"

    def describe(self, block_size: int) -> str:
        """Where from and what, for the run's opening lines (`block_size`: the run's context)."""
        c = self.config
        kind = f"{self.written_by} checkpoint" if not self.hf_dir else "Hugging Face " + (
            "GPT-2" if c.position == "learned" else "Qwen3" if c.qk_norm else "Llama")
        return f"{self.path} ({kind}: {count(c.n_layer, 'layer')}, {count(c.n_head, 'head')}, {c.n_embd} wide, " \
               f"context {c.block_size})" + (f", context cropped to {block_size}" if block_size < c.block_size else "")

    def check_tokenizer(self, tokenizer: dict) -> None:
        check_tokenizer(self, tokenizer)

    def build(self, model_cls, config: GPTConfig, resume) -> torch.nn.Module:
        return build(model_cls, config, self, resume)


def open_source(spec: str) -> Source:
    """The source `spec` names, with its shape (a checkpoint file is read once, a HF directory's
    weights later)."""
    key, path = f"model.init_from={spec}", Path(spec).expanduser()
    # a model's name, e.g. gpt2: the command that downloads it (tinygpt never does)
    if not path.exists():
        # (only here: not on every run's path)
        from model.hub import download_command, looks_like_a_name
        hint = f" (e.g. {download_command(spec)})" if looks_like_a_name(spec) else ""
        raise ValueError(f"{key} does not exist: give {WHAT}{hint}")
    if path.is_dir() and (path / "config.json").is_file():
        try:
            config = hf.read_config(path)
        except (ValueError, OSError) as e:
            raise ValueError(f"{key} is not a Hugging Face directory tinygpt can load: "
                             f"{str(e).splitlines()[0]}") from None
        if not any((path / name).is_file() for name in hf.WEIGHT_FILES):
            raise ValueError(f"{key} has a config.json but no weights (model.safetensors or pytorch_model.bin): "
                             f"download the whole model directory")
        # GPT-2 BPE, or its tokenizer.json (Llama/Qwen3, an export's char or own BPE): the data's
        return Source(key, path, config, hf_tokenizer(key, path), hf_dir=True)
    try:
        file, ckpt = read_checkpoint(path, model=True, run_dir=True)
    except FileNotFoundError:
        raise ValueError(f"{key} is neither a Hugging Face GPT-2 directory (no config.json) nor a tinygpt or nanoGPT "
                         f"run directory (no best.pt, last.pt or ckpt.pt): give {WHAT}") from None
    except CheckpointError as e:
        raise ValueError(f"{key}: {e}") from None
    try:
        config = GPTConfig.from_dict(dict(ckpt["model_config"]))
    except (ValueError, TypeError) as e:
        # without GPTConfig's advice: the settings are the file's
        what = str(e).split(": ")[0]
        raise ValueError(f"{key}: {file} has a bad model_config ({what})") from None
    return Source(key, file, config, ckpt["tokenizer"], ckpt=ckpt,
                  written_by="nanoGPT" if ckpt.get("from_nanogpt") else "tinygpt")


def hf_tokenizer(key: str, path: Path) -> dict:
    """The to_dict() of a HF directory's tokenizer: GPT-2 BPE, or its tokenizer.json."""
    try:
        return hf_tokenizer_dict(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{key}: {str(e).splitlines()[0]}") from None


def use_source_bpe(c, src: Source, given: set[str]) -> None:
    """A source's own BPE becomes the data's tokenizer, unless the command line chose another:
    data.tokenizer=bpe of its size, encoding with a HF directory's tokenizer.json
    (data.tokenizer_file) or a checkpoint's BPE (use_source_tokenizer)."""
    d = c.data
    if d.name == "shakespeare_char" or "data.tokenizer" in given and d.tokenizer != "bpe":
        where = "tokenizer.json" if src.hf_dir else "its checkpoint's"
        raise ValueError(f"{src.key} reads its own BPE ({where}) but data={d.name} is tokenized "
                         f"with data.tokenizer={d.tokenizer}: leave data.tokenizer out "
                         f"(data=shakespeare or data=text)")
    d.tokenizer = "bpe"
    if src.hf_dir and "data.tokenizer_file" not in given:
        d.tokenizer_file = str((src.path / "tokenizer.json").resolve())
    if "data.vocab_size" not in given:
        d.vocab_size = vocab_size_of(src.tokenizer)


def given_keys(cli_overrides: Optional[Iterable[str]]) -> set[str]:
    """The keys the command line set explicitly (`model.n_layer=4`, `+model.x=1`, ...)."""
    return {o.lstrip("+~").split("=", 1)[0].strip() for o in cli_overrides or ()}


def apply(c, cli_overrides: Optional[Iterable[str]] = None, data_kind: Optional[str] = None) -> Optional[Source]:
    """Open `c.model.init_from` (if set) and give `c.model` its shape, context and vocabulary
    padding; `data_kind`: the data.tokenizer the config edge's validation chose (c.data.validate()).
    """
    m = c.model
    if m.init_from is None:
        return None
    src, given = open_source(m.init_from), given_keys(cli_overrides)
    s = src.config
    for name in SHAPE:
        if f"model.{name}" in given and getattr(m, name) != getattr(s, name):
            raise ValueError(f"model.{name}={str(getattr(m, name)).lower()} contradicts {src.key}, whose model has "
                             f"{name}={str(getattr(s, name)).lower()}: leave model.{name} out (the shape comes "
                             f"from the weights)")
        setattr(m, name, getattr(s, name))
    if "model.block_size" not in given:
        m.block_size = s.block_size
    elif m.block_size > s.block_size:
        raise ValueError(f"model.block_size={m.block_size} is larger than the context of {src.key} ({s.block_size} "
                         f"positions): use at most model.block_size={s.block_size} (a smaller one crops it)")
    if c.data.name == "chat":
        # conversations: the source's tokenizer with a chat template (training/chat_source.py)
        chat_source.use_chat_tokenizer(c, src)
        n = vocab_size_of(src.tokenizer)
    else:
        # text: the source's own tokenizer (an imported model's without its chat template)
        src.tokenizer = without_chat(src.tokenizer)
        n = use_source_tokenizer(c, src, given, data_kind)
    # the chat tokens a source has no rows for get them (chat_source.add_rows)
    rows = max(n, s.vocab_size) if c.data.name == "chat" else s.vocab_size
    if rows < n:
        raise ValueError(f"{src.key} has {s.vocab_size} vocabulary rows, fewer than the {n} ids of its "
                         f"{describe_tokenizer(src.tokenizer)} tokenizer: it cannot read this data")
    if pad_vocab(n, m.pad_vocab_to) != rows:
        if "model.pad_vocab_to" in given:
            raise ValueError(f"model.pad_vocab_to={m.pad_vocab_to} would make {pad_vocab(n, m.pad_vocab_to)} "
                             f"vocabulary rows but {src.key} has {rows}: leave "
                             f"model.pad_vocab_to out")
        # pad_vocab(n, that) == rows
        m.pad_vocab_to = 1 if rows == n else rows
    m.init_from = str(src.path.resolve())  # what the checkpoint's config records
    return src


def use_source_tokenizer(c, src: Source, given: set[str], data_kind: Optional[str]) -> int:
    """The data encoded with the source's tokenizer, the only ids its model reads: an own BPE's
    settings set, the type checked, a char vocabulary or own BPE handed to data preparation (which
    encodes the new text with it, not with one made from the text); the number of its ids."""
    kind, n = data_setting(src.tokenizer), vocab_size_of(src.tokenizer)
    if kind == "bpe":
        use_source_bpe(c, src, given)
        data_kind = None  # the data settings changed: validate them again
    data_kind = data_kind or c.data.validate()
    if kind != data_kind:
        text = "data=text" + ("" if c.data.path else " data.path=<your text>")
        fix = (f"use data=shakespeare, or {text} data.tokenizer=gpt2" if kind == "gpt2" else
               "use data with the char tokenizer it was trained on: data=shakespeare_char (Tiny "
               "Shakespeare's characters), or data=text data.path=<your text> data.tokenizer=char "
               "(char-level: characters it knows)")
        raise ValueError(f"{src.key} reads {describe_tokenizer(src.tokenizer)} tokens but "
                         f"data={c.data.name} is tokenized with data.tokenizer={data_kind}: {fix}")
    if kind == "bpe" and c.data.vocab_size != n:
        raise ValueError(f"{src.key} has its own {n}-token BPE but data.vocab_size="
                         f"{c.data.vocab_size}: leave data.vocab_size out (its BPE encodes the "
                         f"data)")
    if kind != "gpt2" and c.data.tokenizer_file is None:
        encode_with(c.data, src.tokenizer)
    return n


def check_tokenizer(src: Source, tokenizer: dict) -> None:
    """The prepared data's tokenizer (`to_dict()`) must be the source's: the same ids for the same
    text. `apply` had the data encoded with it; only a data.tokenizer_file given on the command line
    can name another."""
    if tokenizer != src.tokenizer:
        ours, its = describe_tokenizer(tokenizer), describe_tokenizer(src.tokenizer)
        raise ValueError(f"the prepared data's tokenizer ({ours}) differs from the one {src.key} "
                         f"was trained with ({its}): leave data.tokenizer_file out (the source's "
                         f"tokenizer encodes the data)")


def build(model_cls, config: GPTConfig, src: Optional[Source], resume) -> torch.nn.Module:
    """`model_cls(config)` with the source's weights (wpe cropped to block_size); fresh without one
    or resuming."""
    if src is None or resume is not False:
        if src is not None:
            src.ckpt = None
        return model_cls(config)
    sd = hf.read_pretrained(src.path)[1] if src.hf_dir else clean_state_dict(src.ckpt["model"])
    if "transformer.wpe.weight" in sd:  # (its absence: check_weights says so)
        sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][: config.block_size].clone()
    src.ckpt = None  # the weights live in the model now
    # rows for the chat tokens a source lacks (any other shape is check_weights' to report)
    sd = chat_source.add_rows(sd, config.vocab_size, src.key, src.tokenizer)
    return model_with_weights(model_cls, config, sd, src.key)
