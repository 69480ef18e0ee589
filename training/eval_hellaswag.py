"""HellaSwag at the loop's evaluations (train.hellaswag=FILE), as llm.c's GPT-2 runs report it beside val loss.

Every rank scores its share of the examples (padded under FSDP, where each forward is a collective), the counts
are summed once, and rank 0 logs acc / acc_norm (log line, metrics.jsonl record "hellaswag", wandb). It runs
only at evaluation time, so the training steps stay free of host syncs. Scoring itself: evals/hellaswag.py.
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
    """train.hellaswag's examples, read once per process: the config check (validate) reads them first."""
    return tuple(hellaswag.read_examples(read_text_file(path, "train.hellaswag"), f"train.hellaswag={path}"))


def at_eval(path: str, step: int, model, tokenizer, autocast, plan, reduce_sum, is_main: bool, report) -> dict:
    """Score `path` with `model` (the DDP/FSDP-wrapped one: every rank calls this, `plan(n)` its share of the n
    examples, `reduce_sum` summing over ranks) and report it on rank 0."""
    t0, ex = time.perf_counter(), examples(path)
    r = hellaswag.score(model, ex, tokenizer.encode_ordinary, vocab_limit=tokenizer.vocab_size, autocast=autocast,
                        plan=plan(len(ex)), reduce_sum=reduce_sum)
    if is_main:
        log.info(f"step {step}: {hellaswag.summary(r)} | {time.perf_counter() - t0:.1f} s")
        if report.metrics is not None:
            report.metrics.write({"type": "hellaswag", "step": step, **r})
        report.track({f"eval/hellaswag_{k}": v for k, v in r.items() if k != "examples"}, step=step)
    return r
