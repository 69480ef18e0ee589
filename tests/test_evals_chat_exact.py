"""eval.py --chat-exact's scoring (evals/chat_exact.py): prompts of one length answered as a batch
give the answers one at a time gives, and a right answer scores."""
from __future__ import annotations

import torch

from data.chat_template import ChatFormat, with_chat
from data.tokenizer import CharTokenizer, tokenizer_from_dict
from evals.chat_exact import exact_match, greedy_answers


def _model_and_tokenizer():
    from model.config import GPTConfig
    from model.gpt import GPT
    tok = tokenizer_from_dict(with_chat(CharTokenizer("abcdefghijlps .-").to_dict()))
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=48, n_layer=1, n_head=2, n_embd=16)
    return GPT(config).eval(), tok


def _conv(word, answer):
    return [{"role": "user", "content": f"spell {word}."}, {"role": "assistant", "content": answer}]


def test_a_batch_answers_as_one_at_a_time_does():
    model, tok = _model_and_tokenizer()
    fmt = ChatFormat(tok)
    prompts = [fmt.prompt(_conv(w, "")[:1]) for w in ("abc", "bca", "jij", "hed")]
    together = greedy_answers(model, fmt, prompts, 8)
    assert together == [greedy_answers(model, fmt, [p], 8)[0] for p in prompts]


def test_exact_match_counts_the_answers_the_model_gives():
    model, tok = _model_and_tokenizer()
    fmt = ChatFormat(tok)
    convs = [(f"f:{i}", _conv(w, "x")) for i, w in enumerate(("abc", "bcad", "ji"))]
    got = [greedy_answers(model, fmt, [fmt.prompt(c[:1])], 8)[0] for _, c in convs]
    right = [(where, _conv(c[0]["content"][6:-1], g)) for (where, c), g in zip(convs, got)]
    r = exact_match(model, tok, right[:2] + convs[2:], max_new_tokens=8, batch_size=2)
    assert r["examples"] == 3 and r["correct"] >= 2 and r["exact_match"] == r["correct"] / 3
