"""model/generate.py, the sampling ladder: logits_to_probs filters, reproducible sampling, cached == uncached
generation past the context; nanoGPT's `from model import GPT, GPTConfig` and model.generate (docs/model.md)."""
import dataclasses

import pytest
import torch

from common.cli import in_keys
from model.gpt import GPT
from model.generate import generate, generate_tokens, logits_to_probs, sample
from model.sampling import Sampling

GREEDY = Sampling(temperature=0)


def spiky_model(config, seed=0):
    """A random model with large weights: well-separated logits, so argmax ties cannot hide bugs."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


DECODERS = {  # GPT-2's decoder and modern ones: the cache must hold n_kv_head heads, rotated at the right offsets
    "gpt2": {},
    "rope-gqa-qknorm": dict(position="rope", norm="rmsnorm", mlp="swiglu", n_head=4, n_kv_head=2, qk_norm=True,
                            bias=False, tie_weights=False),
    "rope-mqa-relu2-softcap": dict(position="rope", mlp="relu2", n_head=4, n_kv_head=1, head_dim=12,
                                   logit_softcap=10.0),
}


@pytest.fixture(params=list(DECODERS), ids=list(DECODERS))
def decoder_config(request, tiny_gpt_config):
    return dataclasses.replace(tiny_gpt_config, **DECODERS[request.param])


# ---- logits_to_probs ------------------------------------------------------------------------

def test_temperature_zero_is_one_hot_argmax():
    probs = logits_to_probs(torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]]), Sampling(temperature=0))
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(logits_to_probs(logits, Sampling(1.0)), torch.softmax(logits, -1))
    assert torch.allclose(logits_to_probs(logits, Sampling(0.5)), torch.softmax(logits / 0.5, -1))
    hot, cold = logits_to_probs(logits, Sampling(10.0)), logits_to_probs(logits, Sampling(0.1))
    assert hot.max() < 0.4 and cold.max() > 0.99


def test_top_k_keeps_k_tokens_and_is_clamped():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    probs = logits_to_probs(logits, Sampling(top_k=2))
    assert (probs > 0).tolist() == [[False, True, True, False]]
    assert torch.allclose(probs.sum(), torch.tensor(1.0))
    assert torch.allclose(logits_to_probs(logits, Sampling(top_k=100)), torch.softmax(logits, -1))  # clamped to V


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()[[2, 0, 3, 1]]  # shuffled: [0.1, 0.6, 0.05, 0.25]
    assert (logits_to_probs(logits, Sampling(top_p=0.7)) > 0).tolist() == [False, True, False, True]  # 0.6 + 0.25
    assert (logits_to_probs(logits, Sampling(top_p=0.9)) > 0).tolist() == [True, True, False, True]  # + 0.1
    assert (logits_to_probs(logits, Sampling(top_p=0.5)) > 0).tolist() == [False, True, False, False]
    assert (logits_to_probs(logits, Sampling(top_p=1e-9)) > 0).tolist() == [False, True, False, False]  # top kept
    assert torch.allclose(logits_to_probs(logits, Sampling(top_p=1.0)), torch.softmax(logits, -1))
    kept = logits_to_probs(logits, Sampling(top_p=0.7))
    assert torch.allclose(kept[[1, 3]], torch.tensor([0.6, 0.25]) / 0.85)  # renormalised


def test_top_p_boundary_is_inclusive():
    logits = torch.tensor([0.125, 0.5, 0.125, 0.25]).log()  # powers of two: exact in float32
    assert (logits_to_probs(logits, Sampling(top_p=0.75)) > 0).tolist() == [False, True, False, True]  # 0.5 + 0.25
    assert (logits_to_probs(logits, Sampling(top_p=0.5)) > 0).tolist() == [False, True, False, False]


def test_top_k_then_top_p_compose():
    logits = torch.tensor([[0.6, 0.25, 0.1, 0.05]]).log()
    probs = logits_to_probs(logits, Sampling(top_k=3, top_p=0.95))  # top-k renormalises to 0.6/0.95, ...
    assert (probs > 0).tolist() == [[True, True, True, False]]


def test_min_p_keeps_tokens_at_least_min_p_times_the_top_one():
    """min_p: the tokens with probability >= min_p x the top token's (boundary included), renormalised; 0 and None
    keep every token. By hand, with powers of two (exact in float32)."""
    probs = torch.tensor([0.125, 0.5, 0.03125, 0.25, 0.09375])
    logits = probs.log()
    kept = logits_to_probs(logits, Sampling(min_p=0.25))  # 0.25 x 0.5 = 0.125: 0.125 stays, 0.09375 goes
    assert torch.equal(kept, torch.tensor([0.125, 0.5, 0, 0.25, 0]) / 0.875)
    assert (logits_to_probs(logits, Sampling(min_p=0.5)) > 0).tolist() == [False, True, False, True, False]
    assert (logits_to_probs(logits, Sampling(min_p=1.0)) > 0).tolist() == [False, True, False, False, False]
    plain = logits_to_probs(logits)
    assert torch.equal(logits_to_probs(logits, Sampling(min_p=0)), plain)
    assert torch.equal(logits_to_probs(logits, Sampling(min_p=0.01)), plain)  # 0.03125 >= 0.005: all stay


def test_min_p_comes_after_the_temperature_and_top_p():
    """HF's order (MinPLogitsWarper after TemperatureLogitsWarper and TopPLogitsWarper): at temperature T a token
    stays if (p / p_top) ** (1 / T) >= min_p; top-p first, on the whole distribution."""
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    assert (logits_to_probs(logits, Sampling(min_p=0.4)) > 0).tolist() == [True, True, False, False]  # 0.25 < 0.4
    hot = logits_to_probs(logits, Sampling(2.0, min_p=0.4))  # (1/4) ** (1/2) = 0.5 >= 0.4: the 0.125s stay
    assert torch.allclose(hot, torch.tensor([2 ** 0.5, 1, 0.5 ** 0.5, 0.5 ** 0.5]) / (2 ** 0.5 + 1 + 2 * 0.5 ** 0.5))
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    both = logits_to_probs(logits, Sampling(top_p=0.75, min_p=0.4))  # top-p keeps 3 (0.4 + 0.3 < 0.75), min-p 3
    assert torch.allclose(both, torch.tensor([0.4, 0.3, 0.2, 0]) / 0.9)  # (min-p first: top-p would keep only 2)


TINY_TEMPERATURES = [1e-45, 5e-324, 1e-39, 1e-38, 1e-30, 1e-10]  # below float32's smallest normal number, and above
FILTERS = [dict(), dict(top_k=3), dict(top_p=0.5), dict(top_k=3, top_p=0.9), dict(vocab_limit=5),
           dict(top_k=2, top_p=0.99, vocab_limit=5), dict(min_p=0.1),
           dict(top_k=4, top_p=0.95, min_p=0.5, vocab_limit=5)]


@pytest.mark.parametrize("kw", FILTERS, ids=lambda kw: ",".join(kw) or "plain")
def test_a_tiny_positive_temperature_samples_as_greedy(kw):
    """Was NaN probabilities (logits / 1e-45 overflow, inf - inf in the softmax) and garbage tokens: the argmax's
    one-hot now, with no random draw below float32's smallest normal number (the generator is left as it was)."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0, 0.5, 9.0], [-2.0, 0.0, 2.5, 2.0, 1.0, 9.0]])
    greedy = logits_to_probs(logits, Sampling(0, **kw))
    for t in TINY_TEMPERATURES:
        assert torch.equal(logits_to_probs(logits, Sampling(t, **kw)), greedy), t
        g = torch.Generator().manual_seed(0)
        state = g.get_state()
        assert torch.equal(sample(logits, Sampling(t, **kw), generator=g), sample(logits, Sampling(0, **kw))), t
        assert torch.equal(g.get_state(), state) == (t < torch.finfo(torch.float32).tiny), t


