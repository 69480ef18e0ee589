"""Data: everything between a text file and a batch of token ids on the device.

Imports neither hydra, model/ nor training/: its errors name DataConfig's fields (path=...); callers rename them.
`cache_dir()` lives here, light to import, for code that needs only the cache's place (sample.py's font cache).
"""
import os
from pathlib import Path


def cache_dir() -> Path:
    """`$TINYGPT_CACHE` if set (and non-empty), else `~/.cache/tinygpt`: where every download and prepared data set
    is kept. Not created here."""
    return Path(os.environ.get("TINYGPT_CACHE") or "~/.cache/tinygpt").expanduser()
