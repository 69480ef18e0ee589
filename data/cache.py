"""Filling the prepared-data cache on a miss: `prepared/<name>-<tokenizer>-<key>/` gets each split's token shards
and meta.json. It is built in `.tmp-<host>-<pid>-<random>` and renamed once complete, so a killed run never leaves
one a later run would trust. The builder holds a lock on it (filelock), which the OS drops when the builder dies:
a later run of the same key then adopts that `.tmp-*` and keeps its closed shards.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout
from tqdm import tqdm

from common.files import fsync_dir, write_text_atomic
from common.cli import setting_error
from data import bpe, corpus, sources
from data.config import Corpus, DataConfig
from data.encode import encode_bpe, encode_char
from data.loader import Prepared, dtype_for_vocab
from data.shards import PROGRESS, ShardWriter, saved_head
from data.tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer, tokenizer_from_dict

STALE_PARTIAL_S = 7 * 24 * 3600  # a dead run's closed shards are kept this long for a rerun to continue from


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:60] or "host"


def _elsewhere(tmp: Path) -> bool:
    """Whether another machine started `tmp` (a shared file system): not ours to judge, its lock may not reach us."""
    m = re.fullmatch(r"\.tmp-(.+)-\d+-[0-9a-f]{12}", tmp.name)
    return m is not None and m.group(1) != _host()


def _take(tmp: Path) -> FileLock | None:
    """`tmp`'s lock, now this process's: None while another run builds in it. The lock file lies beside the cache
    (`prepared.locks/`): Windows renames no directory with an open file inside."""
    lock = FileLock(tmp.parent.with_name(tmp.parent.name + ".locks") / tmp.name, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


def _let_go(lock: FileLock, tmp: Path) -> None:
    """Release `tmp`'s lock; its file goes too once `tmp` is gone (published or removed)."""
    lock.release()
    if not tmp.exists():
        Path(lock.lock_file).unlink(missing_ok=True)


def _claim(root: Path, key: str) -> tuple[Path, FileLock] | None:
    """A dead run's `.tmp-*` of `key` to continue, with its lock (of two racing runs, one takes it); dead ones of
    other keys are removed when they have nothing to continue from, or are older than STALE_PARTIAL_S."""
    mine = None
    for stale in root.glob(".tmp-*"):
        with suppress(OSError):
            if not stale.is_dir() or _elsewhere(stale) or (lock := _take(stale)) is None:
                continue  # its run is at work (the OS dropped a dead run's lock), or another machine's
            other = saved_head(stale).get("key")
            if mine is None and other == key:
                mine = stale, lock
                continue
            if other is None or time.time() - stale.stat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(stale, ignore_errors=True)
            _let_go(lock, stale)
    return mine


def _new(root: Path) -> tuple[Path, FileLock]:
    """A new `.tmp-<host>-<pid>-<random>`, locked before it exists (so no other run takes it for a dead one's)."""
    tmp = root / f".tmp-{_host()}-{os.getpid()}-{os.urandom(6).hex()}"
    lock = _take(tmp)  # a new name: free
    try:
        tmp.mkdir()
    except BaseException:
        _let_go(lock, tmp)
        raise
    return tmp, lock