@pytest.mark.parametrize("kw", FILTERS, ids=lambda kw: ",".join(kw) or "plain")
def test_no_temperature_gives_nan_even_with_huge_logits(kw):
    """Any accepted temperature, with logits far apart and a huge one (a diverging model), gives probabilities:
    finite, summing to 1, zero where the filters and the vocabulary limit say so."""
    logits = torch.tensor([[3e38, -3e38, 1.0, 2.0, 0.0, 5.0], [1e30, 1e30, -1e30, 0.0, 1.0, 2.0]])
    for t in [*TINY_TEMPERATURES, 1e-5, 0.8, 1.0, 1e30, 3.4e38, 1e39, 1e300, 10**400]:
        probs = logits_to_probs(logits, Sampling(t, **kw))
        assert probs.isfinite().all() and (probs >= 0).all(), (t, probs)
        assert torch.allclose(probs.sum(-1), torch.ones(2)), (t, probs)
        if "vocab_limit" in kw:
            assert (probs[:, 5:] == 0).all(), t
    assert logits_to_probs(logits[1:], Sampling(1e-30))[0].tolist() == [0.5, 0.5, 0, 0, 0, 0]  # ties share the mass
    hot = logits_to_probs(torch.tensor([1.0, 2.0, 3.0, float("-inf")]), Sampling(1e300))  # the -inf 0, the rest even
    assert torch.allclose(hot, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p="0.1"), "min_p"),
    (dict(min_p=True), "min_p"),
])
def test_bad_sampling_parameters_raise(kwargs, field):
    """Checked once, where the settings are made (model/sampling.py): one line naming the setting as the caller
    spells it (sample.py's flags, the explorer's fields: in_keys); every function downstream takes them checked."""
    with pytest.raises(ValueError, match=f"^{field}=") as e:
        Sampling(**kwargs)
    assert "\n" not in str(e.value)
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} "), in_keys({field: flag}):
        Sampling(**kwargs)


