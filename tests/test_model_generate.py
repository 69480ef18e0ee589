"""model/generate.py, the sampling ladder: logits_to_probs filters, reproducible sampling, cached == uncached
generation past the context; nanoGPT's `from model import GPT, GPTConfig` and model.generate (docs/model.md)."""
import dataclasses

import pytest
import torch

from model.gpt import GPT
from model.generate import generate, generate_tokens, sample
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


# ---- generation -----------------------------------------------------------------------------

def reference_generate(model, idx, max_new_tokens,
                       pick=lambda logits, seq: logits.argmax(-1, keepdim=True), keep=None):
    """The documented overflow strategy, written out: crop the prompt to block_size; when the window
    would exceed block_size, restart it at the last `keep` (default block_size // 2) tokens. `pick`
    gets the last logits and the tokens so far (the whole sequence)."""
    block = model.config.block_size
    keep = keep or block // 2
    seq, start = idx, max(0, idx.size(1) - block)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if seq.size(1) - start > block:
                start = seq.size(1) - keep
            logits, _ = model(seq[:, start:])
            seq = torch.cat([seq, pick(logits[:, -1], seq)], dim=1)
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
    from model import positions
    config = dataclasses.replace(tiny_gpt_config, n_layer=3, **DECODERS["rope-gqa-qknorm"])
    model, calls, forwards, real = spiky_model(config), [], [], positions.rope_cos_sin
    monkeypatch.setattr(positions, "rope_cos_sin",
                        lambda pos, *a: calls.append(pos.tolist()) or real(pos, *a))
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
        def pick(logits, seq):
            return sample(logits, seq, s, generator=g)
        return reference_generate(model, idx, n, pick, keep=keep)
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
