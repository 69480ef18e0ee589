"""viz/explorer/request.py and the next-token list: an ambiguous or mistyped field is one line (never a guess), the
body is strict JSON (an /api/lens body too), two models are named in their errors, and `next` lists only tokens that can be drawn, with
finite probabilities whatever the logits and the temperature."""
from __future__ import annotations

import json

import pytest
import torch

from model.sampling import Sampling
from tests.helpers import tiny_model
from tests.test_explore import char_tok  # noqa: F401 (fixture)
from viz.explorer.model_view import ModelView, next_tokens
from viz.explorer.request import LENS_FIELDS, RequestError, parse_request


@pytest.fixture
def views(char_tok):
    return [ModelView(tiny_model(char_tok.vocab_size, 0, n_layer=3, block_size=32), char_tok, "a"),
            ModelView(tiny_model(char_tok.vocab_size, 1, n_layer=2, block_size=16), char_tok, "b")]


def refusal(body, views) -> str:
    with pytest.raises(RequestError) as e:
        parse_request(body if isinstance(body, bytes) else json.dumps(body).encode(), views)
    assert e.value.status == 400 and "\n" not in str(e.value)
    return str(e.value)


AMBIGUOUS_OR_MISTYPED = [
    ({"text": "ROMEO", "ids": [1, 2]}, 'give "text" or "ids", not both'),
    ({"text": "ROMEO", "scores": "no"}, "scores 'no' is invalid: use true or false"),
    ({"text": "ROMEO", "logits": 1}, "logits 1 is invalid: use true or false"),
    ({"text": "ROMEO", "model": 1.0}, "model 1.0 does not exist"),
    ({"text": "ROMEO", "model": True}, "model True does not exist"),
    ({"text": "ROMEO", "top_k": 3.0}, "top_k=3.0 is invalid"),
    ({"text": "ROMEO", "top_k": True}, "top_k=True is invalid"),
    ({"text": "ROMEO", "temperature": None}, "temperature=None is invalid"),
    ({"text": "ROMEO", "layers": [0.0]}, "layers must be a list of layer numbers"),
    ({"text": "ROMEO", "layers": [1, 0, 1]}, "layer 1 is asked twice: list each layer once"),
    ({"ids": [1.0, 2]}, "ids must be a list of token ids"),
    ({"text": "RO\ud800MEO"}, "the text holds a lone surrogate ('\\ud800')"),
    (b'{"text": "ROMEO", "text": "KING"}', "the field 'text' is given twice"),
    (b'{"text": "ROMEO", "temperature": NaN}', "holds NaN, which is not JSON"),
    (b'{"text": "ROMEO", "top_k": Infinity}', "holds Infinity, which is not JSON"),
    (b'{"text": "ROMEO", "temperature": -Infinity}', "holds -Infinity, which is not JSON"),
]


@pytest.mark.parametrize("body,words", AMBIGUOUS_OR_MISTYPED, ids=[w[:30] for _, w in AMBIGUOUS_OR_MISTYPED])
def test_an_ambiguous_or_mistyped_field_is_one_line(views, body, words):
    assert words in refusal(body, views)


def test_two_models_errors_name_the_model(views):
    assert parse_request(b'{"text": "ROMEO", "model": 1}', views)["view"] is views[1]
    message = refusal({"text": "ROMEO:\nThe king is good", "model": 1}, views)  # 23 tokens: A's 32 fit, B's 16 not
    assert message.startswith("model B: the text is 23 tokens, longer than the model's context of 16"), message
    assert refusal({"text": "R" * 33}, views).startswith("model A: ")
    assert refusal({"text": "R" * 33}, views[:1]).startswith("the text is 33 tokens")  # one model: no name


LENS_REFUSED = [({"text": "ROMEO", "top": 21}, "top 21 is invalid: use a whole number from 1 to 20"),
                ({"text": "ROMEO", "top": 2.0}, "top 2.0 is invalid"), ({"text": "ROMEO", "top": True}, "top True"),
                ({"text": "ROMEO", "layers": [0]}, "unknown field 'layers': use ids, model, text, top"),
                ({"text": "ROMEO", "ids": [1]}, 'give "text" or "ids", not both'),
                ({"text": "R" * 17, "model": 1}, "model B: the text is 17 tokens, longer than the model's context")]


@pytest.mark.parametrize("body,words", LENS_REFUSED, ids=[w[:30] for _, w in LENS_REFUSED])
def test_a_lens_request_is_as_strict(views, body, words):
    assert parse_request(b'{"text": "ROMEO"}', views, LENS_FIELDS) == {"view": views[0], "top": 5,
                                                                      "ids": views[0].encode("ROMEO")}
    with pytest.raises(RequestError) as e:
        parse_request(json.dumps(body).encode(), views, LENS_FIELDS)
    assert e.value.status == 400 and words in str(e.value)


def test_the_sampling_settings_are_the_api_fields(views):
    """The API takes each of model/sampling.py's settings (SETTINGS) under its own name, checked as Sampling checks
    it: a setting added there is a field here, with its one-line error."""
    body = {"text": "ROMEO", "temperature": 0.5, "top_k": 3, "top_p": 0.9, "min_p": 0.1}
    assert parse_request(json.dumps(body).encode(), views)["sampling"] == Sampling(0.5, 3, 0.9, 0.1)
    assert parse_request(b'{"text": "ROMEO", "top_k": null}', views)["sampling"] == Sampling()
    assert "top_p=1.5 is outside (0, 1]: use e.g. top_p=0.9" in refusal({"text": "ROMEO", "top_p": 1.5}, views)
    assert "min_p='0.1' is outside [0, 1]: use e.g. min_p=0.05" in refusal({"text": "ROMEO", "min_p": "0.1"}, views)
    assert "vocab_limit" in refusal({"text": "ROMEO", "vocab_limit": 3}, views)  # not a user's: no field


def test_next_lists_only_tokens_that_can_be_drawn():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    ids = [3]  # the text's tokens, which a rule may read
    assert [i for i, _ in next_tokens(logits, ids, Sampling(1.0, top_k=3))] == [0, 1, 2]
    # e^-1 = 0.37, e^-1.5 = 0.22
    assert [i for i, _ in next_tokens(logits, ids, Sampling(1.0, min_p=0.3))] == [0, 1]
    assert next_tokens(logits, ids, Sampling(0)) == [(0, 1.0)]
    assert len(next_tokens(logits, ids, Sampling())) == 6
    assert len(next_tokens(logits, ids, Sampling(), n=4)) == 4


@pytest.mark.parametrize("logits,temperature", [
    ([2.0, 1.0, 0.5], 1e-45), ([2.0, 1.0, 0.5], 5e-324), ([-2.0, -1.0, -0.5], 1e-45),  # a temperature too small
    ([3e38, -3e38, 1.0], 0.5), ([3e38, 3e38, 0.0], 1.0),  # logits the division overflows
], ids=["tiny", "denormal", "negative", "overflow", "overflow_ties"])
def test_next_never_holds_a_non_finite_probability(logits, temperature):
    for top_k in (None, 2):
        out = next_tokens(torch.tensor(logits), [0], Sampling(temperature, top_k))
        assert all(0 < p <= 1 for _, p in out) and sum(p for _, p in out) <= 1 + 1e-6, out
        json.dumps(out, allow_nan=False)
