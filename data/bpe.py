"""Your own tokenizer: a byte-level BPE (GPT-2's pre-tokenizer, <|endoftext|>) trained with Hugging Face `tokenizers`
on the first `tokenizer_sample_mb` MB of the train split (collected by `corpus.scan`), cached by the hash of that
sample and the size, so preparing again never retrains. `python -m data.bpe` trains (or finds) one, timed.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import hashlib
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from common.cli import ArgumentParser, cli_main, in_keys, setting_error
from common.files import cache_dir, write_text_atomic
from data import corpus
from data.config import DataConfig, resolve
from data.hf_tokenizer import read_tokenizer_json
from data.tokenizer import BPE_EOT, BPETokenizer, import_tokenizers

FORMAT_VERSION = 1  # part of the cache key: a change to how tokenizers are trained gets new files
MIN_FREQUENCY = 2  # a pair seen once in the sample is noise, not a token


def sample(pieces: Iterable[str], train_chars: int, max_bytes: int) -> Iterator[str]:
    """The text the tokenizer learns from, in pieces: the first `max_bytes` bytes (as UTF-8) of the first
    `train_chars` characters (the train split) of the corpus's `pieces` (its chunks; a document ends a piece)."""
    chars, left = train_chars, max_bytes
    for text in pieces:
        if chars <= 0 or left <= 0:
            return
        if not text:
            continue
        text = text[:chars]  # the same string (no copy) when the whole piece is taken
        if len(raw := text.encode("utf-8", errors="surrogatepass")) > left:
            raw = raw[:left]
            text = raw.decode("utf-8", errors="ignore")  # a character cut by the byte limit is dropped
        chars, left = chars - len(text), left - len(raw)
        yield text


def cache_path(texts: Iterable[str], vocab_size: int) -> tuple[Path, int]:
    """Where the BPE trained on `texts` with this vocabulary size is cached, and the sample's size in bytes."""
    h, n = hashlib.sha256(f"tinygpt-bpe {FORMAT_VERSION} {vocab_size} {MIN_FREQUENCY} {BPE_EOT}\n".encode()), 0
    for text in texts:
        raw = text.encode("utf-8", errors="surrogatepass")
        h.update(len(raw).to_bytes(8, "little") + raw)  # piece boundaries are part of what is learnt
        n += len(raw)
    return cache_dir(check=True) / "tokenizers" / f"bpe-{vocab_size}-{h.hexdigest()[:16]}.json", n


