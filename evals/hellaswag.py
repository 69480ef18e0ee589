"""HellaSwag, scored as lm-evaluation-harness scores it (docs/export_eval.md).

Each ending, as " " + ending, is tokenized after the context and scored by its summed log-likelihood
(log_softmax over the vocabulary, as lm-eval computes it). acc: the largest sum; acc_norm: the largest per
character of the ending (lm-eval's); acc_norm_tokens: the smallest mean loss per ending token (llm.c's
"acc_norm"). A context too long for the model loses tokens on the left, as in lm-eval.
"""
from __future__ import annotations

import contextlib
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterable, Optional

from evals import logprobs

N_ENDINGS = 4


@dataclass(frozen=True)
class Example:
    context: str
    endings: tuple[str, ...]
    label: int
    line: int = 0  # in its file, for messages


def parse_row(line: str, number: int = 0) -> Example:
    """One jsonl row in the official format: ctx (or ctx_a and ctx_b), 4 endings, label 0-3; ValueError saying why."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    if isinstance(row.get("ctx"), str):
        context = row["ctx"]
    elif isinstance(row.get("ctx_a"), str) and isinstance(row.get("ctx_b"), str):
        context = f"{row['ctx_a']} {row['ctx_b']}".strip()
    else:
        raise ValueError('no context: give a "ctx" string (or "ctx_a" and "ctx_b")')
    endings, label = row.get("endings"), row.get("label")
    if not isinstance(endings, list) or len(endings) != N_ENDINGS or not all(isinstance(e, str) and e
                                                                              for e in endings):
        raise ValueError(f'"endings" must be a list of {N_ENDINGS} non-empty strings')
    if isinstance(label, str) and label.strip() in [str(i) for i in range(N_ENDINGS)]:
        label = int(label)  # the official files store it as a number; some copies as a string
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < N_ENDINGS:
        raise ValueError(f'"label" must be 0 to {N_ENDINGS - 1}, got {label!r}')
    if not context:
        raise ValueError("the context is empty")
    return Example(context, tuple(endings), label, number)


def read_text(path: str, option: str) -> str:
    """The text of a HellaSwag file given with `option`: UTF-8 (read_examples drops a BOM), or gzip-compressed."""
    from common.cli import read_text_file
    try:
        return read_text_file(path, option)
    except ValueError:  # not UTF-8: a .gz?
        raw = b"" if path == "-" else Path(path).read_bytes()
        if raw[:2] != b"\x1f\x8b":
            raise
        try:
            return gzip.decompress(raw).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ValueError(f"{option} {path} is gzip-compressed but not UTF-8 jsonl inside ({e}): give the "
                             "HellaSwag jsonl, or its intact .gz") from None


def read_examples(text: str, name: str) -> list[Example]:
    """The examples of a HellaSwag jsonl's `text` (blank lines skipped), or of one JSON array of rows; a bad row is
    one line naming `name` and the row's line (its position in an array)."""
    out, text, what = [], text.lstrip("\ufeff"), "line"
    lines = text.splitlines()
    if text.lstrip().startswith("["):  # one JSON array of rows: each row re-serialised, numbered by its position
        try:
            lines, what = [json.dumps(row) for row in json.loads(text)], "row"
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not a JSON array ({e.msg} at line {e.lineno}): give a HellaSwag jsonl, one "
                             "JSON object per line") from None
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append(parse_row(line, n))
            except ValueError as e:
                raise ValueError(f"{name} {what} {n}: "
                                 f"{e}: HellaSwag rows are JSON objects with ctx, endings ({N_ENDINGS}) and label "
                                 f"0-{N_ENDINGS - 1}") from None
    if not out:
        raise ValueError(f"{name} has no examples: give a HellaSwag jsonl (one JSON object per line)")
    return out


