"""Where the raw data lives: the cache directory, Tiny Shakespeare, the GPT-2 BPE ranks, and your corpus files
(`resolve`: which files; `sha256`: their content hash, the base of the prepared-data cache key).

Every downloadable file has one fixed place in `$TINYGPT_CACHE` (default `~/.cache/tinygpt`), looked at first,
so an offline machine works once `python -m data.sources` has filled a cache elsewhere and it is copied there.
Reading the files' text lives in data/corpus.py; this module only names them and hashes their bytes.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import collections
import functools
import hashlib
import os
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import atomic_write
from common.text import one_line, setting_error
from data import cache_dir

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SIZE = 1_115_394
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DOWNLOAD_TIMEOUT_S = 15.0
TIKTOKEN_TIMEOUT_S = 30.0
BLOCK = 1 << 20  # bytes read at a time to download or hash

GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
GPT2_EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257

COLUMNAR = (".parquet", ".arrow")  # parquet files and `datasets` save_to_disk Arrow files: data/columnar.py
SUFFIXES = (".txt", ".jsonl", *COLUMNAR)  # what a directory contributes


def shakespeare_cache_path() -> Path:
    return cache_dir() / "tinyshakespeare" / "input.txt"


def gpt2_ranks_cache_path() -> Path:
    """Where the GPT-2 BPE ranks file (tiktoken format) is looked for."""
    return cache_dir() / "tokenizers" / "gpt2.tiktoken"


def gpt2_ranks_path() -> Path | None:
    """The local GPT-2 ranks file if present, else None."""
    p = gpt2_ranks_cache_path()
    return p if p.is_file() else None


# ------------------------------------------------------------------------------------------ Tiny Shakespeare
def shakespeare_path() -> Path:
    """Tiny Shakespeare in the cache, downloaded (and verified) the first time."""
    dest = shakespeare_cache_path()
    if dest.is_file():
        size = dest.stat().st_size
        if size != SHAKESPEARE_SIZE or hashlib.sha256(dest.read_bytes()).hexdigest() != SHAKESPEARE_SHA256:
            raise setting_error(
                "{0}: delete it so it is downloaded again, or train on your own file with {name=}text {path=}<file>",
                f"{dest} is not Tiny Shakespeare ({size:,} bytes; expected {SHAKESPEARE_SIZE:,} bytes with sha256 "
                f"{SHAKESPEARE_SHA256[:12]}...)")
        return dest
    try:
        download(SHAKESPEARE_URL, dest, size=SHAKESPEARE_SIZE, sha256=SHAKESPEARE_SHA256)
    except OSError as e:  # URLError, timeouts, refused connections, unwritable cache ...
        raise setting_error(
            "Tiny Shakespeare is not at {0} and could not be downloaded from {1} ({2}): copy the file to exactly {0} "
            "(or set TINYGPT_CACHE to a directory that has tinyshakespeare/input.txt), or pass {path=}<your copy>",
            dest, SHAKESPEARE_URL, one_line(getattr(e, 'reason', None) or e), cls=FileNotFoundError) from None
    return dest


def download(url: str, dest: Path, *, size: int, sha256: str) -> Path:
    """Download `url` to `dest`, verified, atomically; OSError for network problems, ValueError for wrong bytes."""
    h, n = hashlib.sha256(), 0
    with atomic_write(dest) as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
        while block := resp.read(BLOCK):
            out.write(block)
            h.update(block)
            n += len(block)
        if n != size:
            raise ValueError(f"download of {url} is incomplete or wrong ({n:,} bytes, expected {size:,}): "
                             f"try again, or copy the file to {dest} by hand")
        if h.hexdigest() != sha256:
            raise ValueError(f"download of {url} has the wrong sha256 ({h.hexdigest()[:12]}..., expected "
                             f"{sha256[:12]}...): try again, or copy the file to {dest} by hand")
    return Path(dest)


# -------------------------------------------------------------------------------------------- GPT-2 ranks
def _missing_ranks_error(reason: str) -> FileNotFoundError:
    dest = gpt2_ranks_cache_path()
    return FileNotFoundError(
        f"GPT-2 BPE ranks are not at {dest} and tiktoken could not fetch them ({reason}): put a tiktoken-format "
        f"gpt2 ranks file at exactly {dest} (make one on a machine with internet with `python -m data.sources`, "
        f"which writes it to that machine's cache, then copy it)")


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken-format ranks file (`<base64 token> <rank>` per line)."""
    ranks: dict[bytes, int] = {}
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    tok, rank = line.split()
                    ranks[base64.b64decode(tok, validate=True)] = int(rank)
    except (ValueError, binascii.Error):
        raise ValueError(f"{path} is not a tiktoken ranks file (line {lineno} is not '<base64> <rank>'): "
                         f"replace it with a GPT-2 ranks file in tiktoken format") from None
    if len(ranks) != GPT2_EOT_ID or ranks.get(b"Hello") != 15496:
        raise ValueError(f"{path} does not hold the GPT-2 BPE ranks ({len(ranks):,} entries, expected "
                         f"{GPT2_EOT_ID:,}): replace it with the GPT-2 ranks file in tiktoken format")
    return ranks