# ---- vocab_limit (a padded vocabulary: ids no tokenizer knows) -------------------------------

def test_vocab_limit_gives_padded_ids_zero_probability():
    logits = torch.tensor([[1.0, 2.0, 9.0, 8.0], [3.0, 1.0, 0.0, 7.0]])
    probs = logits_to_probs(logits, Sampling(vocab_limit=2))
    assert (probs[:, 2:] == 0).all() and torch.allclose(probs[:, :2], torch.softmax(logits[:, :2], -1))
    assert logits_to_probs(logits, Sampling(temperature=0, vocab_limit=2)).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert sample(logits, Sampling(temperature=0, vocab_limit=2)).tolist() == [[1], [0]]
    g = torch.Generator().manual_seed(0)
    assert (sample(logits.repeat(1000, 1), Sampling(top_k=3, top_p=0.99, vocab_limit=2), generator=g) < 2).all()
    assert torch.equal(logits_to_probs(logits, Sampling(vocab_limit=4)), logits_to_probs(logits))  # no padding: no-op
    assert logits[0, 2] == 9.0  # the caller's logits are not modified


@pytest.mark.parametrize("vocab_limit", [0, -1, 2.5, True])
def test_bad_vocab_limit_raises(vocab_limit):
    with pytest.raises(ValueError, match="vocab_limit"):
        Sampling(vocab_limit=vocab_limit)


def _mask_hook(model, vocab_limit):
    """What sample.py did before vocab_limit: -inf on the padded logits on the way out of lm_head."""
    def hook(module, inputs, logits):
        logits[..., vocab_limit:] = float("-inf")
        return logits
    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_vocab_limit_samples_what_the_old_lm_head_hook_did(tiny_gpt_config, use_kv_cache):
    """Same seed, same tokens: vocab_limit is a drop-in for sample.py's old forward hook, and it matters."""
    limit = tiny_gpt_config.vocab_size - 8
    model = spiky_model(tiny_gpt_config)
    with torch.no_grad():
        model.transformer.wte.weight[limit:] *= 3  # tied head: padded ids would often win
    idx = torch.zeros(2, 3, dtype=torch.long)
    n = 2 * tiny_gpt_config.block_size  # the window slides
    for kw in (dict(temperature=0), dict(temperature=1.5, top_k=20, top_p=0.95)):
        def run(**extra):
            return generate(model, idx, n, Sampling(**kw, **extra), use_kv_cache=use_kv_cache,
                            generator=torch.Generator().manual_seed(3))
        new = run(vocab_limit=limit)
        assert (new[:, 3:] < limit).all()
        assert (run()[:, 3:] >= limit).any(), "the test must be sensitive: without a limit padded ids are drawn"
        handle = _mask_hook(model, limit)
        try:
            assert torch.equal(new, run())
        finally:
            handle.remove()
        stream = generate_tokens(model, idx, n, Sampling(**kw, vocab_limit=limit), use_kv_cache=use_kv_cache,
                                 generator=torch.Generator().manual_seed(3))
        assert torch.equal(torch.cat([idx, *stream], dim=1), new)


# ---- sample ---------------------------------------------------------------------------------

def test_sample_is_reproducible_and_follows_probs():
    logits = torch.tensor([0.5, 0.3, 0.2, 0.0]).log().expand(40_000, 4)
    a = sample(logits, generator=torch.Generator().manual_seed(7))
    b = sample(logits, generator=torch.Generator().manual_seed(7))
    assert a.shape == (40_000, 1) and a.dtype == torch.long and torch.equal(a, b)
    freq = torch.bincount(a.flatten(), minlength=4).float() / 40_000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.015)
    assert not torch.equal(a, sample(logits, generator=torch.Generator().manual_seed(8)))
    assert torch.equal(sample(logits[:3], GREEDY), torch.zeros(3, 1, dtype=torch.long))


