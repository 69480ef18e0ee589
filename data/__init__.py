"""Data: everything between a text file and a batch of token ids on the device.

- `data.config.DataConfig`   which corpus, tokenizer, split, decoding (reused as the Hydra `data` node)
- `data.sources`             cache directory, Tiny Shakespeare download, GPT-2 ranks location (offline-first)
- `data.tokenizer`           CharTokenizer, GPT2Tokenizer, tokenizer_from_dict, StreamDecoder
- `data.prepare`             prepare(cfg) -> Prepared: cached, streamed, atomic train.bin/val.bin/meta.json
- `data.loader`              TokenFile (checked memmap), BatchLoader (global-batch deterministic, resumable)

Imports neither hydra nor model/ nor training/. Names are re-exported lazily so that `import data` stays cheap
(torch is only imported by data.loader's BatchLoader). `prepare` is not re-exported because it would clash
with the submodule name: use `from data.prepare import prepare`.
"""
from __future__ import annotations

import importlib

from data.config import DataConfig

_EXPORTS = {
    "Prepared": "data.prepare", "load_prepared": "data.prepare",
    "TokenFile": "data.loader", "BatchLoader": "data.loader",
    "CharTokenizer": "data.tokenizer", "GPT2Tokenizer": "data.tokenizer", "StreamDecoder": "data.tokenizer",
    "tokenizer_from_dict": "data.tokenizer", "check_same_tokenizer": "data.tokenizer",
    "cache_dir": "data.sources",
}

__all__ = ["DataConfig", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
