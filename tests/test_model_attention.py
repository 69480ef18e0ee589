"""model/attention.py's CausalSelfAttention (the sdpa and manual paths, attention maps), every
position scheme of model/positions.py's table, and model/generate.py's KVCache."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from model.gpt import GPT
from model.attention import CausalSelfAttention
from model.positions import SCHEMES, Attend, apply_rope, rope_cos_sin
from model.generate import KVCache
from tests.helpers import model_variants




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


# ---- the modern settings: every combination attention sees, both paths --------------------------------------

def scheme_config(position, attention="sdpa"):
    """A tiny model of position scheme `position` with grouped-query heads (4 query, 2 key/value)
    and qk_norm, so that the scheme meets every head mapping attention has."""
    from model.config import GPTConfig
    return GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32, n_kv_head=2,
                     qk_norm=True, position=position, attention=attention)


# the modern settings' combinations, and one model per key of the position schemes' table
# (model/positions.py): a new scheme is tested by every test below without an edit here
VARIANTS = model_variants() + [(f"scheme-{name}", scheme_config(name)) for name in SCHEMES]
IDS = [name for name, _ in VARIANTS]
CONFIGS = [config for _, config in VARIANTS]


def spiky(config, attention="sdpa", seed=0):
    """A random model with weights large enough that every setting (norm gains, qk_norm gains) matters."""
    model = make_model(config, attention, seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() >= 2 else p.uniform_(0.5, 1.5)
    return model


def future_perturbations(config, seed=1, at=None):
    """(base ids (2, T), [(t, ids with every token after t changed)]) for t in 0..T-2, or for t = `at` only."""
    g = torch.Generator().manual_seed(seed)
    V, T = config.vocab_size, config.block_size
    idx = torch.randint(0, V, (2, T), generator=g)
    out = []
    for t in range(T - 1) if at is None else [at]:
        changed = idx.clone()
        changed[:, t + 1:] = (idx[:, t + 1:] + torch.randint(1, V, (2, T - t - 1), generator=g)) % V
        out.append((t, changed))
    return idx, out


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_setting_is_causal_exactly(config, attention):
    """A change to tokens after t changes no logit at or before t, bit for bit, on both paths."""
    model = spiky(config, attention)
    idx, perturbed = future_perturbations(config)
    with torch.no_grad():
        base, _ = model(idx)
        for t, changed in perturbed:
            logits, _ = model(changed)
            assert torch.equal(logits[:, :t + 1], base[:, :t + 1]), f"leak into t<={t}"
            assert not torch.equal(logits[:, t + 1:], base[:, t + 1:]), "the test must be sensitive"


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_setting_manual_equals_sdpa(config):
    sdpa, manual = spiky(config, "sdpa"), make_model(config, "manual", seed=123)
    manual.load_state_dict(sdpa.state_dict())
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, config.vocab_size, (3, config.block_size), generator=g)
    targets = torch.randint(0, config.vocab_size, idx.shape, generator=g)
    (logits_s, loss_s), (logits_m, loss_m) = sdpa(idx, targets), manual(idx, targets)
    assert (logits_s - logits_m).abs().max() <= 1e-4
    loss_s.backward()
    loss_m.backward()
    grads_m = dict(manual.named_parameters())
    for name, p in sdpa.named_parameters():
        assert torch.allclose(p.grad, grads_m[name].grad, atol=1e-5, rtol=1e-3), name


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_setting_has_attention_maps(config):
    model = spiky(config, "sdpa")
    idx = torch.randint(0, config.vocab_size, (2, 9))
    maps = model.attention_maps(idx)
    assert maps.shape == (config.n_layer, 2, config.n_head, 9, 9)
    assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)
    assert (maps.triu(diagonal=1) == 0).all()


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_setting_cached_chunks_match_full_forward(config, attention):
    """Prefill 5, a chunk of 4 (queries and keys of different lengths: an explicit mask), then
    single tokens: the full forward's logits, over all of a static cache's slots and over a dynamic
    cache's filled prefix."""
    model = spiky(config, attention)
    T = config.block_size
    idx = torch.randint(0, config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    for static in (True, False):
        cache = KVCache.for_model(model, batch_size=2, static=static)
        # the cache holds n_kv_head heads
        assert cache.k[0].shape == (2, config.kv_heads, T, config.head_size)
        with torch.no_grad():
            full, _ = model(idx)
            parts = [model(idx[:, :5], cache=cache, input_pos=torch.arange(5))[0],
                     model(idx[:, 5:9], cache=cache, input_pos=torch.arange(5, 9))[0]]
            parts += [model(idx[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]))[0]
                      for t in range(9, T)]
        assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-4, rtol=0), static