def encode(example: Example, encode_text: Callable[[str], list[int]], block_size: int):
    """(rows, targets) for the 4 endings: inputs and next-token targets (-1 outside the ending), the context
    cropped on the left so that the context and ending fit `block_size` + 1 tokens."""
    context = encode_text(example.context)
    rows = []
    for ending in example.endings:
        tail = encode_text(" " + ending)
        if not tail or len(tail) > block_size:
            raise ValueError(f"line {example.line}: an ending is {len(tail)} tokens, more than the model's "
                             f"context of {block_size}: drop that example")
        ids = (context + tail)[-(block_size + 1):]
        rows.append((ids[:-1], [-1] * (len(ids) - 1 - len(tail)) + tail))
    return rows


def ending_losses(model, rows, vocab_limit: Optional[int],
                  autocast: Callable[[], ContextManager] = contextlib.nullcontext):
    """(sum, count) of each ending's token losses (float64 sums on the CPU), one forward pass:
    log_softmax in float32 over the vocabulary (the last dimension) and gather, as lm-eval computes it."""
    import torch
    device = next(model.parameters()).device
    width = max(len(x) for x, _ in rows)
    x = torch.zeros(len(rows), width, dtype=torch.long)
    y = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, (inp, tgt) in enumerate(rows):
        x[i, :len(inp)], y[i, :len(tgt)] = torch.tensor(inp), torch.tensor(tgt)
    x, y = x.to(device), y.to(device)
    with autocast():
        logits = model(x)[0]
    return -logprobs(logits[..., :vocab_limit], y).sum(1), (y >= 0).sum(1).cpu()


def score(model, examples: list[Example], encode_text: Callable[[str], list[int]], *, vocab_limit: Optional[int],
          autocast: Callable[[], ContextManager] = contextlib.nullcontext,
          plan: Optional[Iterable[tuple[int, bool]]] = None,
          reduce_sum: Optional[Callable] = None) -> dict:
    """{"acc", "acc_norm", "acc_norm_tokens", "examples"} over the counted examples of `plan` ((index, counted),
    default all; a distributed run gives each rank its share and `reduce_sum` adds the ranks' counts)."""
    import torch
    device = next(model.parameters()).device
    T = model.config.block_size if hasattr(model, "config") else model.module.config.block_size
    plan = [(i, True) for i in range(len(examples))] if plan is None else list(plan)
    counts = torch.zeros(4, device=device)  # examples, acc, acc_norm, acc_norm_tokens
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():  # (not inference_mode: the counts are all-reduced in place after it)
            for i, counted in plan:
                ex = examples[i]
                total, n = ending_losses(model, encode(ex, encode_text, T), vocab_limit, autocast)
                if counted:
                    chars = torch.tensor([float(len(e)) for e in ex.endings])
                    picks = torch.stack([total.argmin(), (total / chars).argmin(), (total / n).argmin()])
                    counts += torch.cat([torch.ones(1), (picks == ex.label).float()]).to(device)
        n, acc, acc_norm, acc_tokens = (reduce_sum(counts) if reduce_sum is not None else counts).tolist()
    finally:
        model.train(was_training)
    d = max(n, 1.0)
    return {"acc": acc / d, "acc_norm": acc_norm / d, "acc_norm_tokens": acc_tokens / d, "examples": int(n)}


def summary(r: dict) -> str:
    return (f"HellaSwag: acc {r['acc']:.4f} | acc_norm {r['acc_norm']:.4f} (per character, lm-eval's) | "
            f"acc_norm_tokens {r['acc_norm_tokens']:.4f} (per ending token, llm.c's acc_norm) | {r['examples']:,} "
            f"examples")


def check_scorable(examples: Iterable[Example], encode_text: Callable[[str], list[int]], block_size: int,
                   name: str) -> None:
    """A one-line ValueError naming `name` and the row of the first example a model cannot score (a character its
    tokenizer lacks, an ending longer than its context): a training run refuses the file before its first step."""
    for ex in examples:
        try:
            encode(ex, encode_text, block_size)
        except ValueError as e:
            raise ValueError(f"{name} line {ex.line}: {str(e).removeprefix(f'line {ex.line}: ')}") from None
