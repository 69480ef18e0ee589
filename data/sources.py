"""The downloads: Tiny Shakespeare and the GPT-2 BPE ranks, each with one fixed place in `$TINYGPT_CACHE`
(`~/.cache/tinygpt` on Linux), looked at first, so an offline machine works once `python -m data.sources` has filled
a cache elsewhere and it is copied there. Your own corpus files are named and hashed by data/config.py.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import functools
import hashlib
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from common.cli import one_line, setting_error
from common.files import SHAKESPEARE_FILE, atomic_write, cache_dir

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

def shakespeare_cache_path() -> Path:
    return cache_dir() / SHAKESPEARE_FILE


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
        if dest.stat().st_size != SHAKESPEARE_SIZE or hashlib.sha256(dest.read_bytes()).hexdigest() != SHAKESPEARE_SHA256:
            raise not_shakespeare(dest)
        return dest
    try:
        download(SHAKESPEARE_URL, dest, size=SHAKESPEARE_SIZE, sha256=SHAKESPEARE_SHA256)
    except OSError as e:  # URLError, timeouts, refused connections, unwritable cache ...
        raise setting_error(
            "Tiny Shakespeare is not at {0} and could not be downloaded from {1} ({2}): copy the file to exactly {0} "
            "(or set TINYGPT_CACHE to a directory that has tinyshakespeare/input.txt), or pass {path=}<your copy>",
            dest, SHAKESPEARE_URL, one_line(getattr(e, 'reason', None) or e), cls=FileNotFoundError) from None
    return dest


def not_shakespeare(dest: Path) -> ValueError:
    return setting_error("{0}: delete it so it is downloaded again, or train on your own file with {name=}text "
                         "{path=}<file>", f"{dest} is not Tiny Shakespeare ({dest.stat().st_size:,} bytes; expected "
                         f"{SHAKESPEARE_SIZE:,} bytes with sha256 {SHAKESPEARE_SHA256[:12]}...)")


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
