"""Data: everything between a text file and a batch of token ids on the device.

Imports neither hydra, model/ nor training/: its errors name DataConfig's fields (path=...); callers rename them.
`cache_dir()` lives here, light to import, for code that needs only the cache's place (sample.py's font cache).
"""
import os
from pathlib import Path

SHAKESPEARE_FILE = "tinyshakespeare/input.txt"  # in the cache: data/sources.py downloads it there


def cache_dir(check: bool = False) -> Path:
    """`$TINYGPT_CACHE` if set (and non-empty), else `~/.cache/tinygpt`: where every download and prepared data set
    is kept. Not created here; `check`: a one-line ValueError when it is a file."""
    d = Path(os.environ.get("TINYGPT_CACHE") or "~/.cache/tinygpt").expanduser()
    if check and d.exists() and not d.is_dir():
        raise ValueError(f"the tinygpt cache {d} is a file, not a directory: set TINYGPT_CACHE to a directory "
                         f"(or move the file away)")
    return d
