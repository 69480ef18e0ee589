"""HellaSwag at the loop's evaluations (train.hellaswag=FILE), reported beside val loss as llm.c's
GPT-2 runs do. Every rank scores its share, the counts are summed once, rank 0 reports; scoring
itself: evals/hellaswag.py.
"""
from __future__ import annotations

import functools
import logging
import time

from common.cli import read_text_file
from evals import hellaswag

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=2)
def examples(path: str) -> tuple[hellaswag.Example, ...]:
    """train.hellaswag's examples, read once per process (the config check reads them first)."""
    return tuple(hellaswag.read_examples(read_text_file(path, "train.hellaswag"),
                                         f"train.hellaswag={path}"))


def check(path: str, tokenizer, block_size: int) -> None:
    """Before step 1: every row must be scorable with this tokenizer and context (one line naming
    file and row)."""
    hellaswag.check_scorable(examples(path), tokenizer.encode_ordinary, block_size,
                             f"train.hellaswag={path}")


def at_eval(path: str, step: int, model, tokenizer, autocast, ranks, report) -> dict:
    """Score `path` with the wrapped `model` (every rank its share, runtime.ranks.Ranks) and report
    it on rank 0."""
    t0, ex = time.perf_counter(), examples(path)
    r = hellaswag.score(model, ex, tokenizer.encode_ordinary, vocab_limit=tokenizer.vocab_size,
                        autocast=autocast,
                        plan=ranks.eval_plan(len(ex)), reduce_sum=ranks.all_reduce_sum)
    if ranks.is_main:
        log.info(f"step {step}: {hellaswag.summary(r)} | {time.perf_counter() - t0:.1f} s")
        report.write({"type": "hellaswag", "step": step, **r})
        report.track({f"eval/hellaswag_{k}": v for k, v in r.items() if k != "examples"}, step=step)
    return r
