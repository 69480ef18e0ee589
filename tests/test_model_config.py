"""GPTConfig: validation names the bad field, and dict round-trips are strict."""
import dataclasses

import pytest

from model import GPTConfig

GOOD = dict(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64)


def test_defaults_and_head_dim():
    c = GPTConfig(**GOOD)
    assert (c.dropout, c.bias, c.tie_weights, c.attention) == (0.0, True, True, "sdpa")
    assert c.head_dim == 16


def test_to_dict_from_dict_round_trip():
    c = GPTConfig(**GOOD, dropout=0.1, bias=False, tie_weights=False, attention="manual")
    d = c.to_dict()
    assert type(d) is dict and d["attention"] == "manual"
    assert GPTConfig.from_dict(d) == c


@pytest.mark.parametrize("change, field", [
    (dict(vocab_size=0), "vocab_size"),
    (dict(block_size=-1), "block_size"),
    (dict(n_layer=0), "n_layer"),
    (dict(n_head=0), "n_head"),
    (dict(n_embd=0), "n_embd"),
    (dict(n_embd=66), "n_embd"),  # not divisible by n_head=4
    (dict(n_layer=2.5), "n_layer"),
    (dict(n_layer=True), "n_layer"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=float("nan")), "dropout"),
    (dict(dropout="0.1"), "dropout"),
    (dict(bias="yes"), "bias"),
    (dict(tie_weights=1), "tie_weights"),
    (dict(attention="flash"), "attention"),
])
def test_bad_config_raises_value_error_naming_the_field(change, field):
    with pytest.raises(ValueError, match=field) as info:
        GPTConfig(**{**GOOD, **change})
    assert "\n" not in str(info.value)  # one-line messages, per the error convention


def test_divisibility_message_suggests_a_fix():
    with pytest.raises(ValueError, match=r"n_embd=66 is not divisible by n_head=4.*n_embd=64"):
        GPTConfig(**{**GOOD, "n_embd": 66})


def test_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match="n_embed"):
        GPTConfig.from_dict({**GOOD, "n_embed": 64})
    partial = dict(GOOD)
    del partial["n_head"]
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig.from_dict(partial)


def test_config_is_a_plain_dataclass():
    assert dataclasses.is_dataclass(GPTConfig)
    assert [f.name for f in dataclasses.fields(GPTConfig)] == [
        "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights", "attention"]
