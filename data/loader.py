"""Prepared data read back: the checked `.bin` token format (`TokenFile`), a split's shards as one sequence
(`TokenShards`; written by data/shards.py), a prepared directory (`Prepared`) and `BatchLoader`.

A damaged token file is a one-line ValueError; batches depend only on (seed, global step): docs/design.md (Data).
torch is imported lazily: preparing data does not need it.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.rng import seed_for
from common.cli import setting_error
from data.tokenizer import Tokenizer, token_bytes

# 32-byte little-endian header, then `count` ids of `itemsize` bytes each:
# magic b"TGPTTOK\0" | uint32 version (1) | uint32 itemsize (2 or 4) | uint64 count | uint32 vocab_size | uint32 0
MAGIC = b"TGPTTOK\0"
VERSION = 1
HEADER = struct.Struct("<8sIIQII")
HEADER_SIZE = HEADER.size  # 32
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    return _DTYPES[2] if vocab_size <= 1 << 16 else _DTYPES[4]


def header(dtype: np.dtype, count: int, vocab_size: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, dtype.itemsize, count, vocab_size, 0)


def _fix_hint(path: Path) -> str:
    return f"delete {path.parent} so that the next run prepares it again"  # (data.prepare alone: the default set)


class TokenFile:
    """A checked, memory-mapped token file. `tokens` is a read-only numpy array (memmap)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"token file {self.path} does not exist: prepare the data first "
                                    f"(python -m data.prepare, or just run training)")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            raise ValueError(f"{self.path} is truncated ({size} bytes, shorter than its {HEADER_SIZE}-byte "
                             f"header): {_fix_hint(self.path)}")
        magic, version, itemsize, count, vocab_size, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise ValueError(f"{self.path} is not a tinygpt token file (bad magic {magic!r}): {_fix_hint(self.path)}")
        if version != VERSION:
            raise ValueError(f"{self.path} has token-file format version {version}, this code reads version "
                             f"{VERSION}: {_fix_hint(self.path)}")
        if itemsize not in _DTYPES:
            raise ValueError(f"{self.path} is corrupt (unknown token size {itemsize} bytes): {_fix_hint(self.path)}")
        expected = HEADER_SIZE + count * itemsize
        if size != expected:
            what = "truncated" if size < expected else "corrupt (longer than its header says)"
            raise ValueError(f"{self.path} is {what}: the header says {count:,} tokens ({expected:,} bytes) but "
                             f"the file has {size:,} bytes: {_fix_hint(self.path)}")
        self.dtype = _DTYPES[itemsize]
        self.vocab_size = int(vocab_size)
        self.count = int(count)
        if count == 0:
            self.tokens = np.empty(0, dtype=self.dtype)
            return
        self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r", offset=HEADER_SIZE, shape=(count,))
        if (top := int(self.tokens.max())) >= vocab_size:  # ~0.01 s per 300 MB when cached, ~0.2 s from disk
            raise ValueError(f"{self.path} is corrupt: it holds token id {top:,} but its vocabulary has {vocab_size:,} "
                             f"ids (its bytes were overwritten): {_fix_hint(self.path)}")

    def __len__(self) -> int:
        return self.count

    def windows(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """Rows tokens[o:o + length], one per offset."""
        return self.tokens[np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(length, dtype=np.int64)]


def write_token_file(path: str | os.PathLike, ids, vocab_size: int) -> Path:
    """Write a whole token file at once (tests, small data); data/shards.py's TokenWriter streams one."""
    arr = np.asarray(ids)
    assert arr.size == 0 or 0 <= arr.min() <= arr.max() < vocab_size, "token id outside the vocabulary"
    arr = arr.astype(dtype_for_vocab(vocab_size))
    with open(path, "wb") as f:
        f.write(header(arr.dtype, arr.size, vocab_size) + arr.tobytes())
    return Path(path)


class TokenShards:
    """A split's token files read as one sequence: `len()`, `windows()` and the first file's `path`."""

    def __init__(self, files):
        self.files = [f if isinstance(f, TokenFile) else TokenFile(f) for f in files]
        assert self.files, "a split has at least one shard"
        vocab = {f.vocab_size for f in self.files}
        if len(vocab) != 1:
            raise ValueError(f"the shards of {self.path.parent} disagree on the vocabulary ({sorted(vocab)}): delete "
                             f"{self.path.parent} so it is prepared again")
        self.vocab_size = vocab.pop()
        self.dtype = self.files[0].dtype
        self.starts = np.cumsum([0] + [len(f) for f in self.files])  # global offset of each shard, then the total

    @property
    def path(self) -> Path:
        return self.files[0].path

    def __len__(self) -> int:
        return int(self.starts[-1])

    def windows(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """Rows tokens[o:o + length] of the concatenated shards, one per offset."""
        if len(self.files) == 1:
            return self.files[0].windows(offsets, length)
        out = np.empty((len(offsets), length), dtype=self.dtype)
        for row, o in enumerate(np.asarray(offsets, dtype=np.int64)):
            i, filled = int(np.searchsorted(self.starts, o, side="right")) - 1, 0
            while filled < length:  # a window may run on into the next shard(s)
                lo = int(o + filled - self.starts[i])
                part = self.files[i].tokens[lo:lo + length - filled]
                out[row, filled:filled + len(part)] = part
                filled, i = filled + len(part), i + 1
        return out


@dataclass
class Prepared:
    """A prepared directory: its meta.json, tokenizer and each split's shards (`token_files()`: opened once)."""
    dir: Path
    meta: dict
    tokenizer: Tokenizer
    cached: bool = False  # found in the cache (not prepared by this call)
    source: str | None = None  # the source this call read; meta.json's source.path names the first copy prepared
    files: tuple[TokenShards, TokenShards] | None = field(default=None, repr=False)

    def paths(self, split: str) -> list[Path]:
        names = self.meta.get("shards") or {"train": ["train.bin"], "val": ["val.bin"]}  # version 1: one a split
        return [self.dir / n for n in names[split]]

    def token_files(self) -> tuple[TokenShards, TokenShards]:
        """(train, val), each read as one sequence across its shards, opened and checked once."""
        if self.files is None:
            self.files = TokenShards(self.paths("train")), TokenShards(self.paths("val"))
        return self.files

    def token_bytes(self, device) -> torch.Tensor:
        """Each id's UTF-8 length on `device`: the divisor of bits per byte."""
        return token_bytes(self.tokenizer).to(device)

    train_paths = property(lambda self: self.paths("train"))
    val_paths = property(lambda self: self.paths("val"))
    train_tokens = property(lambda self: int(self.meta["train_tokens"]))
    val_tokens = property(lambda self: int(self.meta["val_tokens"]))

    @property
    def train_path(self) -> Path:
        """The train token file of a corpus that fits one shard (tests, small data); token_files() reads any size."""
        (path,) = self.train_paths
        return path

    @property
    def val_path(self) -> Path:
        (path,) = self.val_paths
        return path


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise setting_error("{" + name + "=}{0!r} must be a positive integer", value)
    return int(value)


MIN_CONTEXT = 8  # the smallest model.block_size advice offers: below it there is no language model to speak of


def _too_short(files: dict, block_size: int) -> ValueError:
    """A split is shorter than one window; every fix offered satisfies both splits and leaves a context of at least
    MIN_CONTEXT tokens, else the text is too small to train on and the message says how much it needs."""
    need = block_size + 1
    sizes = {split: len(tf) for split, tf in files.items()}
    short = [split for split, n in sizes.items() if n < need]
    what = " and the ".join(f"{split} split has only {sizes[split]:,} token{'s' * (sizes[split] != 1)}"
                            for split in short)
    fixes = ["lower {block_size} to at most {3}"] if min(sizes.values()) - 1 >= MIN_CONTEXT else []
    if len(short) == 1 and sum(sizes.values()) >= 2 * need:
        fixes.append("raise {val_fraction} to keep more text for validation" if short == ["val"] else
                     "lower {val_fraction} to keep more text for training")
    prepared = files[short[0]].path.parent
    meta = _meta(prepared)
    vf, source = meta.get("split", {}).get("val_fraction"), meta.get("source", {}).get("path")
    fits = isinstance(vf, float) and 0 < vf < 1
    enough = "(at least {5:,} tokens with {val_fraction=}{6}; " if fits else "(at least {2:,} tokens in each split; "
    enough += "the text: {7})" if source else "prepared in {4})"
    values = (what, block_size, need, min(sizes.values()) - 1, prepared, math.ceil(need / min(vf, 1 - vf)) if fits
              else None, vf, source)
    if not fixes:
        return setting_error("the text is too small to train on: the {0} but {block_size=}{1} needs at least {2:,} in "
                             "each split: use a longer text " + enough, *values)
    fixes.append("use more text " + enough)
    return setting_error("the {0} but {block_size=}{1} needs at least {2:,}: " + ", ".join(fixes[:-1]) +
                         f" or {fixes[-1]}", *values)


def _meta(prepared: Path) -> dict:
    """A prepared directory's meta.json (its source and split), {} when it has none (token files alone)."""
    try:
        meta = json.loads((prepared / "meta.json").read_text(encoding="utf-8"))
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def _open_split(f) -> TokenFile | TokenShards:
    """A split as given: a TokenFile or TokenShards opened already, a path, or a list of shard paths."""
    if isinstance(f, (TokenFile, TokenShards)):
        return f
    return TokenShards(f) if isinstance(f, (list, tuple)) else TokenFile(f)


class BatchLoader:
    """Random (x, y) windows from train/val token files; deterministic per global step; resumable."""

    def __init__(self, train, val, block_size: int, batch_size: int, *, seed: int,
                 grad_accum_steps: int = 1, rank: int = 0, world_size: int = 1, device="cpu"):
        import torch
        self.block_size = _positive_int("block_size", block_size)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.grad_accum_steps = _positive_int("grad_accum_steps", grad_accum_steps)
        self.world_size = _positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r} must be in 0..{world_size - 1} for world_size={world_size}")
        self.rank = int(rank)
        self.seed = int(seed)
        self.device = torch.device(device)
        self.global_batch = self.batch_size * self.grad_accum_steps * self.world_size
        self.files = {split: _open_split(f) for split, f in (("train", train), ("val", val))}
        need = self.block_size + 1
        if min(len(tf) for tf in self.files.values()) < need:
            raise _too_short(self.files, self.block_size)
        self.step, self.micro = 0, 0
        self._offsets_step, self._offsets = -1, None  # the step whose train offsets are drawn, and those offsets

    def state_dict(self) -> dict:
        return {"step": self.step, "micro": self.micro}

    def load_state_dict(self, state: dict) -> None:
        step, micro = int(state["step"]), int(state["micro"])
        if step < 0 or not 0 <= micro < self.grad_accum_steps:
            raise setting_error("loader state {0!r} does not fit {grad_accum_steps=}{1}: resume with the same "
                                "{grad_accum_steps}", state, self.grad_accum_steps)
        self.step, self.micro = step, micro

    def _draw(self, split: str, n: int, *key) -> np.ndarray:
        """`n` window offsets into `split` from a generator seeded by (seed, *key) alone."""
        import torch
        g = torch.Generator()
        g.manual_seed(seed_for(self.seed, *key))
        return torch.randint(len(self.files[split]) - self.block_size, (n,), generator=g).numpy()

    def next_batch(self):
        """(x, y) for this rank's current micro-step, then advance (micro, then step)."""
        if self._offsets_step != self.step:
            self._offsets = self._draw("train", self.global_batch, "train", self.step)
            self._offsets_step = self.step
        start = (self.micro * self.world_size + self.rank) * self.batch_size
        offsets = self._offsets[start:start + self.batch_size]
        self.micro += 1
        if self.micro == self.grad_accum_steps:
            self.micro = 0
            self.step += 1
        return self._windows("train", offsets)

    def eval_batch(self, split: str, i: int):
        """The i-th evaluation batch of `split` ("train" or "val"): always the same windows."""
        if split not in self.files:
            raise ValueError(f"unknown split {split!r}: use 'train' or 'val'")
        return self._windows(split, self._draw(split, self.batch_size, "eval", split, int(i)))

    def _windows(self, split: str, offsets: np.ndarray):
        import torch
        w = self.files[split].windows(offsets, self.block_size + 1)
        x = torch.from_numpy(w[:, :-1].astype(np.int64))
        y = torch.from_numpy(w[:, 1:].astype(np.int64))
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            x, y = x.to(self.device), y.to(self.device)
        return x, y
