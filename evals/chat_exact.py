"""Exact match of a chat model's answers (`python eval.py --chat-exact heldout.jsonl`): for each
conversation, the prompt is every message before its last assistant message, the answer is drawn
greedily up to the end-of-turn token (or `max_new_tokens`), and it scores 1 when it equals the
expected answer, both stripped of surrounding whitespace. data/chat_tasks.py writes a held-out file
whose answers are exact by construction.
"""
from __future__ import annotations

import sys


def split_last_answer(messages: list[dict]) -> tuple[list[dict], str]:
    """(the messages before the last assistant message, its content)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], messages[last]["content"]


def greedy_answer(model, fmt, messages: list[dict], max_new_tokens: int) -> str:
    """The model's greedy answer to `messages` (ChatFormat `fmt`), up to its end-of-turn token."""
    import torch
    from model.generate import generate_tokens
    from model.sampling import Sampling
    device = next(model.parameters()).device
    ids = fmt.prompt(messages)[-model.config.block_size:]
    # the answer stays in the context
    room = max(0, min(max_new_tokens, model.config.block_size - len(ids)))
    out = []
    sampling = Sampling(temperature=0.0, vocab_limit=fmt.tokenizer.vocab_size)
    for tok in generate_tokens(model, torch.tensor([ids], device=device), room, sampling):
        if (t := int(tok)) in fmt.stop_ids:
            break
        out.append(t)
    return fmt.tokenizer.decode(out)


def exact_match(model, tokenizer, conversations, max_new_tokens: int = 64,
                progress: bool = False) -> dict:
    """{"exact_match", "correct", "examples", "wrong": the first few misses} over (where, messages)
    pairs."""
    from tqdm import tqdm

    from data.chat_template import ChatFormat
    fmt, correct, wrong = ChatFormat(tokenizer), 0, []
    bar = tqdm(conversations, unit="answer", file=sys.stderr, leave=False, disable=not progress)
    for where, messages in bar:
        prompt, expected = split_last_answer(messages)
        try:
            got = greedy_answer(model, fmt, prompt, max_new_tokens)
        # characters a char model never saw
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if got.strip() == expected.strip():
            correct += 1
        elif len(wrong) < 5:
            wrong.append({"where": where, "expected": expected, "got": got})
    n = len(conversations)
    return {"exact_match": correct / n, "correct": correct, "examples": n, "wrong": wrong}


def summary(r: dict) -> str:
    lines = [f"exact match {r['exact_match']:.1%} ({r['correct']} of {r['examples']})"]
    lines += [f"  {w['where']}: expected {w['expected']!r}, got {w['got']!r}" for w in r["wrong"]]
    return "\n".join(lines)
