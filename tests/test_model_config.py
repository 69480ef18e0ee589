"""GPTConfig: validation names the bad field, and dict round-trips are strict."""
import dataclasses

import pytest

from model.config import MLPS, NORMS, POSITIONS, GPTConfig

GOOD = dict(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64)


def test_defaults_and_head_dim():
    c = GPTConfig(**GOOD)
    assert (c.dropout, c.bias, c.tie_weights, c.attention) == (0.0, True, True, "sdpa")
    assert (c.head_dim, c.head_size, c.n_kv_head, c.kv_heads, c.mlp_hidden, c.mlp_size) == (
        None, 16, None, 4, None, 256)
    assert (c.position, c.rope_theta, c.norm, c.norm_eps, c.mlp, c.qk_norm, c.logit_softcap) == (
        "learned", 10000.0, "layernorm", 1e-5, "gelu", False, None)  # GPT-2's


def test_modern_sizes_resolve():
    c = GPTConfig(**{**GOOD, "n_embd": 128}, mlp="swiglu", n_kv_head=2, head_dim=24, position="rope")
    assert (c.mlp_size, c.kv_heads, c.head_size) == (352, 2, 24)  # 8 * 128 / 3 = 341.3 -> a multiple of 32
    assert GPTConfig(**GOOD, mlp="swiglu", mlp_hidden=100).mlp_size == 100
    assert GPTConfig(**{**GOOD, "n_embd": 66}, head_dim=16).head_size == 16  # n_embd need not divide then


def test_old_checkpoint_dicts_load_as_gpt2():
    old = dict(GOOD, dropout=0.0, bias=True, tie_weights=True, attention="sdpa")  # before the modern keys
    assert GPTConfig.from_dict(old) == GPTConfig(**GOOD)


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
    (dict(position="no_such_position"), "position=.*" + ", ".join(POSITIONS)),
    (dict(norm="no_such_norm"), "norm=.*" + ", ".join(NORMS)),
    (dict(mlp="no_such_mlp"), "mlp=.*" + ", ".join(MLPS)),  # (not geglu: someone may add it)
    (dict(n_kv_head=3), "n_kv_head=3 does not divide n_head=4"),
    (dict(n_kv_head=0), "n_kv_head"),
    (dict(n_kv_head=2.0), "n_kv_head"),
    (dict(head_dim=0), "head_dim"),
    (dict(mlp_hidden=-4), "mlp_hidden"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(norm_eps=float("nan")), "norm_eps"),
    (dict(logit_softcap=-1.0), "logit_softcap"),
    (dict(logit_softcap="30"), "logit_softcap"),
    (dict(qk_norm="yes"), "qk_norm"),
    (dict(position="rope", head_dim=7), "position=rope needs an even head size"),
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
        "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights", "attention",
        "position", "rope_theta", "norm", "norm_eps", "mlp", "mlp_hidden", "n_kv_head", "head_dim", "qk_norm",
        "logit_softcap", "pad_vocab_to", "init_from"]
    assert "pad_vocab_to" not in GPTConfig(**GOOD).to_dict()  # how a run builds it, not the model's shape
