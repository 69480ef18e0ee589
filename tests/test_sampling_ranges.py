"""One answer per question: each sample.py flag whose help states a range ("0 < P <= 1", "K >= 0")
accepts exactly that range, both ends probed just inside and just outside; and the filters' "off"
values (top-k 0, top-p 1, min-p 0) keep every token, as leaving the flag out does (Hugging Face's
and llama.cpp's meaning)."""
from __future__ import annotations

import re

import pytest
import torch

import sample
from model.generate import logits_to_probs
from model.sampling import Sampling
from tests.helpers import save_run, tiny_model

BOUND = r"(-?\d+(?:\.\d+)?(?:\^\d+)?)"  # 0, 1, 0.5, 2^64


class Captured(Exception):
    pass


def sample_flags(monkeypatch) -> list:
    """sample.py's argparse actions, as its parser is built."""
    parsers = []

    class Capture(sample.ArgumentParser):
        def parse_args(self, *a, **k):
            parsers.append(self)
            raise Captured

    monkeypatch.setattr(sample, "ArgumentParser", Capture)
    with pytest.raises(Captured):
        sample.parse_args([])
    return [a for a in parsers[0]._actions if a.option_strings and a.help and a.metavar]


def stated_range(action) -> list[tuple[str, float]]:
    """The help's range of the action's METAVAR as (operator, bound) pairs seen from METAVAR:
    'a <= X < b' gives [('>=', a), ('<', b)]; 'X >= a' gives [('>=', a)]."""
    x = re.escape(action.metavar)
    m = re.search(rf"(?:{BOUND} (<=?) )?\b{x} (<=?|>=?) {BOUND}", action.help)
    if m is None:
        return []

    def number(text: str):
        if action.type is not int:
            return float(text)
        return 2 ** int(text[2:]) if text.startswith("2^") else int(text)
    flipped = {"<": ">", "<=": ">="}
    return ([(flipped[m[2]], number(m[1]))] if m[1] else []) + [(m[3], number(m[4]))]


def accepted(flag: str, value) -> bool:
    try:
        sample.parse_args([f"{flag}={value}"])
    except ValueError:
        return False
    return True


def test_every_stated_range_is_what_the_check_accepts(monkeypatch):
    flags = sample_flags(monkeypatch)
    monkeypatch.undo()
    probed = set()
    for action in flags:
        flag = action.option_strings[0]
        step = 1 if action.type is int else 1e-6
        for op, bound in stated_range(action):
            outward = -step if ">" in op else step  # the direction that leaves the range
            edge_in, past = ("=" in op), bound + outward
            inside = bound if edge_in else bound - outward
            assert accepted(flag, inside), f"{flag} {inside}: its help says {action.help!r}"
            outside = past if edge_in else bound
            assert not accepted(flag, outside), f"{flag} {outside}: its help says {action.help!r}"
            probed.add(flag)
    assert probed >= {"--temperature", "--top-k", "--top-p", "--min-p", "--max-new-tokens",
                      "--num-samples", "--seed"}


def test_off_values_keep_every_token_as_leaving_the_flag_out():
    logits = torch.tensor([[1.0, 3.0, 0.5, 2.0, -1.0]])
    plain = torch.softmax(logits, -1)
    tokens = torch.tensor([[1, 3]])
    for off in (dict(top_k=0), dict(top_p=1.0), dict(min_p=0), dict(min_p=0.0),
                dict(repetition_penalty=1.0)):
        # stored as left out: one meaning, whoever reads it
        assert Sampling(**off) == Sampling()
        assert torch.allclose(logits_to_probs(logits, tokens, Sampling(**off)), plain)
    assert Sampling(top_k=0, temperature=0.7) == Sampling(temperature=0.7)
    wrongs = (dict(top_k=-1), dict(top_k=True), dict(top_k=2.5), dict(min_p=-0.01), dict(top_p=0))
    for wrong in wrongs:
        with pytest.raises(ValueError):
            Sampling(**wrong)


def test_sample_py_top_k_0_and_min_p_0_sample_as_without_them(tmp_path, capsys, tiny_corpus):
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(tiny_corpus.read_text())
    save_run(tmp_path / "run", tiny_model(tok.vocab_size), tok)
    texts = []
    offs = ([], ["--top-k", "0"], ["--min-p", "0"],
            ["--top-k", "0", "--min-p", "0", "--top-p", "1"])
    common = ["--run", str(tmp_path / "run"), "--prompt", "KING:", "--max-new-tokens", "30",
              "--seed", "7", "--temperature", "1.0", "--device", "cpu"]
    for extra in offs:
        assert sample.main([*common, *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1 and texts[0].startswith("KING:")