def on_path(model, attention):
    """`model` with every layer switched to the `attention` path (the attribute forward() reads), same weights."""
    for block in model.transformer.h:
        assert block.attn.attention in PATHS
        block.attn.attention = attention
    return model


@pytest.mark.slow
def test_the_full_product_of_settings_is_causal_and_paths_agree():
    """All 576 combinations (the quick set covers each attention combination and each per-position one); one
    model per combination, switched from one path to the other (building a model costs more than its forwards)."""
    for name, config in model_variants(exhaustive=True):
        model, manual_scores = spiky(config, "sdpa"), []  # only the manual path's scores pass through attn.scores
        model.transformer.h[-1].attn.scores.register_forward_hook(lambda *_: manual_scores.append(1))
        t = config.block_size // 2
        idx, [(_, changed)] = future_perturbations(config, at=t)
        with torch.no_grad():
            base, base_changed = model(idx)[0], model(changed)[0]
            assert not manual_scores
            manual, manual_changed = on_path(model, "manual")(idx)[0], model(changed)[0]
            assert len(manual_scores) == 2, name  # the switch took
        assert (base - manual).abs().max() <= 1e-4, name
        assert torch.equal(base_changed[:, :t + 1], base[:, :t + 1]), name
        assert torch.equal(manual_changed[:, :t + 1], manual[:, :t + 1]), name


def rope_by_complex_numbers(x, pos, theta):
    """RoPE as the paper writes it: pair (x_i, x_{i+d/2}) is the complex number x_i + j x_{i+d/2}, multiplied by
    e^{j pos theta^(-2i/d)}."""
    d = x.size(-1)
    z = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double())
    angle = pos.double()[:, None] * theta ** (-torch.arange(0, d, 2).double() / d)
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1).float()


def test_rope_rotates_pairs_by_position_and_keeps_relative_scores():
    x = torch.randn(2, 3, 7, 8)
    pos = torch.tensor([0, 1, 2, 5, 9, 40, 1000])
    rotated = apply_rope(x, *rope_cos_sin(pos, 8, 10000.0))
    assert torch.allclose(rotated, rope_by_complex_numbers(x, pos, 10000.0), atol=1e-5)
    assert torch.equal(apply_rope(x, *rope_cos_sin(torch.zeros(7, dtype=torch.long), 8, 10000.0)), x)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation keeps lengths
    q, k = torch.randn(2, 8)
    def score(m, n):  # q at position m . k at position n
        cos, sin = rope_cos_sin(torch.tensor([m, n]), 8, 10000.0)
        return (apply_rope(q[None], cos[:1], sin[:1]) * apply_rope(k[None], cos[1:], sin[1:])).sum()
    assert torch.allclose(score(3, 1), score(13, 11), atol=1e-5)  # depends on m - n only
    assert not torch.allclose(score(3, 1), score(3, 2), atol=1e-3)