# ---- generation -----------------------------------------------------------------------------

def reference_generate(model, idx, max_new_tokens, pick=lambda logits: logits.argmax(-1, keepdim=True),
                       keep=None):
    """The documented overflow strategy, written out: crop the prompt to block_size; when the window
    would exceed block_size, restart it at the last `keep` (default block_size // 2) tokens."""
    block = model.config.block_size
    keep = keep or block // 2
    seq, start = idx, max(0, idx.size(1) - block)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if seq.size(1) - start > block:
                start = seq.size(1) - keep
            logits, _ = model(seq[:, start:])
            seq = torch.cat([seq, pick(logits[:, -1])], dim=1)
    return seq


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_cached_equals_uncached_past_block_size(decoder_config, attention, batch):
    model = spiky_model(dataclasses.replace(decoder_config, attention=attention))
    n = 3 * decoder_config.block_size
    idx = torch.randint(0, decoder_config.vocab_size, (batch, 5), generator=torch.Generator().manual_seed(1))
    cached = generate(model, idx, n, GREEDY)
    uncached = generate(model, idx, n, GREEDY, use_kv_cache=False)
    assert cached.shape == (batch, 5 + n) and torch.equal(cached[:, :5], idx)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, reference_generate(model, idx, n))


def test_rotary_positions_advance_once_per_step_not_per_layer(tiny_gpt_config, monkeypatch):
    """One rotation per forward, shared by the layers, at the cache's explicit positions: a prefill at 0..T-1,
    then one position further per token, back to 0 when the window slides (flash-linear-attention #766)."""
    from model import gpt
    config = dataclasses.replace(tiny_gpt_config, n_layer=3, **DECODERS["rope-gqa-qknorm"])
    model, calls, forwards, real = spiky_model(config), [], [], gpt.rope_cos_sin
    monkeypatch.setattr(gpt, "rope_cos_sin", lambda pos, *a: calls.append(pos.tolist()) or real(pos, *a))
    model.register_forward_pre_hook(lambda m, args, kw: forwards.append(kw["input_pos"].tolist()), with_kwargs=True)
    generate(model, torch.tensor([[1, 2, 3]]), 3 * config.block_size, GREEDY)
    assert calls == forwards and len(calls) == 3 * config.block_size
    for before, now in zip(calls, calls[1:]):
        assert now == list(range(len(now))) or now == [before[-1] + 1], (before, now)
    assert sum(c[0] == 0 for c in calls) >= 3  # the prompt's prefill and two slides


@pytest.mark.slow  # over ~1 s in all
def test_sampling_with_same_generator_is_identical_cached_and_uncached(decoder_config):
    model = spiky_model(decoder_config)
    idx = torch.zeros(2, 3, dtype=torch.long)
    n, s = 3 * decoder_config.block_size, Sampling(temperature=2.0, top_k=20, top_p=0.95, min_p=0.01)
    a = generate(model, idx, n, s, generator=torch.Generator().manual_seed(5))
    b = generate(model, idx, n, s, use_kv_cache=False, generator=torch.Generator().manual_seed(5))
    c = generate(model, idx, n, s, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)

    def ref(keep):
        g = torch.Generator().manual_seed(5)
        return reference_generate(model, idx, n, lambda logits: sample(logits, s, generator=g), keep=keep)
    assert torch.equal(a, ref(keep=None))  # exactly the documented windows...
    assert not torch.equal(a, ref(keep=decoder_config.block_size))  # ...which do matter (sensitivity)


def test_prompt_longer_than_block_size_is_cropped_consistently(decoder_config):
    model = spiky_model(decoder_config)
    idx = torch.randint(0, 32, (1, 2 * decoder_config.block_size + 3))
    out = generate(model, idx, 20, GREEDY)
    assert torch.equal(out, generate(model, idx, 20, GREEDY, use_kv_cache=False))
    assert torch.equal(out, reference_generate(model, idx, 20))


def test_stream_yields_b_by_1_tokens_matching_generate(tiny_gpt_config):
    model = spiky_model(tiny_gpt_config)
    idx = torch.zeros(2, 1, dtype=torch.long)
    stream = generate_tokens(model, idx, 10, GREEDY)
    tokens = list(stream)
    assert len(tokens) == 10 and all(t.shape == (2, 1) and t.dtype == torch.long for t in tokens)
    assert torch.equal(torch.cat([idx, *tokens], 1), generate(model, idx, 10, GREEDY))
    assert torch.equal(generate(model, idx, 0), idx)


