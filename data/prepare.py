"""Text -> train.bin / val.bin / meta.json, streamed, cached and atomic. Also `python -m data.prepare`.

Design:
- Cache: prepared data lives in `cache_dir()/prepared/<name>-<tokenizer>-<key>/`, key = hash of (source content
  sha256, tokenizer, val_fraction, encoding_errors, format version). A call first hashes the source in 1 MiB
  blocks (about 1 GB/s) and returns at once when that directory exists and its headers check out, so a second
  run starts immediately; a damaged cached copy is noted and prepared again.
- Source: one file, or every `*.txt` under a directory (recursively, sorted by relative path, concatenated
  byte for byte). Bytes are decoded as UTF-8 exactly (no newline translation); `encoding_errors` other than
  "strict" opt in to lossy decoding. Bad bytes under "strict" -> ValueError naming the file and byte offset.
- Split: by CHARACTER position, computed before encoding: the first int(n_chars * (1 - val_fraction))
  characters are train, the rest val (for char-level this is exactly nanoGPT's split), and each part is
  encoded on its own as nanoGPT does.
- Streaming with bounded memory: pass 0 hashes, pass 1 decodes in CHUNK_BYTES blocks to count characters
  (and, for char-level, collect the vocabulary via a code-point bitmap), pass 2 decodes again and encodes.
  Char-level encodes with a numpy code point -> id lookup table. GPT-2 BPE cuts the text into SEGMENT_CHARS
  pieces at boundaries where GPT-2's pre-tokenizer always splits (see `find_safe_cut`), so the ids equal
  encoding the whole text at once, and encodes the pieces on a thread pool with tiktoken (its Rust encoder
  releases the GIL), in order, a bounded number in flight. Memory stays at a few tens of MB whatever the
  file size. A tqdm bar (stderr) shows MB/s.
- Atomic: everything is written into `prepared/.tmp-<random>/` (with an `.owner` file naming host and pid),
  fsynced, then renamed to the final name; an interrupted run leaves only a `.tmp-*` directory that no run
  trusts and that the next run removes once its owner process is gone. If two processes (e.g. DDP ranks)
  prepare at once, the first rename wins and the other uses it.
- Output: `train.bin`, `val.bin` (format in data/loader.py: header with magic, version, dtype, count; uint16
  when the vocabulary fits, else uint32) and `meta.json` (tokenizer dict, counts, source hash, split). No pickle.
"""
from __future__ import annotations

import argparse
import codecs
import collections
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from data import sources
from data.config import DataConfig
from data.loader import TokenFile, TokenWriter, dtype_for_vocab
from data.tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer, tokenizer_from_dict

FORMAT_VERSION = 1
CHUNK_BYTES = 4 << 20          # bytes read and decoded at a time
SEGMENT_CHARS = 1 << 19        # characters per BPE work item
MAX_CARRY_CHARS = 32 << 20     # if no safe BPE boundary shows up in this much text, cut anyway (noted)
HASH_BLOCK = 1 << 20


@dataclass
class Prepared:
    dir: Path
    meta: dict
    train_path: Path
    val_path: Path
    tokenizer: Tokenizer
    cached: bool = field(default=False, compare=False)
    # the source this call read (absolute); meta.json's source.path names the first one prepared with this
    # content, which may be another copy (the cache is keyed by content)
    source: str | None = field(default=None, compare=False)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def train_tokens(self) -> int:
        return int(self.meta["train_tokens"])

    @property
    def val_tokens(self) -> int:
        return int(self.meta["val_tokens"])


# ---------------------------------------------------------------------------------------------- sources
@dataclass
class _Source:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory (part of the hash), else None
    display: str   # as the user gave it (messages)
    abspath: str   # absolute (meta.json)
    nbytes: int


