"""`data=chat` prepared: conversations -> token ids, the loss mask and where each conversation
starts, per split, cached by content in `$TINYGPT_CACHE/prepared/chat-<tokenizer>-<key>/`
(data.prepare.prepare hands `data=chat` here). The directory is a `Prepared` like any other
(train.bin / val.bin hold the ids), plus `<split>-mask.bin` (1 where a token is learnt) and
`<split>-starts.bin` (each conversation's first token, then the total), all in the checked
token-file format; data/chat_loader.py reads them back as batches.

The tokenizer: `data.tokenizer_file` (a tinygpt tokenizer description, which a fine-tune's
model.init_from writes, or a Hugging Face tokenizer.json), else the conversations' characters (char)
or GPT-2 BPE; with its chat template (data/chat_template.py: tinygpt's own is added where it has
none).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from common.files import cache_dir
from data.chat import chat_files, read_conversations
from data.chat_template import ChatFormat, with_chat
from data.config import DataConfig
from data.loader import Prepared, TokenFile, write_token_file
from data.tokenizer import CharTokenizer, tokenizer_from_dict

FORMAT, VERSION = "tinygpt-chat", 1


def chat_tokenizer_dict(cfg: DataConfig, kind: str, conversations) -> dict:
    """The description of the tokenizer the conversations are encoded with, its chat template
    included."""
    if cfg.tokenizer_file is not None:
        text = Path(cfg.tokenizer_file).expanduser().read_text(encoding="utf-8")
        try:
            d = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"data.tokenizer_file={cfg.tokenizer_file} is not JSON: give a "
                             "tokenizer.json or a tinygpt tokenizer description") from None
        d = d if isinstance(d, dict) and "type" in d else {"type": "bpe", "json": text}
        return with_chat(tokenizer_from_dict(d).to_dict())
    if kind == "bpe":
        raise ValueError("data=chat does not train a BPE of its own: fine-tune a model trained "
                         "with one (model.init_from=RUN), give "
                         "data.tokenizer_file=<tokenizer.json>, or use data.tokenizer=char or "
                         "data.tokenizer=gpt2")
    if kind == "gpt2":
        return with_chat({"type": "gpt2"})
    chars = {c for _, conv in conversations for m in conv for c in m["content"]}
    return with_chat(CharTokenizer(chars or " ").to_dict())


def prepare_chat(cfg: DataConfig, *, progress: bool = True,
                 log: Callable[[str], None] | None = None) -> Prepared:
    """The prepared conversations of `cfg` (data=chat), from the cache when their files and
    tokenizer are there."""
    kind = cfg.validate()
    files = chat_files(cfg.paths())
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    conversations = None
    # a char vocabulary of its own is the conversations' characters
    if cfg.tokenizer_file is None and kind == "char":
        conversations = read_conversations(files)
    tok = chat_tokenizer_dict(cfg, kind, conversations)
    blob = json.dumps({"format": VERSION, "source": h.hexdigest(), "tokenizer": tok,
                       "val_fraction": float(cfg.val_fraction)}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    final = cache_dir(check=True) / "prepared" / f"chat-{tok['type']}-{key}"
    source = ", ".join(str(f.absolute()) for f in files)
    if (final / "meta.json").is_file():
        p = load_chat(final)
        p.cached, p.source = True, source
        return p
    conversations = conversations or read_conversations(files)
    build(final, key, conversations, tok, float(cfg.val_fraction), source)
    p = load_chat(final)
    p.source = source
    if progress:
        c = p.meta["chat"]
        note = (f"data=chat: {c['train_conversations']:,} train / {c['val_conversations']:,} val "
                f"conversations, {c['learnt_tokens']:,} of {p.meta['train_tokens']:,} train tokens "
                "learnt (the answers)")
        log(note) if log is not None else print(note, file=sys.stderr)
    return p


def build(final: Path, key: str, conversations, tok: dict, val_fraction: float,
          source: str) -> None:
    """Encode and write the splits into a temporary directory, then rename it into place (the first
    one wins)."""
    tokenizer = tokenizer_from_dict(tok)
    fmt = ChatFormat(tokenizer)
    encoded = []
    for where, conv in conversations:
        try:
            encoded.append(fmt.encode(conv))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    # the last val_fraction (one at least, one left for training); a single conversation serves both
    n = len(encoded)
    n_val = min(max(1, round(n * val_fraction)), n - 1) if n > 1 else 0
    splits = {"train": encoded[:n - n_val], "val": encoded[n - n_val:] or encoded}
    tmp = final.parent / f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    meta = {"format": FORMAT, "version": VERSION, "key": key, "name": "chat", "tokenizer": tok,
            "vocab_size": tokenizer.vocab_size,
            "shards": {"train": ["train.bin"], "val": ["val.bin"]},
            "source": {"path": source,
                       "chars": sum(len(m["content"]) for _, c in conversations for m in c)},
            "chat": {}}
    try:
        for split, rows in splits.items():
            ids = np.fromiter((i for r, _ in rows for i in r), dtype=np.int64)
            mask = np.fromiter((m for _, ms in rows for m in ms), dtype=np.int64)
            starts = np.cumsum([0] + [len(r) for r, _ in rows])
            write_token_file(tmp / f"{split}.bin", ids, tokenizer.vocab_size)
            write_token_file(tmp / f"{split}-mask.bin", mask, 2)
            write_token_file(tmp / f"{split}-starts.bin", starts, int(starts[-1]) + 1)
            meta[f"{split}_tokens"] = int(ids.size)
            meta["chat"][f"{split}_conversations"] = len(rows)
            learnt = "learnt_tokens" if split == "train" else "val_learnt_tokens"
            meta["chat"][learnt] = int(mask.sum())
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, final)
        # another process published it first: its identical result stays
        except OSError:
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_chat(d: Path) -> Prepared:
    """A prepared chat directory, its meta.json and token files checked (one line if damaged)."""
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        assert meta.get("format") == FORMAT and meta.get("version") == VERSION
        for split in ("train", "val"):
            for suffix in ("", "-mask", "-starts"):
                TokenFile(d / f"{split}{suffix}.bin")
    except (OSError, ValueError, AssertionError, AttributeError):
        raise ValueError(f"the prepared conversations in {d} are damaged or of another version: "
                         f"delete {d} and run again") from None
    return Prepared(d, meta, tokenizer_from_dict(meta["tokenizer"]))
