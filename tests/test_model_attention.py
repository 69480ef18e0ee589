"""model/gpt.py's CausalSelfAttention (the sdpa and manual paths, attention maps) and model/generate.py's KVCache."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT
from model.generate import KVCache
from model.gpt import CausalSelfAttention




PATHS = ["sdpa", "manual"]


def make_model(config, attention="sdpa", seed=0):
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(config, attention=attention)).eval()


@pytest.mark.parametrize("attention", PATHS)
def test_future_tokens_do_not_change_past_logits(tiny_gpt_config, attention):
    model = make_model(tiny_gpt_config, attention)
    g = torch.Generator().manual_seed(1)
    V, T = tiny_gpt_config.vocab_size, tiny_gpt_config.block_size
    idx = torch.randint(0, V, (2, T), generator=g)
    with torch.no_grad():
        base, _ = model(idx)
        for t in range(T - 1):
            changed = idx.clone()
            changed[:, t + 1:] = (idx[:, t + 1:] + torch.randint(1, V, (2, T - t - 1), generator=g)) % V
            logits, _ = model(changed)
            assert torch.allclose(logits[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0), f"leak into t<={t}"
            assert not torch.allclose(logits[:, t + 1:], base[:, t + 1:]), "the test must be sensitive"


def test_manual_and_sdpa_give_same_logits_and_gradients(tiny_gpt_config):
    sdpa = make_model(tiny_gpt_config, "sdpa")
    manual = make_model(tiny_gpt_config, "manual", seed=123)
    manual.load_state_dict(sdpa.state_dict())
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, tiny_gpt_config.vocab_size, (3, tiny_gpt_config.block_size), generator=g)
    targets = torch.randint(0, tiny_gpt_config.vocab_size, idx.shape, generator=g)
    logits_s, loss_s = sdpa(idx, targets)
    logits_m, loss_m = manual(idx, targets)
    assert (logits_s - logits_m).abs().max() <= 1e-5
    loss_s.backward()
    loss_m.backward()
    grads_m = dict(manual.named_parameters())
    for name, p in sdpa.named_parameters():
        assert torch.allclose(p.grad, grads_m[name].grad, atol=1e-6, rtol=1e-4), name


def per_head_by_hand(attn: CausalSelfAttention, x):
    """The 'wrapper of single heads' form: each head attends on its own slice, outputs concatenated."""
    B, T, C = x.shape
    hs = C // attn.n_head
    q, k, v = (x @ attn.c_attn.weight.T + attn.c_attn.bias).split(C, dim=-1)  # (B, T, C) each
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    heads = []
    for h in range(attn.n_head):
        sl = slice(h * hs, (h + 1) * hs)
        scores = q[..., sl] @ k[..., sl].transpose(-2, -1) / math.sqrt(hs)  # (B, T, T)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        heads.append(weights @ v[..., sl])  # (B, T, hs)
    return torch.cat(heads, dim=-1) @ attn.c_proj.weight.T + attn.c_proj.bias


@pytest.mark.parametrize("attention", PATHS)
def test_multi_head_equals_concatenated_single_heads(tiny_gpt_config, attention):
    config = dataclasses.replace(tiny_gpt_config, n_head=4, attention=attention)
    torch.manual_seed(0)
    attn = CausalSelfAttention(config).eval()
    for p in attn.parameters():  # non-trivial weights and biases
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 7, config.n_embd)
    with torch.no_grad():
        y, _ = attn(x)
        assert torch.allclose(y, per_head_by_hand(attn, x), atol=1e-5, rtol=0)


UNIFORM = torch.tensor([[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_zero_queries_and_keys_give_uniform_causal_weights(tiny_gpt_config):
    model = make_model(tiny_gpt_config, "sdpa")  # attention_maps uses the manual path regardless
    C = tiny_gpt_config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:2 * C].zero_()  # q and k rows of the fused projection
            block.attn.c_attn.bias[:2 * C].zero_()
    maps = model.attention_maps(torch.tensor([[3, 1, 4], [1, 5, 9]]))
    assert maps.shape == (tiny_gpt_config.n_layer, 2, tiny_gpt_config.n_head, 3, 3)
    assert torch.allclose(maps, UNIFORM.expand_as(maps), atol=1e-6)

    q = k = torch.zeros(1, 1, 3, 4)
    _, weights = model.transformer.h[0].attn.manual_attention(q, k, torch.randn(1, 1, 3, 4))
    assert torch.allclose(weights[0, 0], UNIFORM, atol=1e-6)


def test_attention_maps_are_causal_distributions_and_leave_mode_alone(tiny_gpt_config):
    model = make_model(dataclasses.replace(tiny_gpt_config, dropout=0.5))
    model.train()
    idx = torch.randint(0, tiny_gpt_config.vocab_size, (2, 10))
    maps = model.attention_maps(idx)
    assert torch.equal(maps, model.attention_maps(idx)), "dropout must be off"
    assert model.training
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-6)
    assert (maps.triu(diagonal=1) == 0).all()
    with pytest.raises(ValueError, match="block_size"):
        model.attention_maps(torch.zeros(1, tiny_gpt_config.block_size + 1, dtype=torch.long))


@pytest.mark.parametrize("attention", PATHS)
def test_cached_forward_matches_full_forward(tiny_gpt_config, attention):
    model = make_model(tiny_gpt_config, attention)
    T = tiny_gpt_config.block_size
    idx = torch.randint(0, tiny_gpt_config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    cache = KVCache.for_model(model, batch_size=2)
    with torch.no_grad():
        full, _ = model(idx)
        pre, _ = model(idx[:, :5], cache=cache, input_pos=torch.arange(5))  # prefill
        steps = [model(idx[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]))[0] for t in range(5, T)]
    assert torch.allclose(torch.cat([pre, *steps], dim=1), full, atol=1e-5, rtol=0)


def test_dropout_only_in_training_mode(tiny_gpt_config):
    for attention in PATHS:
        model = make_model(dataclasses.replace(tiny_gpt_config, dropout=0.3), attention)
        idx = torch.randint(0, tiny_gpt_config.vocab_size, (2, 8))
        assert torch.equal(model(idx)[0], model(idx)[0])
        model.train()
        assert not torch.equal(model(idx)[0], model(idx)[0])


def test_kv_cache_writes_at_explicit_positions():
    cache = KVCache(n_layer=2, batch_size=1, n_head=1, max_len=6, head_dim=2)
    assert len(cache.k) == len(cache.v) == 2 and cache.max_len == 6 and cache.batch_size == 1
    assert all(t.shape == (1, 1, 6, 2) for t in (*cache.k, *cache.v))  # one tensor per layer
    k = torch.ones(1, 1, 2, 2)
    k_all, v_all = cache.update(1, torch.tensor([3, 4]), k, 2 * k)
    assert k_all is cache.k[1] and v_all is cache.v[1]  # the layer's own buffers, written in place
    assert cache.k[1][0, 0, :, 0].tolist() == [0, 0, 0, 1, 1, 0]
    assert cache.v[1][0, 0, :, 0].tolist() == [0, 0, 0, 2, 2, 0]
    assert cache.k[0].abs().sum() == 0 and cache.v[0].abs().sum() == 0  # other layers untouched


def test_sdpa_causal_flag_matches_explicit_mask():
    """The two mask forms the sdpa path uses (is_causal / boolean mask) agree."""
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.arange(5)[None, :] <= torch.arange(5)[:, None]
    assert torch.allclose(causal, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6)