def train(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """A byte-level BPE of at most `vocab_size` tokens (fewer when the text has too few pairs seen twice)."""
    tk = import_tokenizers()
    model = tk.Tokenizer(tk.models.BPE())
    model.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, special_tokens=[BPE_EOT],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    model.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(model.to_str())


def _cached(path: Path, note: Callable[[str], None] | None = None) -> BPETokenizer | None:
    """The tokenizer cached at `path`; None when there is none (or it is unreadable: said with `note`)."""
    if not path.is_file():
        return None
    try:
        return BPETokenizer(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        if note is not None:
            note(f"note: the cached tokenizer {path} is unreadable ({e}); training it again")
        return None


def tokenizer_for(pieces: list[str], cfg: DataConfig, train_chars: int,
                  note: Callable[[str], None]) -> BPETokenizer:
    """`cfg`'s BPE for a corpus whose train split is its first `train_chars` characters and which starts with
    `pieces` (at least its first `tokenizer_sample_mb` MB: `corpus.scan` collects them); the cached one when this
    sample and size were trained before (or the one in `cfg.tokenizer_file`)."""
    if cfg.tokenizer_file is not None:
        return from_file(cfg)
    vocab_size = int(cfg.vocab_size)
    texts = list(sample(pieces, train_chars, int(float(cfg.tokenizer_sample_mb) * 1e6)))
    path, n_bytes = cache_path(texts, vocab_size)
    if (cached := _cached(path, note)) is not None:
        return cached
    if n_bytes == 0:
        raise ValueError("the text to train the BPE tokenizer on is empty: give a text file with some content")
    note(f"training a {vocab_size:,}-token BPE tokenizer on {n_bytes / 1e6:,.1f} MB of text")
    t0 = time.perf_counter()
    tok = train(texts, vocab_size)
    seconds = time.perf_counter() - t0
    if (cached := _cached(path)) is not None:  # another process cached one meanwhile: use it, so that both agree
        return cached
    try:
        write_text_atomic(path, tok.json)
    except OSError as e:
        note(f"note: could not cache the tokenizer at {path} ({e}); it will be trained again next time")
    short = f" (the text has too few repeated pairs for {vocab_size:,})" if tok.vocab_size < vocab_size else ""
    note(f"trained a {tok.vocab_size:,}-token BPE{short} in {seconds:.1f} s: {path}")
    return tok


def from_file(cfg: DataConfig) -> BPETokenizer:
    """The tokenizer.json `cfg.tokenizer_file` names (an imported model's), of `cfg.vocab_size` tokens if given."""
    tok = read_tokenizer_json(Path(cfg.tokenizer_file).expanduser())
    if cfg.vocab_size is not None and cfg.vocab_size != tok.vocab_size:
        raise setting_error("{vocab_size=}{0} differs from the {1:,} tokens of {tokenizer_file=}{2}: leave "
                            "{vocab_size} out (the file sets it)", cfg.vocab_size, tok.vocab_size, cfg.tokenizer_file)
    return tok


# ---------------------------------------------------------------------------------------------------- CLI
def run(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(  # prog: errors say "see python -m data.bpe --help"
        prog="-m data.bpe", usage="python -m data.bpe --path PATH [PATH ...] --vocab-size N [options]",
        description="Train your own byte-level BPE tokenizer on a corpus (or find it in the cache), as "
                    "data.tokenizer=bpe does before preparing the data, and say how long it took.")
    ap.add_argument("--path", nargs="+", required=True, help="text, .jsonl or .parquet files, or directories of them")
    ap.add_argument("--vocab-size", type=int, required=True, help="tokens in the vocabulary (e.g. 4096)")
    ap.add_argument("--sample-mb", type=float, default=100.0, help="train on the first this many MB (default 100)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="the end of the text left out (default 0.1)")
    ap.add_argument("--encoding-errors", default="strict", help="strict (default), replace, ignore or "
                                                                "backslashreplace for bytes that are not UTF-8")
    ap.add_argument("--text-key", default="text",
                    help="the field (jsonl, json) or column (csv, parquet) holding the text (default text)")
    args = ap.parse_args(argv)
    cfg = DataConfig(name="text", path=args.path[0] if len(args.path) == 1 else args.path, tokenizer="bpe",
                     vocab_size=args.vocab_size, tokenizer_sample_mb=args.sample_mb, val_fraction=args.val_fraction,
                     encoding_errors=args.encoding_errors, text_key=args.text_key)
    keys = {"vocab_size": "--vocab-size", "tokenizer_sample_mb": "--sample-mb", "path": "--path",
            "val_fraction": "--val-fraction", "encoding_errors": "--encoding-errors", "text_key": "--text-key"}
    with in_keys(keys):
        cfg.validate()
        src = resolve(cfg)
        n_chars, _, pieces = corpus.scan(src, cfg.encoding_errors, False, int(cfg.tokenizer_sample_mb * 1e6))
        t0 = time.perf_counter()
        tok = tokenizer_for(pieces, cfg, int(n_chars * (1.0 - cfg.val_fraction)),
                            lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{tok.describe()} for {src.display} in {time.perf_counter() - t0:.2f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)  # one `error:` line (exit 2), Ctrl-C (130), a closed pipe (141)


if __name__ == "__main__":
    sys.exit(main())
