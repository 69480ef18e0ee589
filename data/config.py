"""`DataConfig`: which text to train on and how to tokenize and split it (data sets: see README).

A plain dataclass (no Hydra import) so it serves both the Python API and the Hydra `data` node. `validate()` is
called by `data.prepare.prepare`, not `__post_init__`, so OmegaConf can build the node from defaults.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

NAMES = ("shakespeare_char", "shakespeare", "text")
TOKENIZERS = ("char", "gpt2")
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")


@dataclass
class DataConfig:
    name: str = "shakespeare_char"
    path: Any = None  # a file or directory, or a list of them (data.path=[a.txt,b.jsonl])
    tokenizer: str = "char"
    val_fraction: float = 0.1
    encoding_errors: str = "strict"
    text_key: str = "text"  # the field holding the text in .jsonl files

    @classmethod
    def coerce(cls, cfg: Any) -> "DataConfig":
        """Accept a DataConfig or a mapping (dict / OmegaConf DictConfig)."""
        if isinstance(cfg, cls):
            return cfg
        names = [f.name for f in fields(cls)]
        d = {k: cfg[k] for k in cfg.keys()}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown data option(s) {', '.join(unknown)}: the data options are {', '.join(names)}")
        return cls(**d)

    def paths(self) -> list[str]:
        """data.path as a list (empty when unset): one path, or a list of them (Hydra's ListConfig too)."""
        p = self.path
        items = [] if p is None else list(p) if isinstance(p, Sequence) and not isinstance(p, str) else [p]
        if not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) and str(x) for x in items):
            raise ValueError(f"data.path={p!r} is not a path: give a file or directory, or a list of them "
                             f"(data.path=[a.txt,b.txt])")
        return [str(x) for x in items]

    def validate(self) -> str:
        """Check every field (one-line ValueError naming the option) and return the effective tokenizer."""
        if self.name not in NAMES:
            raise ValueError(f"unknown data set {self.name!r}: choose data=shakespeare_char, data=shakespeare "
                             f"or data=text (with data.path=<file or directory>)")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer data.tokenizer={self.tokenizer!r}: use data.tokenizer=char "
                             f"or data.tokenizer=gpt2")
        try:
            vf = float(self.val_fraction)
        except (TypeError, ValueError):
            vf = float("nan")
        if not 0.0 < vf < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction!r} must be between 0 and 1 (exclusive): "
                             f"e.g. data.val_fraction=0.1 keeps the last 10% of the text for validation")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise ValueError(f"data.encoding_errors={self.encoding_errors!r} is not supported: use one of "
                             f"{', '.join(ENCODING_ERRORS)} (replace turns undecodable bytes into U+FFFD)")
        if self.name == "text" and not self.path:
            raise ValueError("data=text needs your text: add data.path=<a text file or a directory of .txt files>")
        self.paths()
        if not isinstance(self.text_key, str) or not self.text_key:
            raise ValueError(f"data.text_key={self.text_key!r} must name the JSON field holding the text: "
                             f"e.g. data.text_key=text")
        if self.name == "shakespeare_char":
            if self.tokenizer != "char":
                raise ValueError("data=shakespeare_char is char-level but data.tokenizer=gpt2 was given: use "
                                 "data=shakespeare for Tiny Shakespeare with GPT-2 BPE")
            return "char"
        if self.name == "shakespeare":
            return "gpt2"
        return self.tokenizer