def grouped_by_hand(attn: CausalSelfAttention, x, pos, theta):
    """Attention written head by head: q_norm/k_norm, the complex-number rotation, and query head h reading
    key/value head h // (n_head / n_kv_head); no repeat, no SDPA."""
    B, T, _ = x.shape
    hs, nh, nkv = attn.head_dim, attn.n_head, attn.n_kv_head
    q, k, v = (x @ attn.c_attn.weight.T).split([nh * hs, nkv * hs, nkv * hs], dim=-1)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    heads = []
    for h in range(nh):
        g = h // (nh // nkv)
        qh, kh, vh = q[..., h * hs:(h + 1) * hs], k[..., g * hs:(g + 1) * hs], v[..., g * hs:(g + 1) * hs]
        qh, kh = attn.q_norm(qh), attn.k_norm(kh)
        qh, kh = rope_by_complex_numbers(qh, pos, theta), rope_by_complex_numbers(kh, pos, theta)
        weights = torch.softmax((qh @ kh.transpose(-2, -1) / math.sqrt(hs)).masked_fill(~causal, float("-inf")), -1)
        heads.append(weights @ vh)
    return torch.cat(heads, dim=-1) @ attn.c_proj.weight.T


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_grouped_query_attention_with_rope_and_qk_norm_by_hand(tiny_gpt_config, attention, n_kv_head):
    config = dataclasses.replace(tiny_gpt_config, n_head=4, n_kv_head=n_kv_head, head_dim=6, position="rope",
                                 qk_norm=True, bias=False, attention=attention)
    torch.manual_seed(0)
    attn = CausalSelfAttention(config).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, mean=1.0 if p.dim() == 1 else 0.0, std=0.3)
    assert attn.c_attn.weight.shape == ((4 + 2 * n_kv_head) * 6, config.n_embd)
    x, pos = torch.randn(2, 7, config.n_embd), torch.arange(7)
    with torch.no_grad():
        y, _ = attn(x, at=Attend(rope_cos_sin(pos, 6, config.rope_theta), None))
        assert torch.allclose(y, grouped_by_hand(attn, x, pos, config.rope_theta), atol=1e-5, rtol=0)


# ---- the position schemes' table (model/positions.py) -------------------------------------------

def test_a_scheme_is_its_table_entry_only(monkeypatch):
    """A scheme added to the table alone (here the base entry: no position at all, NoPE) is a valid
    setting, builds, runs causally on both paths with the cache; export refuses it in one line."""
    from model.hf_llama import export_kind
    from model.positions import Position, export_family
    with pytest.raises(ValueError, match="position='nope' is not known"):
        scheme_config("nope")
    monkeypatch.setitem(SCHEMES, "nope", Position())
    config = scheme_config("nope")
    for attention in PATHS:
        test_every_setting_is_causal_exactly(config, attention)
        test_every_setting_cached_chunks_match_full_forward(config, attention)
    test_every_setting_manual_equals_sdpa(config)
    assert "wpe" not in GPT(config).transformer
    for fmt, name in (("hf", "Hugging Face"), ("gguf", "GGUF")):
        with pytest.raises(ValueError, match=f"^model.position=nope cannot be exported to {name}"):
            export_family(config, fmt)
    with pytest.raises(ValueError, match="^model.position=nope cannot be exported to Hugging Face"):
        export_kind(config)


def reference_alibi_slopes(n):
    """The ALiBi paper's get_slopes (ofirpress/attention_with_linear_biases), in float64."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    m = 2 ** math.floor(math.log2(n))
    return power_of_2(m) + reference_alibi_slopes(2 * m)[0::2][:n - m]


@pytest.mark.parametrize("attention", PATHS)
@pytest.mark.parametrize("n_head", [4, 6])
def test_alibi_adds_each_heads_slope_times_the_distance(tiny_gpt_config, attention, n_head):
    """ALiBi as the paper writes it, head by head: softmax(q_i.k_j / sqrt(hs) - m_h (i - j)) over
    j <= i, the slopes m_h the paper's (6 heads: not a power of two)."""
    from model.positions import alibi_slopes
    for n in (1, 2, 3, 4, 5, 6, 8, 12, 16, 20):
        assert torch.allclose(alibi_slopes(n), torch.tensor(reference_alibi_slopes(n)).float())
    config = dataclasses.replace(tiny_gpt_config, n_head=n_head, head_dim=8, position="alibi",
                                 attention=attention)
    torch.manual_seed(0)
    attn = CausalSelfAttention(config).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x, T, hs = torch.randn(2, 7, config.n_embd), 7, 8
    q, k, v = (x @ attn.c_attn.weight.T + attn.c_attn.bias).split(n_head * hs, dim=-1)
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    heads = []
    for h, m in enumerate(reference_alibi_slopes(n_head)):
        sl = slice(h * hs, (h + 1) * hs)
        scores = q[..., sl] @ k[..., sl].transpose(-2, -1) / math.sqrt(hs) - m * distance
        heads.append(torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v[..., sl])
    by_hand = torch.cat(heads, dim=-1) @ attn.c_proj.weight.T + attn.c_proj.bias
    with torch.no_grad():
        y, _ = attn(x, at=SCHEMES["alibi"].attend(config, torch.arange(T)))
    assert torch.allclose(y, by_hand, atol=1e-5, rtol=0)