def _save_ranks(ranks: dict[bytes, int], dest: Path) -> None:  # best effort, so that later runs work offline
    try:
        with atomic_write(dest) as f:
            for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n")
    except OSError as e:
        print(f"note: could not save the GPT-2 ranks to {dest} ({e}); offline runs will need it", file=sys.stderr)


def _tiktoken_gpt2():
    """tiktoken.get_encoding("gpt2") with a time limit (tiktoken's own download has none)."""
    import tiktoken
    box: dict[str, Any] = {}

    def work():
        try:
            box["enc"] = tiktoken.get_encoding("gpt2")
        except BaseException as e:  # noqa: BLE001 - reported below as one line
            box["err"] = e

    t = threading.Thread(target=work, daemon=True, name="tiktoken-gpt2")
    t.start()
    t.join(TIKTOKEN_TIMEOUT_S)
    if "enc" in box:
        return box["enc"]
    if "err" in box:
        msg = one_line(str(box["err"]))
        raise _missing_ranks_error(f"{type(box['err']).__name__}: {msg[:120]}{'...' if len(msg) > 120 else ''}")
    raise _missing_ranks_error(f"no answer within {TIKTOKEN_TIMEOUT_S:.0f} s")


@functools.lru_cache(maxsize=4)
def _encoding_from(path: str, size: int, mtime_ns: int):  # keyed by size and mtime: a replaced file is re-read
    import tiktoken
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT_STR, mergeable_ranks=load_ranks(Path(path)),
                             special_tokens={GPT2_EOT: GPT2_EOT_ID}, explicit_n_vocab=GPT2_VOCAB_SIZE)


def gpt2_encoding():
    """tiktoken's GPT-2 encoding: from the cached ranks file, else from tiktoken (whose ranks are then cached)."""
    path = gpt2_ranks_path()
    if path is not None:
        st = path.stat()
        return _encoding_from(str(path.resolve()), st.st_size, st.st_mtime_ns)
    enc = _tiktoken_gpt2()
    ranks = getattr(enc, "_mergeable_ranks", None)
    if isinstance(ranks, dict) and len(ranks) == GPT2_EOT_ID:
        _save_ranks(ranks, gpt2_ranks_cache_path())
    return enc


def gpt2_ranks() -> dict[bytes, int]:
    """The GPT-2 BPE ranks (token bytes -> id), found or fetched as `gpt2_encoding()` does."""
    path = gpt2_ranks_path()
    if path is None:
        enc = gpt2_encoding()  # fetched by tiktoken, and saved where gpt2_ranks_path() looks when it can be
        path = gpt2_ranks_path()
        if path is None:
            return dict(enc._mergeable_ranks)  # tiktoken's private table: only when the file could not be saved
    return load_ranks(path)


# ---------------------------------------------------------------------------------------- your corpus files
@dataclass
class Corpus:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory or a list (part of the hash), else None
    display: str  # as the user gave it (messages)
    abspath: str  # absolute (meta.json)
    nbytes: int
    given: str | None  # the path setting as given, for messages ("a.txt", "[a.txt,b.txt]"); None: the download
    text_key: str  # the field of a .jsonl line, or the column of a parquet / Arrow file, that holds the text
    digest: str | None = None  # `sha256()` when known already (the download, checked): no second read

    @property
    def keyed(self) -> bool:  # whether `text_key` picks the text (part of the cache key then)
        return any(f.suffix in (".jsonl", ".json", ".csv", *COLUMNAR) for f in self.files)

    @property
    def documents(self) -> bool:  # whether the text can hold more than one document
        return len(self.files) > 1 or self.keyed


def _expand(given: str) -> tuple[list[Path], list[str] | None]:
    """One `path` entry: a file; a `datasets` save_to_disk directory (its Arrow files); or every .txt, .jsonl,
    .parquet and .arrow file under a directory, sorted by relative path (other files are left out)."""
    p = Path(os.path.expanduser(given))
    if not p.exists():
        raise setting_error("{path=}{0} does not exist (looked at {1}): give an existing text file or a directory "
                            "of .txt, .jsonl or .parquet files", given, p.absolute(), cls=FileNotFoundError)
    if not p.is_dir():
        return [p], None
    from data.columnar import saved_dataset  # pyarrow-free, but only a directory needs it
    files = saved_dataset(p)
    if files is None:
        found = [f for f in p.rglob("*") if f.is_file()]
        groups = {}  # a saved dataset below `p` contributes its own files (a DatasetDict: its train split)
        for d in sorted({f.parent for f in found if f.name in ("state.json", "dataset_dict.json")}, key=lambda d: len(d.parts)):
            if not any(r in d.parents for r in groups):
                groups[d] = saved_dataset(d)
        groups.update({f: [f] for f in found if f.suffix in SUFFIXES and not any(r in f.parents for r in groups)})
        files = [f for _, fs in sorted(groups.items(), key=lambda kv: kv[0].relative_to(p).as_posix()) for f in fs]
        if not files:
            kinds = collections.Counter(f.suffix or "(no suffix)" for f in found)
            has = ", ".join(f"{n} {k}" for k, n in kinds.most_common(6)) or "no files"
            raise setting_error("directory {0} has no .txt files (nor .jsonl, .parquet or a datasets save_to_disk "
                                "directory; it has {1}): convert your text to one of these, or point {path} at a "
                                "single text file", p, has)
    return files, [f.relative_to(p).as_posix() for f in files]


