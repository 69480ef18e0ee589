"""The prepared-data cache: `cache_dir()/prepared/<name>-<tokenizer>-<key>/` holding the token shards of each split
(train-00000.bin ..., val-00000.bin ...) and meta.json listing them.

The key hashes everything the tokens depend on; a directory appears under its final name only once complete
(built in `.tmp-<host>-<pid>-<random>`, then renamed), so a killed run never leaves one a later run would trust; a
later run of the same key adopts a dead run's `.tmp-*` (renaming it to its own name) and keeps its closed shards.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from common.files import fsync_dir, write_text_atomic
from common.platform import pid_alive
from data import sources
from data.shards import PROGRESS, TokenShards
from data.tokenizer import Tokenizer, tokenizer_from_dict

FORMAT = "tinygpt-prepared"
FORMAT_VERSION = 2  # 2: meta.json lists each split's shards; 1 (one train.bin and one val.bin) is still read
KEY_VERSION = 1  # in the key: shards did not change the tokens, so caches of version 1 keep their keys
STALE_PARTIAL_S = 7 * 24 * 3600  # a dead run's closed shards are kept this long for a rerun to continue from


@dataclass
class Prepared:
    dir: Path
    meta: dict
    train_paths: list[Path]
    val_paths: list[Path]
    tokenizer: Tokenizer
    cached: bool = field(default=False, compare=False)
    # the source this call read; meta.json's source.path names the first copy prepared with this content
    source: str | None = field(default=None, compare=False)
    files: tuple[TokenShards, TokenShards] | None = field(default=None, compare=False, repr=False)

    def token_files(self) -> tuple[TokenShards, TokenShards]:
        """(train, val), each read as one sequence across its shards, opened and checked once."""
        if self.files is None:
            self.files = TokenShards(self.train_paths), TokenShards(self.val_paths)
        return self.files

    @property
    def train_path(self) -> Path:
        """The train token file of a corpus that fits one shard (tests, small data); token_files() reads any size."""
        assert len(self.train_paths) == 1, f"{self.dir} has {len(self.train_paths)} train shards"
        return self.train_paths[0]

    @property
    def val_path(self) -> Path:
        assert len(self.val_paths) == 1, f"{self.dir} has {len(self.val_paths)} val shards"
        return self.val_paths[0]

    @property
    def train_tokens(self) -> int:
        return int(self.meta["train_tokens"])

    @property
    def val_tokens(self) -> int:
        return int(self.meta["val_tokens"])


def prepared_root() -> Path:
    return sources.cache_dir() / "prepared"


def cache_key(source_hash: str, tokenizer: str, val_fraction: float, encoding_errors: str, **more) -> str:
    """`more`: settings given only for the sources they affect, so the keys of all others stay what they were."""
    blob = json.dumps({"format": KEY_VERSION, "source": source_hash, "tokenizer": tokenizer,
                       "val_fraction": float(val_fraction), "encoding_errors": encoding_errors, **more}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_prepared(directory: str | os.PathLike, *, expect_key: str | None = None) -> Prepared:
    """Open a prepared directory, checking meta.json and every token-file header (ValueError if damaged)."""
    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{d / 'meta.json'} is missing or not valid JSON ({type(e).__name__}): delete {d} and "
                         f"prepare again") from None
    if meta.get("format") != FORMAT or meta.get("version") not in (1, FORMAT_VERSION):
        raise ValueError(f"{d} was prepared by another version (format {meta.get('format')!r} v{meta.get('version')}):"
                         f" delete it and prepare again")
    if expect_key is not None and meta.get("key") != expect_key:
        raise ValueError(f"{d / 'meta.json'} does not match its directory (key {meta.get('key')!r}): delete {d} "
                         f"and prepare again")
    names = meta.get("shards") or {"train": ["train.bin"], "val": ["val.bin"]}  # version 1: one file a split
    try:
        splits = {split: TokenShards([d / n for n in names[split]]) for split in ("train", "val")}
    except FileNotFoundError as e:
        raise ValueError(f"{d} is incomplete ({e.__class__.__name__}: a token file is missing): delete it and "
                         f"prepare again") from None
    except (KeyError, TypeError, AssertionError):
        raise ValueError(f"{d / 'meta.json'} lists no shards for a split: delete {d} and prepare again") from None
    for split, ts in splits.items():
        if len(ts) != meta.get(f"{split}_tokens") or ts.vocab_size != meta.get("vocab_size"):
            raise ValueError(f"{split} shards of {d} do not match {d / 'meta.json'} ({len(ts):,} tokens, vocabulary "
                             f"{ts.vocab_size}): delete {d} and prepare again")
    train, val = splits["train"], splits["val"]
    return Prepared(d, meta, [f.path for f in train.files], [f.path for f in val.files],
                    tokenizer_from_dict(meta["tokenizer"]), files=(train, val))


def lookup(final: Path, key: str, note: Callable[[str], None]) -> Prepared | None:
    """The cached copy at `final` if it checks out; a damaged one is noted and removed."""
    if not final.is_dir():
        return None
    try:
        p = load_prepared(final, expect_key=key)
    except ValueError as e:
        note(f"note: the prepared data in {final} is damaged ({e}); preparing it again")
        shutil.rmtree(final, ignore_errors=True)
        return None
    p.cached = True
    return p


def _owner_alive(tmp: Path) -> bool:
    """Whether the run that owns `tmp` may still be at work (its name says host and pid; older ones: `.owner`)."""
    m = re.fullmatch(r"\.tmp-(.+)-(\d+)-[0-9a-f]{12}", tmp.name)
    try:
        host, pid = (m.group(1), m.group(2)) if m else (tmp / ".owner").read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return time.time() - tmp.stat().st_mtime < 24 * 3600  # unknown owner: keep for a day
    if host not in (_host(), socket.gethostname()):
        return True  # another machine on a shared file system: not ours to judge
    return pid > 0 and pid_alive(pid)  # pid 0: released by an interrupted run


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:60] or "host"


def _own_name(root: Path, pid: int | None = None) -> Path:
    return root / f".tmp-{_host()}-{os.getpid() if pid is None else pid}-{os.urandom(6).hex()}"


def _partial_key(tmp: Path) -> str | None:
    with suppress(OSError, ValueError, AttributeError):
        return json.loads((tmp / PROGRESS).read_text(encoding="utf-8"))["head"]["key"]
    return None


def _claim(root: Path, key: str) -> Path | None:
    """Adopt the `.tmp-*` of a dead run of `key` by renaming it to our own name (of two racing runs, one wins);
    remove dead ones of other keys that have nothing to continue from, or are older than STALE_PARTIAL_S."""
    mine = None
    for stale in root.glob(".tmp-*"):
        with suppress(OSError):
            if not stale.is_dir() or _owner_alive(stale):
                continue
            other = _partial_key(stale)
            if mine is None and other == key:
                target = _own_name(root)
                os.rename(stale, target)  # FileNotFoundError when another run adopted it first
                mine = target
            elif other is None or time.time() - stale.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(stale, ignore_errors=True)
    return mine


@contextmanager
def staging(root: Path, key: str) -> Iterator[Path]:
    """Our own `root/.tmp-<host>-<pid>-<random>/`: a dead run's of the same `key` when there is one (its closed
    shards continue), else a new one. An error removes it; an interrupt (Ctrl-C) keeps it for a rerun."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = _claim(root, key)
        if tmp is None:
            tmp = _own_name(root)
            tmp.mkdir()
    except OSError as e:
        raise type(e)(f"the data cache {root} is not writable ({e.strerror or e}): make it writable, or set "
                      f"TINYGPT_CACHE to a writable directory") from None
    try:
        yield tmp
    except KeyboardInterrupt:
        with suppress(OSError):  # released, so that a rerun (even in this process) continues from it
            os.rename(tmp, _own_name(root, pid=0))
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, final: Path, meta: dict) -> bool:
    """Write meta.json into the finished `tmp` and rename it to `final`, durably. False when another process
    (e.g. another DDP rank) published `final` first: its identical result is kept."""
    write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=2, ensure_ascii=True) + "\n")
    (tmp / PROGRESS).unlink(missing_ok=True)
    fsync_dir(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    fsync_dir(final.parent)
    return True
