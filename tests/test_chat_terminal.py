"""sample.py --chat's loop (chat/cli.py) in this process, with the keys a terminal user presses: Ctrl-C
while an answer streams stops that answer and the conversation goes on; /reset forgets; Ctrl-D (the
end of input) leaves with exit 0."""
from __future__ import annotations

import argparse
import os
import signal

import pytest
import torch

from chat import cli
from data.chat_template import with_chat
from data.tokenizer import CharTokenizer, tokenizer_from_dict
from model.sampling import Sampling
from tests.helpers import tiny_model


@pytest.fixture
def chat_model():
    tok = tokenizer_from_dict(with_chat(CharTokenizer("abcdefgh .\n").to_dict()))
    torch.manual_seed(0)
    model = tiny_model(tok.vocab_size, block_size=64).eval()
    return model, tok


def args(**kw):
    return argparse.Namespace(**{"system": None, "max_new_tokens": 30, "seed": 0,
                                 "sampling": Sampling(1.0), **kw})


def typed(monkeypatch, lines):
    """input() returns `lines` in turn, then raises EOFError (Ctrl-D)."""
    it = iter(lines)

    def fake_input(prompt=""):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    monkeypatch.setattr("builtins.input", fake_input)


def test_ctrl_c_stops_the_answer_and_the_conversation_goes_on(chat_model, monkeypatch, capsys):
    model, tok = chat_model
    typed(monkeypatch, ["abc", "bad"])
    real, streamed, answers = cli.stream, [], []

    def stream(*a, **kw):
        answers.append(a[3])
        # the user presses Ctrl-C once the first answer has printed its first piece
        for piece in real(*a, **kw):
            streamed.append(piece)
            if len(streamed) == 1 and len(answers) == 1:
                os.kill(os.getpid(), signal.SIGINT)
            yield piece
    monkeypatch.setattr(cli, "stream", stream)
    before = signal.getsignal(signal.SIGINT)
    assert cli.chat_loop(model, tok, args()) == 0
    err = capsys.readouterr().err
    assert err.count("(answer stopped)") == 1
    # the first answer stopped after its first token (30 allowed), the second line was answered
    # (the loop went on), and Ctrl-C's handler is the one from before
    assert answers[0].completion_tokens == 1 and answers[0].finish_reason == "stop"
    assert len(answers) == 2 and signal.getsignal(signal.SIGINT) is before


def test_reset_forgets_and_the_end_of_input_leaves(chat_model, monkeypatch, capsys):
    model, tok = chat_model
    typed(monkeypatch, ["abc", "/reset", "", "dea"])
    seen = []
    real = cli.fit

    def fit(fmt, messages, block, room):
        seen.append([m["content"] for m in messages])
        return real(fmt, messages, block, room)
    monkeypatch.setattr(cli, "fit", fit)
    assert cli.chat_loop(model, tok, args(system="be brief", max_new_tokens=3)) == 0
    assert "forgotten" in capsys.readouterr().err
    # after /reset only the system message and the new line remain
    assert seen[0] == ["be brief", "abc"] and seen[1] == ["be brief", "dea"]
