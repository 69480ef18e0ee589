"""Score text with a trained model, as lm-evaluation-harness does: `python eval.py --file TEXT --run RUN_DIR` (bits per
byte, loglikelihood_rolling's windows), or HellaSwag (`--hellaswag JSONL`, evals/hellaswag.py); see --help.
--file is read as train.py reads it (data/corpus.py: text, .jsonl, parquet / Arrow, directories), checked before
torch is imported.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import argparse
import json
import math
import os
import sys

from checkpoint.file import load_model  # no torch
from checkpoint.locate import add_checkpoint_options, check_hf_dir, resolve_checkpoint
from common.cli import ArgumentParser, cli_main, in_keys, nanogpt_init_from

KEYS = {"device": "--device", "path": "--file", "text_key": "--text-key", "encoding_errors": "--encoding-errors"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="eval.py", description="Mean next-token cross-entropy (nats/token), perplexity and bits per byte "
                        "of a text, as lm-evaluation-harness's loglikelihood_rolling: disjoint windows of the "
                        "context, the first token scored after <|endoftext|> (a char model has none: its first "
                        "token is not scored); bits per byte = total nats / ln 2 / UTF-8 bytes of the scored "
                        "tokens. Or the HellaSwag accuracy of a jsonl (--hellaswag). Without --run/--checkpoint/--hf "
                        "it uses the newest run under ./outputs or ./multirun.",
        spellings={"out_dir": "--run", "init_from": nanogpt_init_from("--hf"), "init": "--hf"})
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--file", metavar="PATH", help="what to score, read as train.py reads data.path: a UTF-8 text "
                      "file, a .jsonl or parquet / Arrow file (one document per line or row), or a directory")
    what.add_argument("--hellaswag", metavar="JSONL", help="HellaSwag file in the official format (ctx, endings, "
                      "label; .gz too): prints acc, acc_norm and acc_norm_tokens (docs/export_eval.md)")
    what.add_argument("--chat-exact", metavar="JSONL", help="conversations (data=chat's format, "
                      "e.g. the heldout.jsonl of python -m data.chat_tasks): the exact match of the "
                      "model's greedy answers to the last assistant message of each (docs/chat.md)")
    src = add_checkpoint_options(p)
    src.add_argument("--hf", metavar="DIR", help="local Hugging Face GPT-2, Llama or Qwen3 directory (GPT-2 BPE, "
                     "its tokenizer.json, or the vocab.json / tokenizer.json of a model exported by export.py)")
    p.add_argument("--text-key", default="text", help="--file's field (.jsonl) or column (parquet) holding the text")
    p.add_argument("--encoding-errors", default="strict", help="--file's undecodable bytes: strict (an error), replace")
    p.add_argument("--stride", type=int, metavar="N", help="instead of lm-eval's disjoint windows, overlapping ones "
                   "N tokens apart (Hugging Face's strided perplexity: more context per token, slower)")
    p.add_argument("--batch-size", type=int, default=8, metavar="B", help="windows per forward pass (default 8)")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                   help="--chat-exact: the longest answer drawn (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object: loss, perplexity, bits_per_byte, "
                   "tokens, bytes, windows (--hellaswag: acc, acc_norm, acc_norm_tokens, examples)")
    args = p.parse_args(argv)
    if args.stride is not None and args.stride < 1:
        raise ValueError(f"--stride {args.stride} is invalid: use a whole number >= 1 (at most the context length)")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} is invalid: use 1 or more")
    return args


def windows(n_inputs: int, block_size: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """(begin, length, first scored) of each window over `n_inputs` positions: inputs ids[begin:begin+length]
    predict ids[begin+1:begin+length+1]; positions before `first scored` were scored by an earlier window.
    stride None: lm-eval's rolling rule, disjoint blocks of `block_size` predictions, the last one given a full
    context; else windows `stride` apart, each scoring what the ones before it did not."""
    assert n_inputs >= 1 and (stride is None or 1 <= stride <= block_size), (stride, block_size, n_inputs)
    if stride is None:
        return [(max(0, end - block_size), min(end, block_size), start - max(0, end - block_size))
                for start in range(0, n_inputs, block_size) for end in [min(start + block_size, n_inputs)]]
    out, begin, done = [], 0, 0
    while done < n_inputs:
        length = min(block_size, n_inputs - begin)
        out.append((begin, length, done - begin))
        done, begin = begin + length, begin + stride
    return out


def token_losses(model, ids, *, stride: int | None = None, batch_size: int = 8, vocab_limit: int | None = None,
                 progress: bool = False):
    """Cross-entropy (nats, float64, CPU) of each of ids[1:] given the tokens before it in its window (`windows`).
    `vocab_limit`: the softmax runs over ids < vocab_limit only (padded vocabulary rows are no tokens)."""
    import torch
    from tqdm import tqdm

    from evals import logprobs
    device = next(model.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long)
    T = model.config.block_size
    spans = windows(len(ids) - 1, T, stride)
    losses = torch.full((len(ids) - 1,), float("nan"), dtype=torch.float64)
    with torch.inference_mode(), tqdm(total=len(spans), unit="window", file=sys.stderr, leave=False,
                                      disable=not progress or len(spans) <= batch_size) as bar:
        for i in range(0, len(spans), batch_size):
            batch = spans[i:i + batch_size]
            width = max(length for _, length, _ in batch)
            x = torch.zeros(len(batch), width, dtype=torch.long)
            y = torch.full((len(batch), width), -1, dtype=torch.long)  # -1: not scored here
            for row, (begin, length, first) in enumerate(batch):
                x[row, :length] = ids[begin:begin + length]
                y[row, first:length] = ids[begin + 1 + first:begin + 1 + length]
            nll = -logprobs(model(x.to(device))[0][..., :vocab_limit], y.to(device))
            for row, (begin, length, first) in enumerate(batch):
                losses[begin + first:begin + length] = nll[row, first:length]
            bar.update(len(batch))
    assert not losses.isnan().any(), "a token was left unscored"
    return losses


def read_ids(args: argparse.Namespace, src, tokenizer) -> list[int]:
    """--file's token ids as train.py sees them: its documents (data/corpus.py) encoded as the corpus is, a literal
    <|endoftext|> as text; with BPE <|endoftext|> before each document (between them as in training; before the
    first as lm-eval's rolling rule scores it), a char model's documents joined."""
    from itertools import groupby

    from data import corpus
    with in_keys(KEYS):  # None between two documents
        docs = ["".join(g) for gap, g in groupby(corpus.read_text(src, args.encoding_errors), lambda t: t is None)
                if not gap]
    try:
        if tokenizer.eot_id is None:
            return tokenizer.encode_ordinary("".join(docs))
        return [i for doc in docs for i in [tokenizer.eot_id, *tokenizer.encode_ordinary(doc)]]
    except ValueError as e:  # a char model meeting characters it never saw: the message names them
        raise ValueError(f"cannot score --file {args.file}: {e}") from None


def load(args: argparse.Namespace):
    """(model on its device, tokenizer, device) from --hf, --run or --checkpoint, and --device."""
    from model.device import resolve_device
    with in_keys(KEYS):
        device = resolve_device(args.device)
    ckpt = None if args.hf is not None else resolve_checkpoint(args.run, args.checkpoint, "--hf DIR")
    return (*load_model(ckpt, args.hf, device), device)


def run_hellaswag(args: argparse.Namespace) -> int:
    from evals import hellaswag
    text = hellaswag.read_text(args.hellaswag, "--hellaswag")
    examples = hellaswag.read_examples(text, f"--hellaswag {args.hellaswag}")
    model, tokenizer, _ = load(args)
    try:  # a literal <|endoftext|> is the end-of-text token, as in lm-eval
        r = hellaswag.score(model, examples, tokenizer.encode, vocab_limit=tokenizer.vocab_size)
    except ValueError as e:  # an ending longer than the context, characters a char model never saw
        raise ValueError(f"cannot score --hellaswag {args.hellaswag}: {e}") from None
    print(json.dumps(r) if args.json else hellaswag.summary(r))
    return 0


def run_chat_exact(args: argparse.Namespace) -> int:
    from pathlib import Path

    from data.chat import chat_files, read_conversations
    from evals import chat_exact
    # the file checked before the model is loaded
    conversations = read_conversations(chat_files([args.chat_exact]))
    model, tokenizer, _ = load(args)
    r = chat_exact.exact_match(model, tokenizer, conversations, args.max_new_tokens,
                               progress=sys.stderr.isatty())
    print(json.dumps({**r, "file": str(Path(args.chat_exact))}) if args.json else
          chat_exact.summary(r))
    return 0


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.hf is not None:
        check_hf_dir(args.hf, "--hf")
    if args.hellaswag is not None:
        return run_hellaswag(args)
    if args.chat_exact is not None:
        return run_chat_exact(args)
    if args.encoding_errors not in ("strict", "replace"):
        raise ValueError(f"--encoding-errors {args.encoding_errors} is not supported: use strict or replace")
    from data.config import DataConfig, resolve
    if os.path.isfile(args.file) and not os.path.getsize(args.file):
        raise ValueError(f"--file {args.file} is empty: give a text file with something to score")
    with in_keys(KEYS):  # the file(s) exist and hold something: checked before torch is imported
        src = resolve(DataConfig(path=args.file, text_key=args.text_key))
    import torch
    from data.tokenizer import token_bytes
    model, tokenizer, device = load(args)
    ids = read_ids(args, src, tokenizer)
    if len(ids) < 2:
        raise ValueError(f"--file {args.file} is a single token: nothing to score (the first token has no "
                         "context for a char model): give a longer text")
    T = model.config.block_size
    if args.stride is not None and args.stride > T:
        raise ValueError(f"--stride {args.stride} is larger than the model's context of {T}: tokens would be "
                         f"skipped; use at most --stride {T}")
    losses = token_losses(model, ids, stride=args.stride, batch_size=args.batch_size,
                          vocab_limit=tokenizer.vocab_size, progress=sys.stderr.isatty())  # no \r into a log
    total, n_bytes = losses.sum().item(), int(token_bytes(tokenizer)[torch.as_tensor(ids[1:])].sum())  # scored
    # the softmax runs over the tokenizer's ids: a padded vocabulary's extra rows are left out, as
    # sampling and the export (which drops them) do; train.py's val loss and nanoGPT's include them
    # (docs/export_eval.md)
    padded = model.config.vocab_size - tokenizer.vocab_size
    r = {"loss": total / len(losses), "perplexity": math.exp(total / len(losses)),
         "bits_per_byte": total / math.log(2) / n_bytes if n_bytes else None, "tokens": len(losses), "bytes": n_bytes,
         "windows": "rolling" if args.stride is None else f"stride {args.stride}",
         "softmax_ids": tokenizer.vocab_size, "padded_rows_left_out": padded}
    bpb = "n/a (no bytes)" if r["bits_per_byte"] is None else f"{r['bits_per_byte']:.4f}"
    first = "the first after <|endoftext|>" if tokenizer.eot_id is not None else "the first token has no context " \
        "and is not scored"
    how = "lm-eval's rolling windows" if args.stride is None else f"windows {args.stride} apart"
    left_out = (f"\nsoftmax over the {tokenizer.vocab_size:,} real ids: the {padded:,} padded rows "
                f"left out (train.py's val loss and nanoGPT's include them)")
    print(json.dumps(r) if args.json else f"loss {r['loss']:.4f} nats/token | perplexity {r['perplexity']:.3f} | "
          f"bits per byte {bpb}\nscored {r['tokens']:,} tokens ({r['bytes']:,} bytes; {first}) with context {T}, "
          f"{how}, on {device}" + (left_out if padded else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv, "while scoring: use a smaller --batch-size, or another --device")


if __name__ == "__main__":
    sys.exit(main())
