"""`model.init_from`: fine-tune from a local Hugging Face GPT-2 directory or a tinygpt run / checkpoint; optimizer,
schedule and step count start fresh. The weights fit one shape, so the source sets it over any preset (why:
docs/design.md, "Fine-tuning and early stopping"); a smaller model.block_size crops the position embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import torch

from checkpoint.file import CheckpointError, read_checkpoint
from common.cli import count
from data.chat_template import without_chat
from data.hf_tokenizer import read_hf_tokenizer
from data.tokenizer import GPT2Tokenizer, data_setting, describe_tokenizer, vocab_size_of
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
    """Where the weights come from: `path` (a HF directory or a checkpoint file), its shape and tokenizer."""
    key: str  # "model.init_from=<as given>", for messages
    path: Path
    config: GPTConfig
    tokenizer: dict  # the tokenizer's to_dict(); a GPT-2 directory reads GPT-2 BPE
    hf_dir: bool = False  # a Hugging Face directory (else a tinygpt checkpoint)
    ckpt: Optional[dict] = None  # a tinygpt checkpoint, read once (dropped once its weights are in the model)
    written_by: str = "tinygpt"  # a checkpoint's: tinygpt, or nanoGPT (its ckpt.pt, read as checkpoint/nanogpt.py says)

    def describe(self, block_size: int) -> str:
        """Where from and what, for the run's opening lines (`block_size`: the run's context)."""
        c = self.config
        kind = f"{self.written_by} checkpoint" if not self.hf_dir else "Hugging Face " + (
            "GPT-2" if c.position == "learned" else "Qwen3" if c.qk_norm else "Llama")
        return f"{self.path} ({kind}: {count(c.n_layer, 'layer')}, {count(c.n_head, 'head')}, {c.n_embd} wide, " \
               f"context {c.block_size})" + (f", context cropped to {block_size}" if block_size < c.block_size else "")


def open_source(spec: str) -> Source:
    """The source `spec` names, with its shape (a checkpoint file is read once, a HF directory's weights later)."""
    key, path = f"model.init_from={spec}", Path(spec).expanduser()
    if not path.exists():  # a model's name, e.g. gpt2: the command that downloads it (tinygpt never does)
        from model.hub import download_command, looks_like_a_name  # (only here: not on every run's path)
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
        if config.position == "rope":  # Llama/Qwen3: its own tokenizer.json, which the run's data then uses
            return Source(key, path, config, hf_tokenizer(key, path), hf_dir=True)
        return Source(key, path, config, GPT2Tokenizer.to_dict(), hf_dir=True)
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
        raise ValueError(f"{key}: {file} has a bad model_config ({e})") from None
    return Source(key, file, config, ckpt["tokenizer"], ckpt=ckpt,
                  written_by="nanoGPT" if ckpt.get("from_nanogpt") else "tinygpt")


def hf_tokenizer(key: str, path: Path) -> dict:
    """The to_dict() of a Llama/Qwen3 directory's tokenizer (tokenizer.json; an export's GPT-2 BPE or char too)."""
    try:
        return read_hf_tokenizer(path).to_dict()
    except (ValueError, OSError) as e:
        raise ValueError(f"{key}: {str(e).splitlines()[0]}") from None


def use_source_tokenizer(c, src: Source, given: set[str]) -> None:
    """A Hugging Face model's own BPE (its tokenizer.json) becomes the data's tokenizer: data.tokenizer=bpe,
    data.tokenizer_file=<dir>/tokenizer.json, unless the command line chose another tokenizer."""
    d = c.data
    if d.name == "shakespeare_char" or "data.tokenizer" in given and d.tokenizer != "bpe":
        raise ValueError(f"{src.key} reads its own BPE (tokenizer.json) but data={d.name} is tokenized with "
                         f"data.tokenizer={d.tokenizer}: leave data.tokenizer out (data=shakespeare or data=text)")
    if "data.tokenizer_file" not in given:
        d.tokenizer, d.tokenizer_file = "bpe", str((src.path / "tokenizer.json").resolve())
    if "data.vocab_size" not in given:
        d.vocab_size = vocab_size_of(src.tokenizer)


def given_keys(cli_overrides: Optional[Iterable[str]]) -> set[str]:
    """The keys the command line set explicitly (`model.n_layer=4`, `+model.x=1`, ...)."""
    return {o.lstrip("+~").split("=", 1)[0].strip() for o in cli_overrides or ()}


def apply(c, cli_overrides: Optional[Iterable[str]] = None, data_kind: Optional[str] = None) -> Optional[Source]:
    """Open `c.model.init_from` (if set) and give `c.model` its shape, context and vocabulary padding;
    `data_kind`: the data.tokenizer the config edge's validation chose (c.data.validate())."""
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
    # conversations: the source's tokenizer with a chat template (training/chat_source.py); text:
    # an imported model's tokenizer.json alone
    if c.data.name == "chat":
        chat_source.use_chat_tokenizer(c, src)
        data_kind = None
    elif src.hf_dir and data_setting(src.tokenizer) == "bpe":
        src.tokenizer = without_chat(src.tokenizer)
        use_source_tokenizer(c, src, given)
        data_kind = None  # the data settings changed: validate them again
    kind, data_kind, n = data_setting(src.tokenizer), data_kind or c.data.validate(), vocab_size_of(src.tokenizer)
    own_bpe = f"use data.tokenizer=bpe data.vocab_size={n} on the text it was trained on (its BPE was learnt there)"
    if kind != data_kind:
        fix = {"gpt2": "use data=shakespeare, or data=text data.tokenizer=gpt2", "bpe": own_bpe}.get(
            kind, "use data with the char tokenizer it was trained on")
        raise ValueError(f"{src.key} reads {describe_tokenizer(src.tokenizer)} tokens but data={c.data.name} is "
                         f"tokenized with data.tokenizer={data_kind}: {fix}")
    if kind == "bpe" and c.data.vocab_size != n and c.data.name != "chat":
        raise ValueError(f"{src.key} has its own {n}-token BPE but data.vocab_size={c.data.vocab_size}: {own_bpe}")
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


def check_tokenizer(src: Source, tokenizer: dict) -> None:
    """The prepared data's tokenizer (`to_dict()`) must be the source's: the same ids for the same text."""
    if tokenizer != src.tokenizer and data_setting(src.tokenizer) == "bpe":  # (the same size: apply checked it)
        raise ValueError(f"the BPE tokenizer trained on this data differs from the one {src.key} was trained with: a "
                         f"model with its own BPE fine-tunes only on the text (and data.tokenizer_sample_mb) that "
                         f"tokenizer was learnt from; for new text train a new model, or use GPT-2 BPE")
    if tokenizer != src.tokenizer:
        raise ValueError(f"the prepared data's vocabulary ({describe_tokenizer(tokenizer)}) differs from that of "
                         f"{src.key} ({describe_tokenizer(src.tokenizer)}): fine-tune on data with the characters it "
                         f"was trained on")


def build(model_cls, config: GPTConfig, src: Optional[Source], resume) -> torch.nn.Module:
    """`model_cls(config)` with the source's weights (wpe cropped to block_size); fresh without one or resuming."""
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