def test_generation_does_not_leak_no_grad(tiny_gpt_config):
    model = spiky_model(tiny_gpt_config)
    stream = generate_tokens(model, torch.zeros(1, 1, dtype=torch.long), 3)
    next(stream)
    assert torch.is_grad_enabled()  # no_grad is active only while the generator runs


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling=0.8), r"sampling=0.8 is not a Sampling: pass e.g. Sampling\(temperature=0.8"),  # (was temperature)
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(idx=torch.zeros(1, 0, dtype=torch.long)), "empty"),
    (dict(idx=torch.zeros(4, dtype=torch.long)), "batch, time"),
    (dict(decode=lambda *args, **kw: None, use_kv_cache=False), "a compiled or CUDA-graph decode step needs the KV"),
])
def test_bad_generation_arguments_raise_at_call_time(tiny_gpt_config, kwargs, match):
    model = GPT(tiny_gpt_config)
    args = {"idx": torch.zeros(1, 1, dtype=torch.long), "max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate_tokens(model, **args)  # an iterator, but validated before the first token


def test_the_cache_holds_only_the_slots_a_generation_can_fill(monkeypatch):
    """A 40,960-token context (Qwen3's) must not be allocated whole for a short sample: the cache gets the
    prompt plus the new tokens (at most block_size), and its tokens are the uncached ones."""
    from model import generate as gen
    from model.config import GPTConfig
    sizes, init = [], gen.KVCache.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        sizes.append(self.max_len)
    monkeypatch.setattr(gen.KVCache, "__init__", spy)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=40960, n_layer=2, n_head=2, n_embd=16, position="rope",
                          n_kv_head=1)).eval()
    idx = torch.tensor([[1, 2, 3]])
    cached = generate(model, idx, 5, GREEDY)
    assert sizes == [8]
    assert torch.equal(cached, generate(model, idx, 5, GREEDY, use_kv_cache=False))
    small = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=16, position="rope")).eval()
    generate(small, idx, 9, GREEDY)  # longer than the context: block_size slots, the window slides
    assert sizes[-1] == 4


# ---- nanoGPT's habits: `from model import GPT, GPTConfig` and model.generate ---------------------------

def test_model_generate_is_nanogpts(tiny_gpt_config):
    """model.generate(idx, max_new_tokens, temperature, top_k): the prompt and the new tokens, (B, T + N), drawn with
    torch's global generator (reproducible under torch.manual_seed), greedy at temperature 0, no grad recorded."""
    import model as package
    assert package.GPT is GPT and package.GPTConfig is type(tiny_gpt_config)
    with pytest.raises(AttributeError, match="has no attribute 'Gpt'"):
        package.Gpt
    model = spiky_model(tiny_gpt_config).requires_grad_(True)
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    n = 2 * tiny_gpt_config.block_size  # the window slides
    out = model.generate(idx, n, temperature=0)
    assert out.shape == (2, 3 + n) and torch.equal(out, generate(model, idx, n, GREEDY))
    assert not out.requires_grad and torch.is_grad_enabled()
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(model.generate(idx, 20, temperature=0.9, top_k=5))
    assert torch.equal(*runs) and not torch.equal(runs[0], out[:, :23])
    torch.manual_seed(5)  # min_p, a keyword: Sampling's; 1 keeps only the top token (no ties here): greedy
    assert torch.equal(model.generate(idx, 20, temperature=1.0, min_p=1.0), out[:, :23])
    torch.manual_seed(5)
    with_min_p = model.generate(idx, 20, 0.9, 5, min_p=0.1)
    torch.manual_seed(5)
    assert torch.equal(with_min_p, generate(model, idx, 20, Sampling(0.9, 5, min_p=0.1)))


@pytest.mark.slow  # over ~1 s: the 10.7M model of the first snippet, and a fresh interpreter
def test_the_snippets_in_model_md_run_as_written(capsys):
    """docs/model.md's snippets in order, in one namespace, as a reader pastes them (not the one that needs
    transformers: tests/test_model_hf.py): they print what their comments say. And `import model.config` (which
    sample.py does before checking its arguments) still imports no torch."""
    import re
    import subprocess
    import sys

    from tests.helpers import REPO
    doc = (REPO / "docs" / "model.md").read_text(encoding="utf-8")
    snippets = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "transformers" not in b]
    assert any("from model import GPT, GPTConfig" in b and "model.generate(" in b for b in snippets)
    namespace: dict = {}
    for snippet in snippets:
        exec(compile(snippet, "model.md", "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["10.67M parameters", "torch.Size([1, 28])"]
    assert out[2:] == ["torch.Size([1, 1])"] * 5
    code = "import sys, model.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
