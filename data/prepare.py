"""Text -> train.bin / val.bin / meta.json, cached by content and published atomically. Also the CLI.

Three streamed passes in bounded memory: hash (the cache key; a hit returns at once), count characters (and
collect the char vocabulary), then encode each split on its own, as nanoGPT does.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Callable

from tqdm import tqdm

from common.cli import exit_quietly_on_broken_pipe
from common.text import error_line, in_keys, setting_error
from data import corpus
from data.cache import (FORMAT, FORMAT_VERSION, Prepared, cache_key, load_prepared, lookup, prepared_root, publish,
                        staging)
from data.config import DataConfig
from data.encode import encode_bpe, encode_char
from data.loader import TokenWriter, dtype_for_vocab
from data.sources import GPT2_EOT
from data.tokenizer import CharTokenizer, GPT2Tokenizer, Tokenizer


def prepare(cfg: DataConfig, *, progress: bool = True, log: Callable[[str], None] | None = None) -> Prepared:
    """Prepared token files for `cfg`, from the cache when possible. With `progress`: a bar on stderr and
    one-line notes, printed on stderr or handed to `log` (training passes its logger, so they land in train.log)."""
    tok_kind = cfg.validate()
    src = corpus.resolve(cfg)

    def note(msg: str) -> None:
        if progress and log is not None:
            log(msg)
        elif progress:
            print(msg, file=sys.stderr, flush=True)

    p = _prepare(cfg, tok_kind, src, progress, note)
    p.source = src.abspath
    return p


def _prepare(cfg: DataConfig, tok_kind: str, src: corpus.Corpus, progress: bool, note) -> Prepared:
    errors, vf = cfg.encoding_errors, float(cfg.val_fraction)
    src_hash = corpus.sha256(src)
    more = {"text_key": cfg.text_key} if src.jsonl else {}
    if tok_kind == "gpt2" and src.documents:  # <|endoftext|> between documents (char-level has no separator)
        more["separator"] = GPT2_EOT
    key = cache_key(src_hash, tok_kind, vf, errors, **more)
    final = prepared_root() / f"{cfg.name}-{tok_kind}-{key}"
    hit = lookup(final, key, note)
    if hit is not None:
        return hit

    t0 = time.perf_counter()
    tok: Tokenizer | None = GPT2Tokenizer() if tok_kind == "gpt2" else None  # fails early if ranks missing
    n_chars, chars = corpus.scan(src, errors, want_vocab=tok is None)
    if n_chars == 0:
        raise setting_error("{0} has no text left after decoding with {encoding_errors=}{1}: give a text file with "
                            "some content", src.display, errors)
    tok = tok if tok is not None else CharTokenizer(chars)
    n_train = int(n_chars * (1.0 - vf))
    note(f"preparing {cfg.name} ({src.nbytes / 1e6:,.1f} MB, {tok.describe()}) from {src.display} into {final}")

    def changed_error():
        return ValueError(f"{src.display} changed while it was being prepared: run again once it is stable")

    with staging(final.parent) as tmp:
        hasher = hashlib.sha256()
        with tqdm(total=src.nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc=f"prepare {cfg.name}",
                  file=sys.stderr, disable=None if progress else True, leave=False) as bar, \
                TokenWriter(tmp / "train.bin", tok.vocab_size) as w_train, \
                TokenWriter(tmp / "val.bin", tok.vocab_size) as w_val:
            writers = {"train": w_train, "val": w_val}
            texts = corpus.read_text(src, errors, hasher=hasher, bar=bar)
            if isinstance(tok, CharTokenizer):
                forced = 0
                encode_char(texts, n_train, tok, writers, changed_error)
            else:
                forced = encode_bpe(texts, n_train, tok, writers, note)
        if hasher.hexdigest() != src_hash:
            raise changed_error()
        seconds = time.perf_counter() - t0
        meta = {
            "format": FORMAT, "version": FORMAT_VERSION, "key": key, "name": cfg.name,
            "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
            "dtype": dtype_for_vocab(tok.vocab_size).name,
            "train_tokens": w_train.count, "val_tokens": w_val.count,
            "source": {"path": src.abspath, "files": len(src.files), "bytes": src.nbytes, "chars": n_chars,
                       "sha256": src_hash, "encoding_errors": errors, **more},
            "split": {"val_fraction": vf, "by": "characters", "train_chars": n_train, "val_chars": n_chars - n_train},
            "forced_bpe_cuts": forced, "seconds": round(seconds, 3),
        }
        if not publish(tmp, final, meta):  # another process finished first: use its (identical) result
            return load_prepared(final, expect_key=key)
    note(f"prepared {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens in {seconds:.1f} s "
         f"({src.nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s)")
    return Prepared(final, meta, final / "train.bin", final / "val.bin", tok)


# ---------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data.prepare",
        description="Tokenize a corpus into train.bin/val.bin in the tinygpt cache (training does this "
                    "automatically; this runs it on its own).")
    ap.add_argument("--data", default="shakespeare_char", help="shakespeare_char (default), shakespeare or text")
    ap.add_argument("--path", nargs="+", default=None, help="text or .jsonl files or directories of them (required "
                                                             "for --data text; replaces the download for shakespeare*)")
    ap.add_argument("--tokenizer", default=None, help="char or gpt2 (for --data text; default char)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of the text kept for validation")
    ap.add_argument("--encoding-errors", default="strict",
                    help="strict (default), replace, ignore or backslashreplace for bytes that are not UTF-8")
    ap.add_argument("--text-key", default="text", help="the field holding the text in .jsonl files (default text)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    args = ap.parse_args(argv)
    tokenizer = args.tokenizer or ("gpt2" if args.data == "shakespeare" else "char")
    path = args.path[0] if args.path and len(args.path) == 1 else args.path
    cfg = DataConfig(name=args.data, path=path, tokenizer=tokenizer, val_fraction=args.val_fraction,
                     encoding_errors=args.encoding_errors, text_key=args.text_key)
    try:
        with in_keys({"name": "--data", **{k: "--" + k.replace("_", "-") for k in vars(args)}}):  # field -> flag
            p = prepare(cfg, progress=not args.quiet)
    except (ValueError, OSError) as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (nothing half-written is kept)", file=sys.stderr)
        return 130
    m = p.meta
    print(f"{m['name']}: {p.tokenizer.describe()}, {m['source']['bytes']:,} bytes from {p.source}"
          f"{' (already prepared)' if p.cached else ''}")
    print(f"  {p.train_path}  {m['train_tokens']:,} tokens")
    print(f"  {p.val_path}  {m['val_tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_broken_pipe(main))  # `| head`: no traceback
