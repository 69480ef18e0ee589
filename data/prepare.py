"""Text -> token shards of each split + meta.json, cached by content. The entry point (`prepare`) and the CLI.

The key hashes everything the tokens depend on (data/config.py hashes the text); a hit returns at once, having
read the text once to hash it and nothing else. A miss builds the directory (data/cache.py): two more streamed
reads, to count characters (and collect the char vocabulary or the own BPE's sample) and to encode.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from common.cli import ArgumentParser, error_line, exit_quietly_on_broken_pipe, in_keys
from common.interrupt import on_stop, say
from common.files import cache_dir
from data.config import DataConfig, resolve
from data.loader import Prepared
from data.tokenizer import BPE_EOT, data_setting, tokenizer_from_dict

FORMAT = "tinygpt-prepared"
FORMAT_VERSION = 2  # 2: meta.json lists each split's shards; 1 (one train.bin and one val.bin) is still read
KEY_VERSION = 1  # in the key: shards did not change the tokens, so caches of version 1 keep their keys
SHARD_TOKENS = 100_000_000  # tokens per shard (a shard holds at least this many, but for the last of a split)


def prepare(cfg: DataConfig, *, progress: bool = True, log: Callable[[str], None] | None = None,
            shard_tokens: int = SHARD_TOKENS) -> Prepared:
    """Prepared token shards for `cfg`, from the cache when possible (a killed run's closed shards are kept). With
    `progress`: a bar on stderr (MB/s, ETA) and one-line notes, printed on stderr or handed to `log` (training passes
    its logger, so they land in train.log). `shard_tokens` does not change the tokens, only how they are filed."""
    tok_kind = cfg.validate()  # checked once: the config edge has validated it already
    # conversations: their ids, loss mask and starts (data/chat_data.py)
    if cfg.name == "chat":
        from data.chat_data import prepare_chat
        return prepare_chat(cfg, progress=progress, log=log)
    base = base_tokenizer(cfg)
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens={shard_tokens!r} must be a positive integer (default {SHARD_TOKENS:,})")
    root = prepared_root()
    src = resolve(cfg)

    def note(msg: str) -> None:
        if progress and log is not None:
            log(msg)
        elif progress:
            print(msg, file=sys.stderr, flush=True)

    src_hash = src.sha256()
    more = {"text_key": cfg.text_key} if src.keyed else {}
    if tok_kind != "char" and src.documents:  # <|endoftext|> between documents (char-level has no separator)
        more["separator"] = BPE_EOT
    if base is not None and base["type"] == "char":  # a fine-tune's characters, not the text's own
        more["chars"] = hashlib.sha256(base["chars"].encode("utf-8", "surrogatepass")).hexdigest()
    elif base is not None:  # a fine-tune's own BPE: the key of its tokenizer.json given as a file
        more["tokenizer_json"] = hashlib.sha256(base["json"].encode()).hexdigest()
        more["vocab_size"] = base["vocab_size"]
    elif tok_kind == "bpe" and cfg.tokenizer_file is not None:  # a file: its text is the key
        more["tokenizer_json"] = hashlib.sha256(Path(cfg.tokenizer_file).expanduser().read_bytes()).hexdigest()
        if cfg.vocab_size is not None:  # in the key, so a wrong one is always checked (bpe.from_file)
            more["vocab_size"] = int(cfg.vocab_size)
    elif tok_kind == "bpe":  # the own BPE is trained from these settings (data/bpe.py)
        more.update(vocab_size=int(cfg.vocab_size), tokenizer_sample_mb=float(cfg.tokenizer_sample_mb))
    key = cache_key(src_hash, tok_kind, float(cfg.val_fraction), cfg.encoding_errors, **more)
    final = root / f"{cfg.name}-{tok_kind}-{key}"
    p = lookup(final, key, note)
    if p is None:
        from data.cache import build  # the miss: only now the encoders, the BPE trainer, the shard writer
        head = {"format": FORMAT, "version": FORMAT_VERSION, "key": key, "name": cfg.name}
        given = tokenizer_from_dict(base) if base is not None else None
        # None: another process published first, its identical result is read
        p = build(cfg, tok_kind, src, src_hash, head, more, final, note, progress, shard_tokens,
                  given) or load_prepared(final, expect_key=key)
    p.source = src.abspath
    return p


def encode_with(cfg: DataConfig, tokenizer: dict | None) -> None:
    """Have `prepare(cfg)` encode with `tokenizer` (a char or own BPE `to_dict()`), not one made
    from the text: a fine-tune's (training/init_from.py), whose model reads only its ids.
    Char-level, the text may use any of its characters (fewer is fine) and no other; an own BPE
    encodes any text. Not a setting but the source's, which `model.init_from` names: kept on this
    config object (each run's set-up sets it again)."""
    kind = data_setting(tokenizer) if tokenizer is not None else None
    assert kind in (None, "char", "bpe") and kind in (None, cfg.validate()), kind
    cfg.__dict__[_BASE] = tokenizer


def base_tokenizer(cfg: DataConfig) -> dict | None:
    """The tokenizer `encode_with` gave `cfg`, if any."""
    return cfg.__dict__.get(_BASE)


# an attribute of the DataConfig object, not a field: in neither the schema nor a checkpoint
_BASE = "encode_with"


def prepared_root() -> Path:
    return cache_dir(check=True) / "prepared"


def cache_key(source_hash: str, tokenizer: str, val_fraction: float, encoding_errors: str, **more) -> str:
    """`more`: settings given only for the sources they affect, so the keys of all others stay what they were."""
    blob = json.dumps({"format": KEY_VERSION, "source": source_hash, "tokenizer": tokenizer,
                       "val_fraction": float(val_fraction), "encoding_errors": encoding_errors, **more}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_prepared(directory: str | os.PathLike, *, expect_key: str | None = None) -> Prepared:
    """Open a prepared directory, checking meta.json and every token-file header (ValueError if damaged)."""
    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{d / 'meta.json'} is missing or not valid JSON ({type(e).__name__}): delete {d} and "
                         f"prepare again") from None
    if meta.get("format") != FORMAT or meta.get("version") not in (1, FORMAT_VERSION):
        raise ValueError(f"{d} was prepared by another version (format {meta.get('format')!r} v{meta.get('version')}):"
                         f" delete it and prepare again")
    if expect_key is not None and meta.get("key") != expect_key:
        raise ValueError(f"{d / 'meta.json'} does not match its directory (key {meta.get('key')!r}): delete {d} "
                         f"and prepare again")
    p = Prepared(d, meta, None)
    try:
        splits = dict(zip(("train", "val"), p.token_files()))
    except FileNotFoundError as e:
        raise ValueError(f"{d} is incomplete ({e.__class__.__name__}: a token file is missing): delete it and "
                         f"prepare again") from None
    except (KeyError, TypeError, AssertionError):
        raise ValueError(f"{d / 'meta.json'} lists no shards for a split: delete {d} and prepare again") from None
    for split, ts in splits.items():
        if len(ts) != meta.get(f"{split}_tokens") or ts.vocab_size != meta.get("vocab_size"):
            raise ValueError(f"{split} shards of {d} do not match {d / 'meta.json'} ({len(ts):,} tokens, vocabulary "
                             f"{ts.vocab_size}): delete {d} and prepare again")
    p.tokenizer = tokenizer_from_dict(meta["tokenizer"])
    return p


def lookup(final: Path, key: str, note: Callable[[str], None]) -> Prepared | None:
    """The cached copy at `final` if it checks out; a damaged one is noted and removed."""
    if not final.is_dir():
        return None
    try:
        p = load_prepared(final, expect_key=key)
    except ValueError as e:
        note(f"note: the prepared data in {final} is damaged ({e}); preparing it again")
        shutil.rmtree(final, ignore_errors=True)
        return None
    p.cached = True
    return p


# ---------------------------------------------------------------------------------------------------- CLI
INTERRUPTED = "error: interrupted (finished shards are kept: run the same command again to continue)"


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(  # a mistake is one line; prog: its "see python -m data.prepare --help"
        prog="-m data.prepare", usage="python -m data.prepare [options]",
        description="Tokenize a corpus into token shards in the tinygpt cache (training does this "
                    "automatically; this runs it on its own). Run it again after an interruption to continue.")
    ap.add_argument("--data", default="shakespeare_char",
                    help="shakespeare_char (default), shakespeare, text or chat (conversations)")
    ap.add_argument("--path", nargs="+", default=None,
                    help="text, .jsonl or .parquet files, datasets save_to_disk directories, or directories of them "
                         "(required for --data text; replaces the download for shakespeare*)")
    ap.add_argument("--tokenizer", default=None, help="char, gpt2 or bpe (for --data text; default char)")
    ap.add_argument("--vocab-size", type=int, default=None, help="with --tokenizer bpe: the size of the BPE it trains")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of the text kept for validation")
    ap.add_argument("--encoding-errors", default="strict",
                    help="strict (default), replace, ignore or backslashreplace for bytes that are not UTF-8")
    ap.add_argument("--text-key", default="text",
                    help="the field (jsonl) or column (parquet) holding the text (default text)")
    ap.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS,
                    help=f"tokens per shard file (default {SHARD_TOKENS:,}; the tokens are the same for any value)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    try:
        args = ap.parse_args(argv)
    except ValueError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    tokenizer = args.tokenizer or ("gpt2" if args.data == "shakespeare" else "char")
    path = args.path[0] if args.path and len(args.path) == 1 else args.path
    cfg = DataConfig(name=args.data, path=path, tokenizer=tokenizer, val_fraction=args.val_fraction,
                     encoding_errors=args.encoding_errors, text_key=args.text_key, vocab_size=args.vocab_size)
    keys = {"name": "--data", **{k: "--" + k.replace("_", "-") for k in vars(args)}}  # field -> flag
    try:
        with in_keys(keys), on_stop(lambda: say(INTERRUPTED)):  # a Ctrl-C ends it at once, saying what is kept
            p = prepare(cfg, progress=not args.quiet, shard_tokens=args.shard_tokens)
    except (ValueError, OSError) as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # (called in-process)
        print(INTERRUPTED, file=sys.stderr)
        return 130
    m = p.meta
    print(f"{m['name']}: {p.tokenizer.describe()}, {m['source']['chars']:,} characters of text from {p.source}"
          f"{' (already prepared)' if p.cached else ''}")
    for split, paths in (("train", p.train_paths), ("val", p.val_paths)):
        files = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}/{split}-*.bin ({len(paths)} shards)"
        print(f"  {files}  {m[f'{split}_tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_broken_pipe(main))  # `| head`: no traceback
