"""data=chat: conversations read (both shapes, one line per mistake), the chat template and its loss
mask, the prepared directory and ChatLoader, and the loss on answers only (item 3 of issue 52: the
gradient test)."""
from __future__ import annotations

import json

import pytest
import torch

from data.chat import chat_files, read_conversations
from data.chat_data import prepare_chat
from data.chat_loader import ChatLoader, build_loader, targets
from data.chat_tasks import held_out, write
from data.chat_template import SPECIAL, ChatFormat, with_chat
from data.config import DataConfig
from data.tokenizer import CharTokenizer, describe_tokenizer, tokenizer_from_dict, vocab_size_of

CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Spell cat."},
        {"role": "assistant", "content": "c-a-t"}, {"role": "user", "content": "Reverse it."},
        {"role": "assistant", "content": "tac"}]


def _jsonl(path, rows):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _char_chat():
    chars = "abcdefghijklmnopqrstuvwxyzBRS .-?"
    return tokenizer_from_dict(with_chat(CharTokenizer(chars).to_dict()))


def test_both_shapes_are_read_from_a_file_or_a_directory(tmp_path):
    d = tmp_path / "convs"
    d.mkdir()
    _jsonl(d / "a.jsonl", [{"messages": CONV}, ""])
    _jsonl(d / "b.jsonl", [{"instruction": "Spell", "input": "dog", "output": "d-o-g"}])
    (d / "notes.txt").write_text("not read")
    got = read_conversations(chat_files([str(d)]))
    assert [m for _, m in got][0] == CONV
    assert got[1][1] == [{"role": "user", "content": "Spell\n\ndog"},
                         {"role": "assistant", "content": "d-o-g"}]
    assert got[1][0].endswith("b.jsonl:1")


@pytest.mark.parametrize("line, says", [
    ("{not json", "not valid JSON"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role 'robot'"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                   {"role": "assistant", "content": "c"}]}, "may only come first"),
    ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "c"}]},
     "must be a string"),
    ({"instruction": "x"}, "'output'"),
    ({"text": "plain"}, "expected an object with 'messages'"),
])
def test_a_mistake_is_one_line_with_the_file_and_line(tmp_path, line, says):
    path = _jsonl(tmp_path / "c.jsonl", [{"messages": CONV}, line])
    with pytest.raises(ValueError) as e:
        read_conversations(chat_files([str(path)]))
    assert f"{path}:2:" in str(e.value) and says in str(e.value) and "\n" not in str(e.value)


def test_the_template_masks_everything_but_the_answers_and_their_end_token():
    tok = _char_chat()
    fmt = ChatFormat(tok)
    ids, mask = fmt.encode(CONV)
    assert tok.decode(ids) == ("<|system|>Be brief.<|end|><|user|>Spell "
                               "cat.<|end|><|assistant|>c-a-t<|end|><|user|>Reverse "
                               "it.<|end|><|assistant|>tac<|end|>")
    learnt = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learnt == "c-a-t<|end|>tac<|end|>"
    assert fmt.stop_ids == [tok.special_ids["<|end|>"]]
    assert fmt.prompt(CONV[:2])[-1] == tok.special_ids["<|assistant|>"]


def test_the_chat_tokens_follow_every_tokenizer_s_ids_and_survive_the_round_trip(cache_with_gpt2):
    for base in (CharTokenizer("abc").to_dict(), {"type": "gpt2"}):
        d = with_chat(base)
        tok = tokenizer_from_dict(d)
        n = vocab_size_of(base)
        assert tok.vocab_size == vocab_size_of(d) == n + len(SPECIAL)
        assert [tok.special_ids[s] for s in SPECIAL] == list(range(n, n + len(SPECIAL)))
        assert tok.to_dict() == d and "chat template" in describe_tokenizer(d)
        assert tok.decode(tok.encode("<|user|>abc<|end|>")) == "<|user|>abc<|end|>"
    assert with_chat(d) is d  # a template is never replaced


