"""`DataConfig`: which text to train on and how to tokenize and split it (data sets: see README), and `resolve`:
the files it names (`Corpus`: opened, named and hashed here; their text is read by data/corpus.py).

A plain dataclass (no Hydra import) so it serves both the Python API and the Hydra `data` node. `validate()` is
not run by `__post_init__`, so OmegaConf can build the node from defaults: the config edge calls it once, and
later calls (`data.prepare.prepare` makes one) return the remembered answer while no field has changed.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, Sequence

from common.cli import setting_error
from common.files import SHAKESPEARE_FILE, cache_dir
from data.formats import COLUMNAR, FORMATS, KEYED, SNIFF_BYTES, archives, check_text

NAMES = ("shakespeare_char", "shakespeare", "text", "chat")  # chat: conversations (data/chat.py)
TOKENIZERS = ("char", "gpt2", "bpe")
BPE_VOCAB = (257, 1 << 18)  # 256 byte tokens + <|endoftext|> .. 262,144 (the largest common vocabularies)
ENCODING_ERRORS = ("strict", "replace", "ignore", "backslashreplace")
BLOCK = 1 << 20  # bytes read at a time to hash
@dataclass
class DataConfig:
    name: str = "shakespeare_char"  # shakespeare_char (65 characters) | shakespeare (GPT-2 BPE) | text (your files)
    # | chat (your conversations, .jsonl: docs/chat.md)
    path: Any = None  # a file or directory, or a list of them (name=text: required; Shakespeare: a local copy)
    tokenizer: str = "char"  # char | gpt2 | bpe (your own, trained on the text: vocab_size=; name=text)
    val_fraction: float = 0.1  # the last fraction of the text is the validation split
    encoding_errors: str = "strict"  # strict | replace | ignore | backslashreplace (for bytes that are not UTF-8)
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
            raise setting_error("unknown data set {0!r}: choose {name=}shakespeare_char, "
                                "{name=}shakespeare, {name=}text (with {path=}<file or directory>) "
                                "or {name=}chat (with {path=}<.jsonl conversations>)", self.name)
        if self.name == "chat" and not self.path:
            raise setting_error("{name=}chat needs your conversations: add {path=}<a .jsonl file "
                                "or a directory of them> (python -m data.chat_tasks writes a "
                                "task's: docs/chat.md)")
        if self.tokenizer not in TOKENIZERS:
            # what works with this data set: shakespeare_char is characters, shakespeare BPE
            # (GPT-2's or your own)
            own = "{tokenizer=}bpe {vocab_size=}4096 (your own BPE)"
            use = {"shakespeare_char": "{tokenizer=}char, or {name=}shakespeare {tokenizer=}gpt2 "
                                       "for GPT-2 BPE",
                   "shakespeare": "{tokenizer=}gpt2 or " + own}.get(
                self.name, "{tokenizer=}char, {tokenizer=}gpt2 or " + own)
            raise setting_error("unknown tokenizer {tokenizer=}{0!r}: use " + use, self.tokenizer)
        # before the BPE's own checks: their advice (data.vocab_size) would not make a char-level
        # data set BPE
        if self.name == "shakespeare_char" and self.tokenizer != "char":
            own = "{name=}shakespeare" + " {vocab_size=}4096" * (self.vocab_size is None)
            use = own + " for your own BPE of Tiny Shakespeare" if self.tokenizer == "bpe" else \
                "{name=}shakespeare for Tiny Shakespeare with GPT-2 BPE (or your own BPE, " \
                "{name=}shakespeare {tokenizer=}bpe {vocab_size=}4096)"
            raise setting_error("{name=}shakespeare_char is char-level but {tokenizer=}{0} was "
                                "given: use " + use, self.tokenizer)
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
        if self.name == "shakespeare" and self.tokenizer != "bpe":
            return "gpt2"
        return "char" if self.name == "shakespeare_char" else self.tokenizer

    def _validate_bpe(self) -> None:
        lo, hi = BPE_VOCAB
        n = self.vocab_size
        # data=chat's tokenizer_file: a fine-tune's tokenizer, of any kind (data/chat_data.py)
        if self.tokenizer != "bpe" and self.name == "chat":
            return
        if self.tokenizer != "bpe":
            # (shakespeare_char is characters only: its text in BPE is data=shakespeare's)
            bpe = "{name=}shakespeare " * (self.name == "shakespeare_char") + "{tokenizer=}bpe"
            if n is not None:
                raise setting_error("{vocab_size=}{0} applies only to {tokenizer=}bpe (the {1} vocabulary is fixed): "
                                    "leave {vocab_size} out, or add " + bpe, n, self.tokenizer)
            if self.tokenizer_file is not None:
                raise setting_error("{tokenizer_file=}{0} applies only to {tokenizer=}bpe: add " +
                                    bpe + ", or leave {tokenizer_file} out", self.tokenizer_file)
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

# ------------------------------------------------------------------------------------- the files it names
@dataclass
class Corpus:
    files: list[Path]
    names: list[str] | None  # relative names when the source is a directory or a list (part of the hash), else None
    display: str  # as the user gave it (messages)
    abspath: str  # absolute (meta.json)
    nbytes: int
    given: str | None  # the path setting as given, for messages ("a.txt", "[a.txt,b.txt]"); None: the download
    text_key: str  # the field or column of a KEYED file that holds the text
    keyed = property(lambda self: any(f.suffix in KEYED for f in self.files))  # text_key is in the cache key then
    documents = property(lambda self: len(self.files) > 1 or self.keyed)  # more than one document possible

    def open(self, path: Path):
        try:
            return open(path, "rb")
        except OSError as e:
            denied = isinstance(e, PermissionError)
            where = "" if str(path) == self.display else f": {path}"
            shown = "{0}" if self.given is None else "{path=}{0}"
            raise setting_error(shown + " cannot be read ({1}): {2} or give another file", self.given or self.display,
                                f"{'permission denied' if denied else e.strerror or e}{where}",
                                "check its permissions" if denied else "check the file", cls=type(e)) from None

    def header(self, i: int) -> bytes:
        """What the hash reads before file i of a directory or list: its name and size."""
        return b"" if self.names is None else f"{self.names[i]}\0{self.files[i].stat().st_size}\0".encode()

    @staticmethod
    def hash_rest(f, hasher) -> None:
        while block := f.read(BLOCK):
            hasher.update(block)

    def sha256(self) -> str:
        """For one file exactly `sha256sum file`; for a directory or list, over names, sizes and contents (parquet
        and Arrow files too: their bytes)."""
        h = hashlib.sha256()
        for i, path in enumerate(self.files):
            h.update(self.header(i))
            with self.open(path) as f:
                self.hash_rest(f, h)
        return h.hexdigest()


def _expand(given: str) -> tuple[list[Path], list[str] | None]:
    """One `path` entry: a file; a `datasets` save_to_disk directory (its Arrow files); or every .txt, .jsonl,
    .parquet and .arrow file under a directory (a saved dataset in it: its own files), sorted by relative path."""
    p = Path(os.path.expanduser(given))
    if not p.exists():
        raise setting_error("{path=}{0} does not exist (looked at {1}): give an existing text file or a directory "
                            "of such files ({2})", given, p.absolute(), ", ".join(FORMATS), cls=FileNotFoundError)
    if not p.is_dir():
        return [p], None
    from data.columnar import saved_dataset  # pyarrow-free, but only a directory needs it
    files = saved_dataset(p)
    if files is None:
        found = [f for f in p.rglob("*") if f.is_file()]
        groups = {}
        for d in sorted({f.parent for f in found if f.name in ("state.json", "dataset_dict.json")}, key=lambda d: len(d.parts)):
            if not any(r in d.parents for r in groups):
                groups[d] = saved_dataset(d)
        groups.update({f: [f] for f in found if f.suffix in FORMATS and not any(r in f.parents for r in groups)})
        files = [f for _, fs in sorted(groups.items(), key=lambda kv: kv[0].relative_to(p).as_posix()) for f in fs]
        if not files:
            kinds = Counter(f.suffix or "(no suffix)" for f in found)
            has = ", ".join(f"{n} {k}" for k, n in kinds.most_common(6)) or "no files"
            fix = (f"decompress them first ({', '.join(archives(kinds))} files are compressed)" if archives(kinds) else
                   "convert your text to one of these")
            raise setting_error("directory {0} has no .txt files (nor {1} or a datasets save_to_disk directory; it "
                                "has {2}): {3}, or point {path} at a single text file", p, ", ".join(list(FORMATS)[1:]),
                                has, fix)
    return files, [f.relative_to(p).as_posix() for f in files]


def resolve(cfg: DataConfig) -> Corpus:
    """`path` (one or several files or directories), else Tiny Shakespeare (cached, or downloaded and checked)."""
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
    else:  # the Shakespeare presets without a local copy: the cache (checked by its hash: data/cache.py), else a download
        p = cache_dir() / SHAKESPEARE_FILE
        if not p.is_file():
            from data.sources import shakespeare_path
            p = shakespeare_path()
        files, names, display, abspath, shown = [p], None, str(p), str(p.absolute()), None
    src = Corpus(files, names, display, abspath, sum(f.stat().st_size for f in files), shown, cfg.text_key)
    if not any([_has_text(src, f) for f in files]):  # a list: every columnar file is checked
        what = f"all {len(files)} files of {display} are empty" if names else f"{display} is empty"
        rows = " (no rows)" if all(f.suffix in COLUMNAR for f in files) else ""
        raise ValueError(f"{what}{rows}: give a text file with some content")
    return src


def _has_text(src: Corpus, path: Path) -> bool:
    """Whether the file holds anything; a parquet / Arrow file's text column is checked, any other file's first
    bytes (data.formats.check_text): one line if wrong."""
    if path.suffix not in COLUMNAR:
        if path.stat().st_size == 0:
            return False
        with src.open(path) as f:  # a compressed or binary file is named as such, not read as text
            check_text(path, f.read(SNIFF_BYTES))
        return True
    from data.columnar import check
    with src.open(path) as f:
        return check(f, path, src.text_key)
