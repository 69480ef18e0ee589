"""Exact match of a chat model's answers (`python eval.py --chat-exact heldout.jsonl`): for each
conversation, the prompt is every message before its last assistant message, the answer is drawn
greedily up to the end-of-turn token (or `max_new_tokens`; prompts of one length in one batch),
and it scores 1 when it equals the
expected answer, both stripped of surrounding whitespace. data/chat_tasks.py writes a held-out file
whose answers are exact by construction.
"""
from __future__ import annotations

import sys


def split_last_answer(messages: list[dict]) -> tuple[list[dict], str]:
    """(the messages before the last assistant message, its content)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:last], messages[last]["content"]


def greedy_answers(model, fmt, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """The model's greedy answers to prompts of one length (ChatFormat `fmt`'s ids), drawn as one
    batch, each up to its end-of-turn token."""
    import torch
    from model.generate import generate_tokens
    from model.sampling import Sampling
    device = next(model.parameters()).device
    # the answers stay in the context
    room = max(0, min(max_new_tokens, model.config.block_size - len(prompts[0])))
    sampling = Sampling(temperature=0.0, vocab_limit=fmt.tokenizer.vocab_size)
    rows, ended = [[] for _ in prompts], [False] * len(prompts)
    for tok in generate_tokens(model, torch.tensor(prompts, device=device), room, sampling):
        for row, t in enumerate(tok[:, 0].tolist()):
            ended[row] = ended[row] or t in fmt.stop_ids
            if not ended[row]:
                rows[row].append(t)
        if all(ended):
            break
    return [fmt.tokenizer.decode(r) for r in rows]


def exact_match(model, tokenizer, conversations, max_new_tokens: int = 64, progress: bool = False,
                batch_size: int = 32) -> dict:
    """{"exact_match", "correct", "examples", "wrong": the first few misses} over (where, messages)
    pairs. Prompts of one length are answered together, `batch_size` at a time (greedy: the same
    answers as one at a time)."""
    from tqdm import tqdm

    from data.chat_template import ChatFormat
    fmt, block, by_length = ChatFormat(tokenizer), model.config.block_size, {}
    for where, messages in conversations:
        prompt, expected = split_last_answer(messages)
        try:
            ids = fmt.prompt(prompt)[-block:]
        # characters a char model never saw
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        by_length.setdefault(len(ids), []).append((where, ids, expected))
    correct, wrong = 0, []
    with tqdm(total=len(conversations), unit="answer", file=sys.stderr, leave=False,
              disable=not progress) as bar:
        for group in by_length.values():
            for start in range(0, len(group), batch_size):
                chunk = group[start:start + batch_size]
                answers = greedy_answers(model, fmt, [ids for _, ids, _ in chunk], max_new_tokens)
                for (where, _, expected), got in zip(chunk, answers):
                    if got.strip() == expected.strip():
                        correct += 1
                    elif len(wrong) < 5:
                        wrong.append({"where": where, "expected": expected, "got": got})
                bar.update(len(chunk))
    n = len(conversations)
    return {"exact_match": correct / n, "correct": correct, "examples": n, "wrong": wrong}


def summary(r: dict) -> str:
    lines = [f"exact match {r['exact_match']:.1%} ({r['correct']} of {r['examples']})"]
    lines += [f"  {w['where']}: expected {w['expected']!r}, got {w['got']!r}" for w in r["wrong"]]
    return "\n".join(lines)
