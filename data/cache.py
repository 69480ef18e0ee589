"""The prepared-data cache: `cache_dir()/prepared/<name>-<tokenizer>-<key>/` holding train.bin, val.bin, meta.json.

The key hashes everything the tokens depend on; a directory appears under its final name only once complete
(built in `.tmp-*`, then renamed), so a killed run never leaves one a later run would trust.
"""
from __future__ import annotations

import hashlib
import json
import os
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
from data.loader import TokenFile
from data.tokenizer import Tokenizer, tokenizer_from_dict

FORMAT = "tinygpt-prepared"
FORMAT_VERSION = 1


@dataclass
class Prepared:
    dir: Path
    meta: dict
    train_path: Path
    val_path: Path
    tokenizer: Tokenizer
    cached: bool = field(default=False, compare=False)
    # the source this call read; meta.json's source.path names the first copy prepared with this content
    source: str | None = field(default=None, compare=False)
    files: tuple[TokenFile, TokenFile] | None = field(default=None, compare=False, repr=False)

    def token_files(self) -> tuple[TokenFile, TokenFile]:
        """(train, val), opened and checked once (load_prepared has done it already)."""
        if self.files is None:
            self.files = TokenFile(self.train_path), TokenFile(self.val_path)
        return self.files

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
    blob = json.dumps({"format": FORMAT_VERSION, "source": source_hash, "tokenizer": tokenizer,
                       "val_fraction": float(val_fraction), "encoding_errors": encoding_errors, **more}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_prepared(directory: str | os.PathLike, *, expect_key: str | None = None) -> Prepared:
    """Open a prepared directory, checking meta.json and both token-file headers (ValueError if damaged)."""
    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{d / 'meta.json'} is missing or not valid JSON ({type(e).__name__}): delete {d} and "
                         f"prepare again") from None
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{d} was prepared by another version (format {meta.get('format')!r} v{meta.get('version')}):"
                         f" delete it and prepare again")
    if expect_key is not None and meta.get("key") != expect_key:
        raise ValueError(f"{d / 'meta.json'} does not match its directory (key {meta.get('key')!r}): delete {d} "
                         f"and prepare again")
    try:
        train, val = TokenFile(d / "train.bin"), TokenFile(d / "val.bin")
    except FileNotFoundError as e:
        raise ValueError(f"{d} is incomplete ({e.__class__.__name__}: a token file is missing): delete it and "
                         f"prepare again") from None
    for split, tf in (("train", train), ("val", val)):
        if len(tf) != meta.get(f"{split}_tokens") or tf.vocab_size != meta.get("vocab_size"):
            raise ValueError(f"{tf.path} does not match {d / 'meta.json'} ({len(tf):,} tokens, vocabulary "
                             f"{tf.vocab_size}): delete {d} and prepare again")
    return Prepared(d, meta, train.path, val.path, tokenizer_from_dict(meta["tokenizer"]), files=(train, val))


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
    try:
        host, pid = (tmp / ".owner").read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return time.time() - tmp.stat().st_mtime < 24 * 3600  # unknown owner: keep for a day
    if host != socket.gethostname():
        return True  # another machine on a shared file system: not ours to judge
    return pid_alive(pid)


@contextmanager
def staging(root: Path) -> Iterator[Path]:
    """A fresh `root/.tmp-<random>/` (its `.owner` file names host and pid), removed on any error; stale ones of
    dead owners are removed first."""
    tmp = root / f".tmp-{os.urandom(6).hex()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            with suppress(OSError):
                if stale.is_dir() and not _owner_alive(stale):
                    shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise type(e)(f"the data cache {root} is not writable ({e.strerror or e}): make it writable, or set "
                      f"TINYGPT_CACHE to a writable directory") from None
    try:
        (tmp / ".owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, final: Path, meta: dict) -> bool:
    """Write meta.json into the finished `tmp` and rename it to `final`, durably. False when another process
    (e.g. another DDP rank) published `final` first: its identical result is kept."""
    write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=2, ensure_ascii=True) + "\n")
    (tmp / ".owner").unlink()
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