def resolve(cfg) -> Corpus:
    """`path` (one or several files or directories), else Tiny Shakespeare (cached or downloaded)."""
    given = cfg.paths()
    if len(given) == 1:
        files, names = _expand(given[0])
        p = Path(os.path.expanduser(given[0]))
        display, abspath, shown = str(p), str(p.absolute()), given[0]
    elif given:  # several: their files in order, each name prefixed by its entry's position
        files, names = [], []
        for i, g in enumerate(given):
            f, n = _expand(g)
            files += f
            names += [f"{i}:{x}" for x in (n or [f[0].name])]
        display, shown = ", ".join(given), f"[{','.join(given)}]"
        abspath = ", ".join(str(Path(os.path.expanduser(g)).absolute()) for g in given)
    else:  # the Shakespeare presets without a local copy: cache / download
        p = shakespeare_path()
        files, names, display, abspath, shown = [p], None, str(p), str(p.absolute()), None
    src = Corpus(files, names, display, abspath, sum(f.stat().st_size for f in files), shown, cfg.text_key,
                 None if given else SHAKESPEARE_SHA256)
    if not any([_has_text(src, f) for f in files]):  # a list: every columnar file is checked
        what = f"all {len(files)} files of {display} are empty" if names else f"{display} is empty"
        rows = " (no rows)" if all(f.suffix in COLUMNAR for f in files) else ""
        raise ValueError(f"{what}{rows}: give a text file with some content")
    return src


def _has_text(src: Corpus, path: Path) -> bool:
    """Whether the file holds anything; a parquet / Arrow file's text column is checked (one line if wrong)."""
    if path.suffix not in COLUMNAR:
        return path.stat().st_size > 0
    from data.columnar import check
    with open_file(src, path) as f:
        return check(f, path, src.text_key)


def open_file(src: Corpus, path: Path):
    try:
        return open(path, "rb")
    except OSError as e:
        denied = isinstance(e, PermissionError)
        where = "" if str(path) == src.display else f": {path}"
        shown = "{0}" if src.given is None else "{path=}{0}"
        raise setting_error(shown + " cannot be read ({1}): {2} or give another file", src.given or src.display,
                            f"{'permission denied' if denied else e.strerror or e}{where}",
                            "check its permissions" if denied else "check the file", cls=type(e)) from None


def file_header(src: Corpus, i: int) -> bytes:
    """What the hash reads before file i of a directory or list: its name and size."""
    return b"" if src.names is None else f"{src.names[i]}\0{src.files[i].stat().st_size}\0".encode()


def hash_rest(f, hasher) -> None:
    while block := f.read(BLOCK):
        hasher.update(block)


def sha256(src: Corpus) -> str:
    """For one file exactly `sha256sum file`; for a directory, over names, sizes and contents (parquet and Arrow
    files too: their bytes, as for text)."""
    if src.digest is not None:
        return src.digest
    h = hashlib.sha256()
    for i, f in enumerate(src.files):
        h.update(file_header(src, i))
        with open_file(src, f) as fh:
            hash_rest(fh, h)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """`python -m data.sources`: fetch Tiny Shakespeare and the GPT-2 ranks into the cache, print where."""
    argparse.ArgumentParser(  # no options: --help (and any stray argument) must not start a download
        prog="python -m data.sources",
        description=f"Fetch Tiny Shakespeare and the GPT-2 BPE ranks into the cache ({cache_dir()}; set "
                    f"TINYGPT_CACHE to change it) unless they are there already, and print where they are. "
                    f"Run it on a machine with internet, then copy the cache directory to an offline one.",
    ).parse_args(argv)
    try:
        cache_dir(check=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = False
    for what, fetch, where in (("Tiny Shakespeare", shakespeare_path, shakespeare_cache_path),
                               ("GPT-2 BPE ranks", gpt2_encoding, gpt2_ranks_cache_path)):
        try:
            fetch()
            print(f"{what + ':':17} {where()}")
        except (ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            failed = True
    if failed:
        return 2
    print(f"cache: {cache_dir()} (copy this directory to an offline machine, or point TINYGPT_CACHE at it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
