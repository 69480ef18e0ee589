"""Where the raw data lives: the cache directory, Tiny Shakespeare and the GPT-2 BPE ranks.

Design: every file the project could download has ONE fixed place in the cache directory
(`$TINYGPT_CACHE`, default `~/.cache/tinygpt`), and that place is always looked at first, so a machine
without internet works once the files are copied there:

    $TINYGPT_CACHE/tinyshakespeare/input.txt    Tiny Shakespeare (1,115,394 bytes, checked by size + sha256)
    $TINYGPT_CACHE/tokenizers/gpt2.tiktoken     GPT-2 BPE ranks in tiktoken format (base64 token, space, rank)

Downloads use urllib with a short timeout, write to a temporary file in the same directory, verify size
and sha256, then rename: an interrupted or corrupted download never leaves a file that a later run would
trust. When the network is unreachable the error is one line that names the exact path to put the file at.

The GPT-2 ranks are not downloaded here: `data.tokenizer.GPT2Tokenizer` asks tiktoken
(`tiktoken.get_encoding("gpt2")`, which downloads and caches by itself) and then writes the ranks to the
path above, so later runs work offline. `python -m data.sources` fetches both files into the cache (run it
on a machine with internet, then copy the cache directory to the offline machine).
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_SIZE = 1_115_394
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

# What tiktoken itself downloads for its "gpt2" encoding (data-gym format, converted by tiktoken).
GPT2_SOURCE_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)

DOWNLOAD_TIMEOUT_S = 15.0
_READ_BLOCK = 1 << 20


def cache_dir() -> Path:
    """`$TINYGPT_CACHE` if set (and non-empty), else `~/.cache/tinygpt`. Not created here."""
    env = os.environ.get("TINYGPT_CACHE")
    return Path(env).expanduser() if env else Path("~/.cache/tinygpt").expanduser()


def shakespeare_cache_path() -> Path:
    """Where Tiny Shakespeare is looked for (and downloaded to)."""
    return cache_dir() / "tinyshakespeare" / "input.txt"


def gpt2_ranks_cache_path() -> Path:
    """Where the GPT-2 BPE ranks file (tiktoken format) is looked for."""
    return cache_dir() / "tokenizers" / "gpt2.tiktoken"


def gpt2_ranks_path() -> Path | None:
    """The local GPT-2 ranks file if present, else None."""
    p = gpt2_ranks_cache_path()
    return p if p.is_file() else None


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (best effort: some platforms cannot open directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            h.update(block)
    return h.hexdigest()


def _check_shakespeare(path: Path) -> None:
    size = path.stat().st_size
    if size != SHAKESPEARE_SIZE or sha256_file(path) != SHAKESPEARE_SHA256:
        raise ValueError(
            f"{path} is not Tiny Shakespeare ({size:,} bytes; expected {SHAKESPEARE_SIZE:,} bytes with sha256 "
            f"{SHAKESPEARE_SHA256[:12]}...): delete it so it is downloaded again, or train on your own file "
            f"with data=text data.path=<file>")


def shakespeare_path() -> Path:
    """Tiny Shakespeare in the cache, downloading (and verifying) it the first time.

    Raises FileNotFoundError (one line naming the exact path) when it is absent and cannot be downloaded,
    ValueError when the cached file is not Tiny Shakespeare.
    """
    dest = shakespeare_cache_path()
    if dest.is_file():
        _check_shakespeare(dest)
        return dest
    try:
        download(SHAKESPEARE_URL, dest, size=SHAKESPEARE_SIZE, sha256=SHAKESPEARE_SHA256)
    except OSError as e:  # URLError, timeouts, refused connections, unwritable cache ...
        raise FileNotFoundError(
            f"Tiny Shakespeare is not at {dest} and could not be downloaded from {SHAKESPEARE_URL} "
            f"({_reason(e)}): copy the file to exactly {dest} (or set TINYGPT_CACHE to a directory that has "
            f"tinyshakespeare/input.txt), or pass data.path=<your copy>") from None
    return dest


def _reason(e: BaseException) -> str:
    r = getattr(e, "reason", None) or e
    return " ".join(str(r).split()) or type(e).__name__


def download(url: str, dest: Path, *, size: int | None = None, sha256: str | None = None,
             timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download `url` to `dest` atomically (temp file in the same directory, verify, rename).

    Network problems raise OSError (urllib.error.URLError is one); a wrong size or checksum raises ValueError.
    Nothing is left at `dest` (or beside it) unless the download was complete and verified.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        h = hashlib.sha256()
        n = 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            while block := resp.read(_READ_BLOCK):
                out.write(block)
                h.update(block)
                n += len(block)
            out.flush()
            os.fsync(out.fileno())
        if size is not None and n != size:
            raise ValueError(f"download of {url} is incomplete or wrong ({n:,} bytes, expected {size:,}): "
                             f"try again, or copy the file to {dest} by hand")
        if sha256 is not None and h.hexdigest() != sha256:
            raise ValueError(f"download of {url} has the wrong sha256 ({h.hexdigest()[:12]}..., expected "
                             f"{sha256[:12]}...): try again, or copy the file to {dest} by hand")
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return dest


def main(argv: list[str] | None = None) -> int:
    """`python -m data.sources`: fetch Tiny Shakespeare and the GPT-2 ranks into the cache, print where."""
    import argparse
    argparse.ArgumentParser(  # no options: --help (and any stray argument) must not start a download
        prog="python -m data.sources",
        description=f"Fetch Tiny Shakespeare and the GPT-2 BPE ranks into the cache ({cache_dir()}; set "
                    f"TINYGPT_CACHE to change it) unless they are there already, and print where they are. "
                    f"Run it on a machine with internet, then copy the cache directory to an offline one.",
    ).parse_args(argv)
    failed = False
    try:
        print(f"Tiny Shakespeare: {shakespeare_path()}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        failed = True
    try:
        from data.tokenizer import GPT2Tokenizer
        GPT2Tokenizer()
        print(f"GPT-2 BPE ranks:  {gpt2_ranks_cache_path()}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        failed = True
    if failed:
        return 2
    print(f"cache: {cache_dir()} (copy this directory to an offline machine, or point TINYGPT_CACHE at it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