@contextmanager
def staging(root: Path, key: str) -> Iterator[Path]:
    """Our own `root/.tmp-*/`, locked while we build in it: a dead run's of the same `key` when there is one (its
    closed shards continue), else a new one. An error removes it; an interrupt (Ctrl-C) keeps it for a rerun."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp, lock = _claim(root, key) or _new(root)
    except OSError as e:
        raise type(e)(f"the data cache {root} is not writable ({e.strerror or e}): make it writable, or set "
                      f"TINYGPT_CACHE to a writable directory") from None
    try:
        yield tmp
    except KeyboardInterrupt:
        raise  # kept, its lock released: a rerun (even in this process) continues from it
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _let_go(lock, tmp)


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


def build(cfg: DataConfig, tok_kind: str, src: Corpus, src_hash: str, head: dict, more: dict, final: Path,
          note: Callable[[str], None], progress: bool, shard_tokens: int,
          given: Tokenizer | None = None) -> Prepared | None:
    """Prepare `src` into `final` (data/prepare.py made the key and meta.json's `head`); None when another process
    published it first. Reads the text twice: to count characters (and collect the char vocabulary or the own
    BPE's sample), then to encode it (hashing it again, to catch a file that changed meanwhile).
    `given`: the tokenizer to encode with (a fine-tune's), instead of one made from the text."""
    errors, vf, key = cfg.encoding_errors, float(cfg.val_fraction), head["key"]

    def changed_error():
        return ValueError(f"{src.display} changed while it was being prepared: run again once it is stable")

    if src.given is None and src_hash != sources.SHAKESPEARE_SHA256:  # the cached download, hashed by prepare
        raise sources.not_shakespeare(src.files[0])
    t0 = time.perf_counter()
    # the tokenizer when not made from the text (GPT-2's fails early if its ranks are missing)
    fixed = given or (GPT2Tokenizer() if tok_kind == "gpt2" else None)
    with staging(final.parent, key) as tmp:
        saved = saved_head(tmp)
        if saved.get("key") == key:  # continuing a killed run: its count and tokenizer stand (same content)
            tok = fixed or tokenizer_from_dict(saved["tokenizer"])
            n_chars, chars = saved["chars"], None
        else:  # an own BPE trained here: the scan collects its sample
            own_bpe = tok_kind == "bpe" and cfg.tokenizer_file is None and fixed is None
            tok, sample_bytes = fixed, int(float(cfg.tokenizer_sample_mb) * 1e6) if own_bpe else 0
            n_chars, chars, sample = corpus.scan(src, errors, tok_kind == "char", sample_bytes)
        if n_chars == 0:  # the files have bytes (resolve checked), but no text: null or empty records, or decoding
            how = " or null" if src.keyed else ""
            why = ", after decoding with {encoding_errors=}{1}" if errors != "strict" else ""
            fix = ", or set {text_key=}<the field or column that holds it>" if src.keyed else ""
            raise setting_error("{0} has no text (every document is empty" + how + why + "): give a file with some "
                                "text" + fix, src.display, errors)
        n_train = int(n_chars * (1.0 - vf))
        if tok is None:  # a fresh start: the char vocabulary just scanned, or the own BPE (trained or cached)
            tok = CharTokenizer(chars) if tok_kind == "char" else bpe.tokenizer_for(sample, cfg, n_train, note)
        elif chars and (bad := tok.unknown_characters(chars)):  # a fine-tune's characters: not all
            raise tok.unknown_error(bad, "remove or replace them in the text, or train a new model "
                                    "on it (without model.init_from)", where=f"{src.display} has ")
        chars = sample = None  # not held while encoding
        sink = ShardWriter(tmp, tok.vocab_size, shard_tokens, {"key": key, "chars": n_chars,
                                                               "tokenizer": tok.to_dict()})
        start = sink.resume()
        done = f", continuing after {len(sink.done)} finished shards" if sink.done else ""
        note(f"preparing {cfg.name} ({n_chars:,} characters of text, {tok.describe()}) from {src.display} into "
             f"{final}{done}")
        hasher = hashlib.sha256()
        with tqdm(total=src.nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc=f"prepare {cfg.name}",
                  file=sys.stderr, disable=None if progress else True, leave=False) as bar:
            texts = corpus.read_text(src, errors, hasher=hasher, bar=bar)
            try:
                if isinstance(tok, CharTokenizer):
                    forced = 0
                    encode_char(texts, n_train, tok, sink, changed_error, start)
                else:
                    forced = encode_bpe(texts, n_train, tok, sink, note, start)
                sink.finish()
            except BaseException:
                sink.abandon()
                raise
        if hasher.hexdigest() != src_hash:
            raise changed_error()
        seconds = time.perf_counter() - t0
        meta = {
            **head, "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
            "dtype": dtype_for_vocab(tok.vocab_size).name,
            "train_tokens": sink.count("train"), "val_tokens": sink.count("val"),
            "shards": {"train": sink.files("train"), "val": sink.files("val")}, "shard_tokens": shard_tokens,
            "source": {"path": src.abspath, "files": len(src.files), "bytes": src.nbytes, "chars": n_chars,
                       "sha256": src_hash, "encoding_errors": errors, **more},
            "split": {"val_fraction": vf, "by": "characters", "train_chars": n_train, "val_chars": n_chars - n_train},
            "forced_bpe_cuts": forced, "seconds": round(seconds, 3),
        }
        if not publish(tmp, final, meta):  # another process finished first: the caller reads its (identical) result
            return None
    note(f"prepared {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens in {seconds:.1f} s "
         f"({src.nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s of files read)")
    return Prepared(final, meta, tok)