def _resolve_source(cfg: DataConfig) -> _Source:
    if cfg.path:
        p = Path(os.path.expanduser(str(cfg.path)))
        if not p.exists():
            raise FileNotFoundError(f"data.path={cfg.path} does not exist (looked at {p.absolute()}): give an "
                                    f"existing text file or a directory of .txt files")
        if p.is_dir():
            files = sorted((f for f in p.rglob("*.txt") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
            if not files:
                raise ValueError(f"directory {p} has no .txt files: put your text in files ending in .txt, or "
                                 f"point data.path at a single file")
            names = [f.relative_to(p).as_posix() for f in files]
        else:
            files, names = [p], None
        display, abspath = str(p), str(p.absolute())
    else:  # the Shakespeare presets without a local copy: cache / download
        path = sources.shakespeare_path()
        files, names, display, abspath = [path], None, str(path), str(path.absolute())
    nbytes = sum(f.stat().st_size for f in files)
    if nbytes == 0:
        what = f"all {len(files)} .txt files in {display} are empty" if names else f"{display} is empty"
        raise ValueError(f"{what}: give a text file with some content")
    return _Source(files, names, display, abspath, nbytes)


def _file_header(src: _Source, i: int) -> bytes:
    if src.names is None:
        return b""
    return f"{src.names[i]}\0{src.files[i].stat().st_size}\0".encode()


def source_sha256(src: _Source) -> str:
    """sha256 of the content (for one file: exactly `sha256sum file`; for a directory: names, sizes, contents)."""
    h = hashlib.sha256()
    for i, f in enumerate(src.files):
        h.update(_file_header(src, i))
        with open(f, "rb") as fh:
            while block := fh.read(HASH_BLOCK):
                h.update(block)
    return h.hexdigest()


def _read_text(src: _Source, errors: str, chunk_bytes: int, hasher=None, bar=None) -> Iterator[str]:
    """Decode the source in chunks (each file on its own); UTF-8 errors -> ValueError with file + offset."""
    for i, path in enumerate(src.files):
        if hasher is not None:
            hasher.update(_file_header(src, i))
        dec = codecs.getincrementaldecoder("utf-8")(errors=errors)
        offset = 0
        with open(path, "rb") as f:
            while True:
                block = f.read(chunk_bytes)
                final = not block
                pending = len(dec.getstate()[0])
                try:
                    text = dec.decode(block, final=final)
                except UnicodeDecodeError as e:
                    pos = offset - pending + e.start
                    bad = e.object[e.start:e.start + 1]
                    what = f"byte 0x{bad.hex()}" if bad else "an incomplete character at the end"
                    raise ValueError(f"{path} is not valid UTF-8: {what} at byte offset {pos:,} ({e.reason}): "
                                     f"re-save the file as UTF-8, or set data.encoding_errors=replace to turn "
                                     f"undecodable bytes into U+FFFD") from None
                offset += len(block)
                if hasher is not None:
                    hasher.update(block)
                if bar is not None:
                    bar.update(len(block))
                if text:
                    yield text
                if final:
                    break


def _scan(src: _Source, errors: str, want_vocab: bool) -> tuple[int, list[str]]:
    """Pass 1: number of characters and (char-level) the sorted set of characters."""
    n = 0
    seen = np.zeros(0x110000, dtype=bool) if want_vocab else None
    for text in _read_text(src, errors, CHUNK_BYTES):
        n += len(text)
        if seen is not None:
            for part in _blocks(text):
                seen[np.frombuffer(part.encode("utf-32-le"), dtype="<u4")] = True
    chars = [chr(c) for c in np.flatnonzero(seen)] if seen is not None else []
    return n, chars


# --------------------------------------------------------------------------------------- safe BPE cuts
def _ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def find_safe_cut(text: str, lo: int, hi: int) -> int:
    """Largest c in [lo, hi] such that GPT-2 encodes text[:c] + text[c:] as it encodes text; -1 if none found.

    GPT-2's pre-tokenizer regex splits text into pieces and BPE never merges across pieces, so cutting where
    the regex always ends a piece changes nothing. The cuts used (with their neighbours; c must be < len):
      1. after "\\n" with ASCII letters/digits on both sides ("a\\n|b"): a lone newline is its own piece;
      2. before " " with ASCII letters/digits on both sides ("a| b"): the space starts the next word's piece;
      3. between punctuation/symbol (not the apostrophe) and a letter ("。|你"), for text without spaces.
    The regex has no lookbehind and its only lookahead reads one character, which these cuts keep intact.
    """
    n = len(text)
    lo, hi = max(lo, 1), min(hi, n - 1)
    if lo > hi:
        return -1
    j = text.rfind("\n", lo - 1, hi)  # cut = j + 1 in [lo, hi]
    while j >= 1:
        if _ascii_alnum(text[j - 1]) and _ascii_alnum(text[j + 1]):
            return j + 1
        j = text.rfind("\n", lo - 1, j)
    j = text.rfind(" ", lo, min(hi + 1, n - 1))  # cut = j in [lo, hi], j + 1 < n
    while j >= 1:
        if _ascii_alnum(text[j - 1]) and _ascii_alnum(text[j + 1]):
            return j
        j = text.rfind(" ", lo, j)
    category = unicodedata.category
    for c in range(hi, max(lo, hi - 65536) - 1, -1):
        a = text[c - 1]
        if a != "'" and category(a)[0] in "PS" and category(text[c])[0] == "L":
            return c
    return -1


class _Cutter:
    """Cuts a stream of text into BPE work items at safe boundaries; the train/val split is a hard cut."""

    def __init__(self, seg_chars: int, max_carry: int, note):
        self.seg, self.max_carry, self.note = seg_chars, max_carry, note
        self.forced = 0

    def pieces(self, buf: str, final: bool) -> tuple[list[str], str]:
        out, start, n = [], 0, len(buf)
        while n - start > self.seg:
            cut = find_safe_cut(buf, start + self.seg // 2, start + self.seg)
            if cut < 0:
                cut = find_safe_cut(buf, start + self.seg + 1, n - 1)
            if cut < 0:
                if final:
                    break
                if n - start <= self.max_carry:
                    return out, buf[start:]  # wait for more text
                cut = start + self.seg
                self.forced += 1
                if self.forced == 1:
                    self.note(f"note: no GPT-2 piece boundary in {self.max_carry:,} characters; cutting there "
                              f"anyway (tokens at such cuts may differ from encoding the text in one go)")
            out.append(buf[start:cut])
            start = cut
        if final:
            if start < n:
                out.append(buf[start:])
            return out, ""
        return out, buf[start:]


def _split_stream(texts: Iterator[str], n_train: int) -> Iterator[tuple[str, str, bool]]:
    """(split, text, last_of_split) with the train part ending exactly at character n_train."""
    remaining = n_train
    for text in texts:
        if remaining > 0:
            head = text[:remaining]
            remaining -= len(head)
            yield "train", head, remaining == 0
            text = text[len(head):]
        if text:
            yield "val", text, False
    yield "val", "", True


# ----------------------------------------------------------------------------------------------- encoders
def _threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


def _bpe_encode_fn(tok: GPT2Tokenizer):
    enc = tok.enc
    if hasattr(enc, "encode_to_numpy"):  # no Python int list; same ids as encode_ordinary (no specials)
        return lambda s: enc.encode_to_numpy(s, allowed_special=set(), disallowed_special=())
    return lambda s: np.asarray(enc.encode_ordinary(s), dtype=np.uint32)


def _blocks(text: str, size: int = 1 << 18) -> Iterator[str]:
    """Slices of at most `size` characters (keeps the 4-byte-per-character temporaries small)."""
    for i in range(0, len(text), size):
        yield text[i:i + size]


def _encode_char(texts, n_train, tok: CharTokenizer, writers, changed_error):
    table = tok.code_table().astype(np.int32)
    dtype = writers["train"].dtype
    for split, text, _ in _split_stream(texts, n_train):
        for part in _blocks(text):
            cps = np.frombuffer(part.encode("utf-32-le"), dtype="<u4")
            try:
                ids = table[cps]
            except IndexError:
                raise changed_error() from None
            if ids.min() < 0:
                raise changed_error()
            writers[split].write(ids.astype(dtype))


def _encode_bpe(texts, n_train, tok: GPT2Tokenizer, writers, note):
    encode = _bpe_encode_fn(tok)
    threads = _threads()
    cutter = _Cutter(SEGMENT_CHARS, MAX_CARRY_CHARS, note)
    inflight: collections.deque = collections.deque()
    max_inflight = 2 * threads
    with ThreadPoolExecutor(threads, thread_name_prefix="bpe") as pool:
        def drain(limit):
            while len(inflight) > limit:
                split, fut = inflight.popleft()
                writers[split].write(fut.result())

        buf, cur = "", "train"
        for split, text, last in _split_stream(texts, n_train):
            if split != cur:  # the train part has been flushed (last=True) before val starts
                cur, buf = split, ""
            pieces, buf = cutter.pieces(buf + text, final=last)
            for p in pieces:
                inflight.append((split, pool.submit(encode, p)))
                drain(max_inflight)
        drain(0)
    return cutter.forced


# --------------------------------------------------------------------------------------- cache handling
def _prepared_root() -> Path:
    return sources.cache_dir() / "prepared"


def cache_key(source_hash: str, tokenizer: str, val_fraction: float, encoding_errors: str) -> str:
    blob = json.dumps({"format": FORMAT_VERSION, "source": source_hash, "tokenizer": tokenizer,
                       "val_fraction": float(val_fraction), "encoding_errors": encoding_errors}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_prepared(directory: str | os.PathLike, *, expect_key: str | None = None) -> Prepared:
    """Open a prepared directory, checking meta.json and both token-file headers (ValueError if damaged)."""
    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{d / 'meta.json'} is missing or not valid JSON ({type(e).__name__}): delete {d} and "
                         f"prepare again") from None
    if meta.get("format") != "tinygpt-prepared" or meta.get("version") != FORMAT_VERSION:
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
    tok = tokenizer_from_dict(meta["tokenizer"])
    return Prepared(d, meta, train.path, val.path, tok)


def _owner_alive(tmp: Path) -> bool:
    try:
        host, pid = (tmp / ".owner").read_text().split()
        pid = int(pid)
    except (OSError, ValueError):
        return time.time() - tmp.stat().st_mtime < 24 * 3600  # unknown owner: keep for a day
    if host != socket.gethostname():
        return True  # another machine on a shared file system: not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(root: Path) -> None:
    for tmp in root.glob(".tmp-*"):
        try:
            if tmp.is_dir() and not _owner_alive(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


# ------------------------------------------------------------------------------------------------ prepare
def prepare(cfg: DataConfig, *, progress: bool = True, log: Callable[[str], None] | None = None) -> Prepared:
    """Prepared token files for `cfg`, from the cache when possible (see the module docstring).

    With `progress`: a bar on stderr and one-line notes (preparing ..., prepared ...), printed on stderr or
    handed to `log` (training passes its logger, so the notes also land in the run's train.log)."""
    cfg = DataConfig.coerce(cfg)
    tok_kind = cfg.validate()
    src = _resolve_source(cfg)

    def note(msg: str) -> None:
        if not progress:
            return
        if log is not None:
            log(msg)
        else:
            print(msg, file=sys.stderr, flush=True)

    p = _prepare(cfg, tok_kind, src, progress, note)
    p.source = src.abspath
    return p


def _prepare(cfg: DataConfig, tok_kind: str, src: _Source, progress: bool, note: Callable[[str], None]) -> Prepared:
    errors = cfg.encoding_errors
    vf = float(cfg.val_fraction)
    src_hash = source_sha256(src)
    key = cache_key(src_hash, tok_kind, vf, errors)
    root = _prepared_root()
    final = root / f"{cfg.name}-{tok_kind}-{key}"
    if final.is_dir():
        try:
            p = load_prepared(final, expect_key=key)
            p.cached = True
            return p
        except ValueError as e:
            note(f"note: the prepared data in {final} is damaged ({e}); preparing it again")
            shutil.rmtree(final, ignore_errors=True)

    t0 = time.perf_counter()
    tok: Tokenizer | None = GPT2Tokenizer() if tok_kind == "gpt2" else None  # fails early if ranks missing
    n_chars, chars = _scan(src, errors, want_vocab=tok is None)
    if n_chars == 0:
        raise ValueError(f"{src.display} has no text left after decoding with data.encoding_errors={errors}: "
                         f"give a text file with some content")
    if tok is None:
        tok = CharTokenizer(chars)
    n_train = int(n_chars * (1.0 - vf))
    note(f"preparing {cfg.name} ({src.nbytes / 1e6:,.1f} MB, {tok.describe()}) from {src.display} into {final}")

    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    tmp = root / f".tmp-{os.urandom(6).hex()}"
    tmp.mkdir()
    try:
        (tmp / ".owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
        hasher = hashlib.sha256()

        def changed_error():
            return ValueError(f"{src.display} changed while it was being prepared: run again once it is stable")

        from tqdm import tqdm
        with tqdm(total=src.nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc=f"prepare {cfg.name}",
                  file=sys.stderr, disable=None if progress else True, leave=False) as bar, \
                TokenWriter(tmp / "train.bin", tok.vocab_size) as w_train, \
                TokenWriter(tmp / "val.bin", tok.vocab_size) as w_val:
            writers = {"train": w_train, "val": w_val}
            texts = _read_text(src, errors, CHUNK_BYTES, hasher=hasher, bar=bar)
            forced = 0
            if isinstance(tok, CharTokenizer):
                _encode_char(texts, n_train, tok, writers, changed_error)
            else:
                forced = _encode_bpe(texts, n_train, tok, writers, note)
        if hasher.hexdigest() != src_hash:
            raise changed_error()
        seconds = time.perf_counter() - t0
        meta = {
            "format": "tinygpt-prepared", "version": FORMAT_VERSION, "key": key, "name": cfg.name,
            "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
            "dtype": dtype_for_vocab(tok.vocab_size).name,
            "train_tokens": w_train.count, "val_tokens": w_val.count,
            "source": {"path": src.abspath, "files": len(src.files), "bytes": src.nbytes, "chars": n_chars,
                       "sha256": src_hash, "encoding_errors": errors},
            "split": {"val_fraction": vf, "by": "characters", "train_chars": n_train, "val_chars": n_chars - n_train},
            "forced_bpe_cuts": forced, "seconds": round(seconds, 3),
        }
        with open(tmp / "meta.json", "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2, ensure_ascii=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        (tmp / ".owner").unlink()
        sources.fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: use its (identical) result
            return load_prepared(final, expect_key=key)
        sources.fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    note(f"prepared {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens in {seconds:.1f} s "
         f"({src.nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s)")
    return Prepared(final, meta, final / "train.bin", final / "val.bin", tok)


# ---------------------------------------------------------------------------------------------------- CLI
_CLI_NAMES = {"data.path=": "--path ", "data.tokenizer=": "--tokenizer ", "data.val_fraction=": "--val-fraction ",
              "data.encoding_errors=": "--encoding-errors ", "data=": "--data "}


def _cli_message(msg: str) -> str:
    """One line, with the Hydra override names (data.path=...) spelled as this CLI's flags."""
    msg = " ".join(msg.split())
    return re.sub(r"(?<![\w./-])(data\.path=|data\.tokenizer=|data\.val_fraction=|data\.encoding_errors=|data=)",
                  lambda m: _CLI_NAMES[m.group(1)], msg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data.prepare",
        description="Tokenize a corpus into train.bin/val.bin in the tinygpt cache (training does this "
                    "automatically; this runs it on its own).")
    ap.add_argument("--data", default="shakespeare_char", help="shakespeare_char (default), shakespeare or text")
    ap.add_argument("--path", default=None, help="text file or directory of .txt files (required for --data text; "
                                                  "replaces the download for shakespeare*)")
    ap.add_argument("--tokenizer", default=None, help="char or gpt2 (for --data text; default char)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of the text kept for validation")
    ap.add_argument("--encoding-errors", default="strict",
                    help="strict (default), replace, ignore or backslashreplace for bytes that are not UTF-8")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    args = ap.parse_args(argv)
    tokenizer = args.tokenizer or ("gpt2" if args.data == "shakespeare" else "char")
    cfg = DataConfig(name=args.data, path=args.path, tokenizer=tokenizer, val_fraction=args.val_fraction,
                     encoding_errors=args.encoding_errors)
    try:
        p = prepare(cfg, progress=not args.quiet)
    except (ValueError, OSError) as e:
        print(f"error: {_cli_message(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (nothing half-written is kept)", file=sys.stderr)
        return 130
    m = p.meta
    print(f"{m['name']}: {p.tokenizer.describe()}, {m['source']['bytes']:,} bytes from {p.source}"
          f"{' (already prepared)' if p.cached else ''}")
    print(f"  {p.train_path}  {m['train_tokens']:,} tokens")
    print(f"  {p.val_path}  {m['val_tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