def _prepared(tmp_path, n=40):
    rows = [{"messages": CONV}] + [{"messages": [{"role": "user", "content": f"Spell {w}."},
                                                 {"role": "assistant", "content": "-".join(w)}]}
                                   for w in ["cat", "dog", "bird", "cow"] * (n // 4)]
    path = _jsonl(tmp_path / "c.jsonl", rows)
    return prepare_chat(DataConfig(name="chat", path=str(path)), progress=False)


def test_prepared_once_by_content_and_loaded_as_whole_conversations(tmp_path):
    p = _prepared(tmp_path)
    assert not p.cached and _prepared(tmp_path).cached
    assert p.meta["chat"]["train_conversations"] + p.meta["chat"]["val_conversations"] == 41
    loader = build_loader(p, 32, 4, seed=1)
    assert isinstance(loader, ChatLoader)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, 32)
    tok = p.tokenizer
    for row_x, row_y in zip(x, y):
        # rows start a conversation
        assert tok.decode(row_x[:1].tolist()) in ("<|system|>", "<|user|>")
        learnt = [int(t) for t in row_y if t >= 0]
        assert learnt and tok.decode(learnt).endswith("<|end|>")
        assert "<|user|>" not in tok.decode(learnt)
    state = loader.state_dict()
    after = loader.next_batch()
    again = build_loader(p, 32, 4, seed=1)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(after, again.next_batch()))
    assert torch.equal(loader.eval_batch("val", 0)[1], again.eval_batch("val", 0)[1])


def test_a_prompt_s_targets_change_no_gradient_an_answer_s_do(tmp_path):
    from model.config import GPTConfig
    from model.gpt import GPT
    p = _prepared(tmp_path)
    split = ChatLoader(p, 95, 2, seed=0).splits["train"]
    # the conversation with a system message and two answers, and the ones packed after it
    ids, learnt = (torch.from_numpy(a) for a in split.row(0, 96))
    x, nxt, keep = ids[None, :-1], ids[None, 1:], learnt[None, 1:]
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=p.tokenizer.vocab_size, block_size=96, n_layer=1, n_head=2,
                       n_embd=16)
    model = GPT(config)

    def grads(next_ids):
        model.zero_grad()
        model(x, targets(next_ids, keep))[1].backward()
        return torch.cat([q.grad.flatten() for q in model.parameters()])
    base = grads(nxt)
    prompt_pos, answer_pos = (keep[0] == 0).nonzero()[0, 0], (keep[0] == 1).nonzero()[0, 0]
    changed = nxt.clone()
    changed[0, prompt_pos] = (nxt[0, prompt_pos] + 1) % 20
    assert torch.equal(grads(changed), base)
    changed = nxt.clone()
    changed[0, answer_pos] = (nxt[0, answer_pos] + 1) % 20
    assert not torch.allclose(grads(changed), base)
    end = p.tokenizer.special_ids["<|end|>"]
    answers = (x == p.tokenizer.special_ids["<|assistant|>"]).sum()
    # each answer's end-of-turn token is learnt
    assert (targets(nxt, keep) == end).sum() == answers >= 2


def test_the_task_holds_words_out_and_answers_exactly(tmp_path):
    train, heldout = write(tmp_path, 200, 50, seed=3, tasks=["spell", "reverse"])
    rows = [json.loads(line)["messages"] for line in heldout.read_text().splitlines()]
    for r in rows:
        q, a = r[-2]["content"], r[-1]["content"]
        word = a.replace("-", "") if "pell" in q else a[::-1]
        assert f" {word}" in q and held_out(word)
        assert a == ("-".join(word) if "pell" in q else word[::-1])
    again = write(tmp_path / "again", 200, 50, seed=3, tasks=["spell", "reverse"])[0]
    assert train.read_text() == again.read_text()
    assert not set(open(train).read()) - set(CharTokenizer(open(train).read()).chars)
