"""Text -> token shards of each split + meta.json, cached by content and published atomically. Also the CLI.

Three streamed passes in bounded memory: hash (the cache key; a hit returns at once), count characters (and
collect the char vocabulary), then encode each split on its own, as nanoGPT does, into shards (data/shards.py):
a killed or interrupted run's closed shards are kept and a rerun does only the rest.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from common.cli import exit_quietly_on_broken_pipe
from common.text import error_line, in_keys, setting_error
from data import bpe, corpus
from data.cache import (FORMAT, FORMAT_VERSION, Prepared, cache_key, load_prepared, lookup, prepared_root, publish,
                        staging)
from data.shards import SHARD_TOKENS, ShardWriter, saved_head
from data.config import DataConfig
from data.encode import encode_bpe, encode_char
from data.loader import dtype_for_vocab
from data.sources import GPT2_EOT
from data.tokenizer import CharTokenizer, GPT2Tokenizer, tokenizer_from_dict


def prepare(cfg: DataConfig, *, progress: bool = True, log: Callable[[str], None] | None = None,
            shard_tokens: int = SHARD_TOKENS) -> Prepared:
    """Prepared token shards for `cfg`, from the cache when possible (a killed run's closed shards are kept). With
    `progress`: a bar on stderr (MB/s, ETA) and one-line notes, printed on stderr or handed to `log` (training passes
    its logger, so they land in train.log). `shard_tokens` does not change the tokens, only how they are filed."""
    tok_kind = cfg.validate()
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens={shard_tokens!r} must be a positive integer (default {SHARD_TOKENS:,})")
    src = corpus.resolve(cfg)

    def note(msg: str) -> None:
        if progress and log is not None:
            log(msg)
        elif progress:
            print(msg, file=sys.stderr, flush=True)

    p = _prepare(cfg, tok_kind, src, progress, note, shard_tokens)
    p.source = src.abspath
    return p


def _prepare(cfg: DataConfig, tok_kind: str, src: corpus.Corpus, progress: bool, note, shard_tokens: int) -> Prepared:
    errors, vf = cfg.encoding_errors, float(cfg.val_fraction)
    src_hash = corpus.sha256(src)
    more = {"text_key": cfg.text_key} if src.keyed else {}
    if tok_kind != "char" and src.documents:  # <|endoftext|> between documents (char-level has no separator)
        more["separator"] = GPT2_EOT
    if tok_kind == "bpe" and cfg.tokenizer_file is not None:  # a given tokenizer.json: its text is the key
        more["tokenizer_json"] = hashlib.sha256(Path(cfg.tokenizer_file).expanduser().read_bytes()).hexdigest()
        if cfg.vocab_size is not None:  # in the key, so a wrong one is always checked (bpe.from_file)
            more["vocab_size"] = int(cfg.vocab_size)
    elif tok_kind == "bpe":  # the own BPE is trained from these settings (data/bpe.py)
        more.update(vocab_size=int(cfg.vocab_size), tokenizer_sample_mb=float(cfg.tokenizer_sample_mb))
    key = cache_key(src_hash, tok_kind, vf, errors, **more)
    final = prepared_root() / f"{cfg.name}-{tok_kind}-{key}"
    hit = lookup(final, key, note)
    if hit is not None:
        return hit

    def changed_error():
        return ValueError(f"{src.display} changed while it was being prepared: run again once it is stable")

    t0 = time.perf_counter()
    gpt2 = GPT2Tokenizer() if tok_kind == "gpt2" else None  # fails early if ranks missing
    with staging(final.parent, key) as tmp:
        head = saved_head(tmp)
        if head.get("key") == key:  # continuing a killed run: its count and tokenizer stand (same content)
            n_chars, tok, chars = head["chars"], gpt2 or tokenizer_from_dict(head["tokenizer"]), None
        else:
            tok = gpt2
            n_chars, chars = corpus.scan(src, errors, want_vocab=tok_kind == "char")
        if n_chars == 0:
            raise setting_error("{0} has no text left after decoding with {encoding_errors=}{1}: give a text file "
                                "with some content", src.display, errors)
        n_train = int(n_chars * (1.0 - vf))
        if tok is None:  # a fresh start: the char vocabulary just scanned, or the own BPE (trained or cached)
            tok = CharTokenizer(chars) if tok_kind == "char" else bpe.tokenizer_for(src, cfg, n_train, note)
        sink = ShardWriter(tmp, tok.vocab_size, shard_tokens, {"key": key, "chars": n_chars,
                                                               "tokenizer": tok.to_dict()})
        start = sink.resume()
        done = f", continuing after {len(sink.done)} finished shards" if sink.done else ""
        note(f"preparing {cfg.name} ({src.nbytes / 1e6:,.1f} MB, {tok.describe()}) from {src.display} into "
             f"{final}{done}")
        hasher = hashlib.sha256()
        with tqdm(total=src.nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc=f"prepare {cfg.name}",
                  file=sys.stderr, disable=None if progress else True, leave=False) as bar:
            texts = corpus.read_text(src, errors, hasher=hasher, bar=bar)
            try:
                if isinstance(tok, CharTokenizer):
                    forced = 0
                    encode_char(texts, n_train, tok, sink, changed_error, start)
                else:
                    forced = encode_bpe(texts, n_train, tok, sink, note, start)
                sink.finish()
            except BaseException:
                sink.abandon()
                raise
        if hasher.hexdigest() != src_hash:
            raise changed_error()
        seconds = time.perf_counter() - t0
        meta = {
            "format": FORMAT, "version": FORMAT_VERSION, "key": key, "name": cfg.name,
            "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
            "dtype": dtype_for_vocab(tok.vocab_size).name,
            "train_tokens": sink.count("train"), "val_tokens": sink.count("val"),
            "shards": {"train": sink.files("train"), "val": sink.files("val")}, "shard_tokens": shard_tokens,
            "source": {"path": src.abspath, "files": len(src.files), "bytes": src.nbytes, "chars": n_chars,
                       "sha256": src_hash, "encoding_errors": errors, **more},
            "split": {"val_fraction": vf, "by": "characters", "train_chars": n_train, "val_chars": n_chars - n_train},
            "forced_bpe_cuts": forced, "seconds": round(seconds, 3),
        }
        if not publish(tmp, final, meta):  # another process finished first: use its (identical) result
            return load_prepared(final, expect_key=key)
    note(f"prepared {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens in {seconds:.1f} s "
         f"({src.nbytes / 1e6 / max(seconds, 1e-9):,.1f} MB/s)")
    return Prepared(final, meta, [final / f for f in meta["shards"]["train"]],
                    [final / f for f in meta["shards"]["val"]], tok)


# ---------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m data.prepare",
        description="Tokenize a corpus into token shards in the tinygpt cache (training does this "
                    "automatically; this runs it on its own). Run it again after an interruption to continue.")
    ap.add_argument("--data", default="shakespeare_char", help="shakespeare_char (default), shakespeare or text")
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
    args = ap.parse_args(argv)
    tokenizer = args.tokenizer or ("gpt2" if args.data == "shakespeare" else "char")
    path = args.path[0] if args.path and len(args.path) == 1 else args.path
    cfg = DataConfig(name=args.data, path=path, tokenizer=tokenizer, val_fraction=args.val_fraction,
                     encoding_errors=args.encoding_errors, text_key=args.text_key, vocab_size=args.vocab_size)
    try:
        with in_keys({"name": "--data", **{k: "--" + k.replace("_", "-") for k in vars(args)}}):  # field -> flag
            p = prepare(cfg, progress=not args.quiet, shard_tokens=args.shard_tokens)
    except (ValueError, OSError) as e:
        print(error_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (finished shards are kept: run the same command again to continue)", file=sys.stderr)
        return 130
    m = p.meta
    print(f"{m['name']}: {p.tokenizer.describe()}, {m['source']['bytes']:,} bytes from {p.source}"
          f"{' (already prepared)' if p.cached else ''}")
    for split, paths in (("train", p.train_paths), ("val", p.val_paths)):
        files = str(paths[0]) if len(paths) == 1 else f"{paths[0].parent}/{split}-*.bin ({len(paths)} shards)"
        print(f"  {files}  {m[f'{split}_tokens']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_broken_pipe(main))  # `| head`: no traceback
