"""`DataConfig`: which text to train on and how to tokenize and split it (data sets: see README).

A plain dataclass (no Hydra import) so it serves both the Python API and the Hydra `data` node. `validate()` is
not run by `__post_init__`, so OmegaConf can build the node from defaults: the config edge calls it once, and
later calls (`data.prepare.prepare` makes one) return the remembered answer while no field has changed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, Sequence

from common.text import setting_error

NAMES = ("shakespeare_char", "shakespeare", "text")
TOKENIZERS = ("char", "gpt2", "bpe")
BPE_VOCAB = (257, 1 << 18)  # 256 byte tokens + <|endoftext|> .. 262,144 (the largest common vocabularies)
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")


@dataclass
class DataConfig:
    name: str = "shakespeare_char"
    path: Any = None  # a file or directory, or a list of them
    tokenizer: str = "char"
    val_fraction: float = 0.1
    encoding_errors: str = "strict"
    text_key: str = "text"  # the field (jsonl) or column (parquet, arrow) holding the text
    vocab_size: Optional[int] = None  # tokenizer=bpe: the size of the BPE vocabulary it trains
    tokenizer_sample_mb: float = 100.0  # tokenizer=bpe: trained on the first this many MB of the train split
    tokenizer_file: Optional[str] = None  # tokenizer=bpe: encode with this tokenizer.json (e.g. an imported model's)

    def paths(self) -> list[str]:
        """`path` as a list (empty when unset): one path, or a list of them (Hydra's ListConfig too)."""
        p = self.path
        items = [] if p is None else list(p) if isinstance(p, Sequence) and not isinstance(p, str) else [p]
        if not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) and str(x) for x in items):
            raise setting_error("{path=}{0!r} is not a path: give a file or directory, or a list of them "
                                "({path=}[a.txt,b.txt])", p)
        return [str(x) for x in items]

    _checked = None  # (the fields checked, the effective tokenizer); unannotated: not a dataclass field

    def validate(self) -> str:
        """Check every field (one-line ValueError naming the option) and return the effective tokenizer. The checks
        run once: a later call returns the remembered answer unless a field changed since."""
        values = repr([getattr(self, f.name) for f in fields(self)])  # repr: a list path compares too
        if self._checked is not None and self._checked[0] == values:
            return self._checked[1]
        kind = self._check()
        self._checked = (values, kind)
        return kind

    def _check(self) -> str:
        if self.name not in NAMES:
            raise setting_error("unknown data set {0!r}: choose {name=}shakespeare_char, {name=}shakespeare or "
                                "{name=}text (with {path=}<file or directory>)", self.name)
        if self.tokenizer not in TOKENIZERS:
            raise setting_error("unknown tokenizer {tokenizer=}{0!r}: use {tokenizer=}char, {tokenizer=}gpt2 or "
                                "{tokenizer=}bpe {vocab_size=}4096 (your own BPE)", self.tokenizer)
        self._validate_bpe()
        try:
            vf = float(self.val_fraction)
        except (TypeError, ValueError):
            vf = float("nan")
        if not 0.0 < vf < 1.0:
            raise setting_error("{val_fraction=}{0!r} must be between 0 and 1 (exclusive): e.g. {val_fraction=}0.1 "
                                "keeps the last 10% of the text for validation", self.val_fraction)
        if self.encoding_errors not in ENCODING_ERRORS:
            raise setting_error("{encoding_errors=}{0!r} is not supported: use one of {1} (replace turns undecodable "
                                "bytes into U+FFFD)", self.encoding_errors, ", ".join(ENCODING_ERRORS))
        if self.name == "text" and not self.path:
            raise setting_error("{name=}text needs your text: add {path=}<a text file or a directory of .txt files>")
        self.paths()
        if not isinstance(self.text_key, str) or not self.text_key:
            raise setting_error("{text_key=}{0!r} must name the field (jsonl) or column (parquet) holding the "
                                "text: e.g. {text_key=}text", self.text_key)
        if self.name == "shakespeare_char" and self.tokenizer != "char":
            raise setting_error("{name=}shakespeare_char is char-level but {tokenizer=}{0} was given: use "
                                "{name=}shakespeare for Tiny Shakespeare with GPT-2 BPE (or your own: "
                                "{name=}shakespeare {tokenizer=}bpe)", self.tokenizer)
        if self.name == "shakespeare" and self.tokenizer != "bpe":
            return "gpt2"
        return "char" if self.name == "shakespeare_char" else self.tokenizer

    def _validate_bpe(self) -> None:
        lo, hi = BPE_VOCAB
        n = self.vocab_size
        if self.tokenizer != "bpe":
            if n is not None:
                raise setting_error("{vocab_size=}{0} applies only to {tokenizer=}bpe (the {1} vocabulary is fixed): "
                                    "leave {vocab_size} out, or add {tokenizer=}bpe", n, self.tokenizer)
            if self.tokenizer_file is not None:
                raise setting_error("{tokenizer_file=}{0} applies only to {tokenizer=}bpe: add {tokenizer=}bpe, or "
                                    "leave {tokenizer_file} out", self.tokenizer_file)
            return
        if self.tokenizer_file is not None and not self._check_tokenizer_file():
            return  # its size is the file's
        if n is None:
            raise setting_error("{tokenizer=}bpe needs the size of its vocabulary: add {vocab_size=}4096 (from {0:,} "
                                "to {1:,} tokens)", lo, hi)
        if isinstance(n, bool) or not isinstance(n, int):
            raise setting_error("{vocab_size=}{0!r} is not a whole number of tokens: e.g. {vocab_size=}4096", n)
        if n < lo:
            raise setting_error("{vocab_size=}{0} is too small: a byte-level BPE has 256 byte tokens and "
                                "<|endoftext|>, so use at least {vocab_size=}{1} (e.g. 4096)", n, lo)
        if n > hi:
            raise setting_error("{vocab_size=}{0} is too large: use at most {vocab_size=}{1} (GPT-2 has 50,257)",
                                n, hi)
        mb = self.tokenizer_sample_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 < mb < float("inf"):
            raise setting_error("{tokenizer_sample_mb=}{0!r} must be a positive number of MB: e.g. "
                                "{tokenizer_sample_mb=}100 trains the BPE on the first 100 MB of text", mb)
        from data.tokenizer import import_tokenizers
        import_tokenizers()  # a missing optional package is one line now, not after the data is read

    def _check_tokenizer_file(self) -> bool:
        """tokenizer_file names a file; True when vocab_size is given too (then checked against the file's)."""
        f = self.tokenizer_file
        if not isinstance(f, str) or not Path(f).expanduser().is_file():
            raise setting_error("{tokenizer_file=}{0!r} is not a file: give the path of a tokenizer.json (or leave "
                                "{tokenizer_file} out to train your own BPE)", f)
        return self.vocab_size is not None
