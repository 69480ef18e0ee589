"""model/sampling.py: the settings, checked where they are made; the rules (RULES), each read by its
setting and applied by logits_to_probs; every setting a flag of sample.py and a field of the
explorer's API, and applied alike on every decode path (cached, uncached, the captured step)."""
from dataclasses import fields

import pytest
import torch

from common.cli import in_keys
from model.generate import generate, sample
from model.sampling import RULES, SETTINGS, Sampling, logits_to_probs, temperature
from tests.test_explore import char_tok  # noqa: F401 (fixture)

GREEDY = Sampling(temperature=0)


def to_probs(logits, sampling=Sampling(), tokens=None):
    """logits_to_probs with no tokens so far (every slot -1: not drawn yet) unless `tokens`."""
    none = torch.full((*logits.shape[:-1], 1), -1)
    return logits_to_probs(logits, none if tokens is None else tokens, sampling)


def draw_from(logits, sampling=Sampling(), generator=None):
    """sample() with no tokens so far."""
    return sample(logits, torch.full((*logits.shape[:-1], 1), -1), sampling, generator)


# ---- logits_to_probs ------------------------------------------------------------------------

def test_temperature_zero_is_one_hot_argmax():
    probs = to_probs(torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]]), Sampling(temperature=0))
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    assert torch.allclose(to_probs(logits, Sampling(1.0)), torch.softmax(logits, -1))
    assert torch.allclose(to_probs(logits, Sampling(0.5)), torch.softmax(logits / 0.5, -1))
    hot, cold = to_probs(logits, Sampling(10.0)), to_probs(logits, Sampling(0.1))
    assert hot.max() < 0.4 and cold.max() > 0.99


def test_top_k_keeps_k_tokens_and_is_clamped():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    probs = to_probs(logits, Sampling(top_k=2))
    assert (probs > 0).tolist() == [[False, True, True, False]]
    assert torch.allclose(probs.sum(), torch.tensor(1.0))
    # clamped to V
    assert torch.allclose(to_probs(logits, Sampling(top_k=100)), torch.softmax(logits, -1))


def test_top_p_keeps_smallest_set_reaching_p():
    # shuffled: [0.1, 0.6, 0.05, 0.25]
    logits = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()[[2, 0, 3, 1]]
    # 0.6 + 0.25
    assert (to_probs(logits, Sampling(top_p=0.7)) > 0).tolist() == [False, True, False, True]
    # + 0.1
    assert (to_probs(logits, Sampling(top_p=0.9)) > 0).tolist() == [True, True, False, True]
    assert (to_probs(logits, Sampling(top_p=0.5)) > 0).tolist() == [False, True, False, False]
    # top kept
    assert (to_probs(logits, Sampling(top_p=1e-9)) > 0).tolist() == [False, True, False, False]
    assert torch.allclose(to_probs(logits, Sampling(top_p=1.0)), torch.softmax(logits, -1))
    kept = to_probs(logits, Sampling(top_p=0.7))
    assert torch.allclose(kept[[1, 3]], torch.tensor([0.6, 0.25]) / 0.85)  # renormalised


def test_top_p_boundary_is_inclusive():
    logits = torch.tensor([0.125, 0.5, 0.125, 0.25]).log()  # powers of two: exact in float32
    # 0.5 + 0.25
    assert (to_probs(logits, Sampling(top_p=0.75)) > 0).tolist() == [False, True, False, True]
    assert (to_probs(logits, Sampling(top_p=0.5)) > 0).tolist() == [False, True, False, False]


def test_top_k_then_top_p_compose():
    logits = torch.tensor([[0.6, 0.25, 0.1, 0.05]]).log()
    probs = to_probs(logits, Sampling(top_k=3, top_p=0.95))  # top-k renormalises to 0.6/0.95, ...
    assert (probs > 0).tolist() == [[True, True, True, False]]


def test_min_p_keeps_tokens_at_least_min_p_times_the_top_one():
    """min_p: the tokens with probability >= min_p x the top token's (boundary included),
    renormalised; 0 and None keep every token. By hand, with powers of two (exact in float32)."""
    probs = torch.tensor([0.125, 0.5, 0.03125, 0.25, 0.09375])
    logits = probs.log()
    kept = to_probs(logits, Sampling(min_p=0.25))  # 0.25 x 0.5 = 0.125: 0.125 stays, 0.09375 goes
    assert torch.equal(kept, torch.tensor([0.125, 0.5, 0, 0.25, 0]) / 0.875)
    assert (to_probs(logits, Sampling(min_p=0.5)) > 0).tolist() == [False, True, False, True, False]
    top_only = [False, True, False, False, False]
    assert (to_probs(logits, Sampling(min_p=1.0)) > 0).tolist() == top_only
    plain = to_probs(logits)
    assert torch.equal(to_probs(logits, Sampling(min_p=0)), plain)
    assert torch.equal(to_probs(logits, Sampling(min_p=0.01)), plain)  # 0.03125 >= 0.005: all stay


def test_min_p_comes_after_the_temperature_and_top_p():
    """HF's order (MinPLogitsWarper after TemperatureLogitsWarper and TopPLogitsWarper): at
    temperature T a token stays if (p / p_top) ** (1 / T) >= min_p; top-p first, on the whole
    distribution."""
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
    # 0.25 < 0.4
    assert (to_probs(logits, Sampling(min_p=0.4)) > 0).tolist() == [True, True, False, False]
    hot = to_probs(logits, Sampling(2.0, min_p=0.4))  # (1/4) ** (1/2) = 0.5 >= 0.4: the 0.125s stay
    assert torch.allclose(hot, torch.tensor([2 ** 0.5, 1, 0.5 ** 0.5, 0.5 ** 0.5])
                          / (2 ** 0.5 + 1 + 2 * 0.5 ** 0.5))
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log()
    # top-p keeps 3 (0.4 + 0.3 < 0.75), min-p 3
    both = to_probs(logits, Sampling(top_p=0.75, min_p=0.4))
    # (min-p first: top-p would keep only 2)
    assert torch.allclose(both, torch.tensor([0.4, 0.3, 0.2, 0]) / 0.9)


# below float32's smallest normal number, and above
TINY_TEMPERATURES = [1e-45, 5e-324, 1e-39, 1e-38, 1e-30, 1e-10]
FILTERS = [dict(), dict(top_k=3), dict(top_p=0.5), dict(top_k=3, top_p=0.9), dict(vocab_limit=5),
           dict(top_k=2, top_p=0.99, vocab_limit=5), dict(min_p=0.1),
           dict(top_k=4, top_p=0.95, min_p=0.5, vocab_limit=5)]


@pytest.mark.parametrize("kw", FILTERS, ids=lambda kw: ",".join(kw) or "plain")
def test_a_tiny_positive_temperature_samples_as_greedy(kw):
    """Was NaN probabilities (logits / 1e-45 overflow, inf - inf in the softmax) and garbage
    tokens: the argmax's one-hot now, with no random draw below float32's smallest normal number
    (the generator is left as it was)."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0, 0.5, 9.0], [-2.0, 0.0, 2.5, 2.0, 1.0, 9.0]])
    greedy = to_probs(logits, Sampling(0, **kw))
    for t in TINY_TEMPERATURES:
        assert torch.equal(to_probs(logits, Sampling(t, **kw)), greedy), t
        g = torch.Generator().manual_seed(0)
        state = g.get_state()
        drawn = draw_from(logits, Sampling(t, **kw), generator=g)
        assert torch.equal(drawn, draw_from(logits, Sampling(0, **kw))), t
        assert torch.equal(g.get_state(), state) == (t < torch.finfo(torch.float32).tiny), t


@pytest.mark.parametrize("kw", FILTERS, ids=lambda kw: ",".join(kw) or "plain")
def test_no_temperature_gives_nan_even_with_huge_logits(kw):
    """Any accepted temperature, with logits far apart and a huge one (a diverging model), gives
    probabilities: finite, summing to 1, zero where the filters and the vocabulary limit say so."""
    logits = torch.tensor([[3e38, -3e38, 1.0, 2.0, 0.0, 5.0], [1e30, 1e30, -1e30, 0.0, 1.0, 2.0]])
    for t in [*TINY_TEMPERATURES, 1e-5, 0.8, 1.0, 1e30, 3.4e38, 1e39, 1e300, 10**400]:
        probs = to_probs(logits, Sampling(t, **kw))
        assert probs.isfinite().all() and (probs >= 0).all(), (t, probs)
        assert torch.allclose(probs.sum(-1), torch.ones(2)), (t, probs)
        if "vocab_limit" in kw:
            assert (probs[:, 5:] == 0).all(), t
    # ties share the mass
    assert to_probs(logits[1:], Sampling(1e-30))[0].tolist() == [0.5, 0.5, 0, 0, 0, 0]
    # the -inf 0, the rest even
    hot = to_probs(torch.tensor([1.0, 2.0, 3.0, float("-inf")]), Sampling(1e300))
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
    """Checked once, where the settings are made (model/sampling.py): one line naming the setting as
    the caller spells it (sample.py's flags, the explorer's fields: in_keys); every function
    downstream takes them checked."""
    with pytest.raises(ValueError, match=f"^{field}=") as e:
        Sampling(**kwargs)
    assert "\n" not in str(e.value)
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} "), in_keys({field: flag}):
        Sampling(**kwargs)


# ---- vocab_limit (a padded vocabulary: ids no tokenizer knows) -------------------------------

def test_vocab_limit_gives_padded_ids_zero_probability():
    logits = torch.tensor([[1.0, 2.0, 9.0, 8.0], [3.0, 1.0, 0.0, 7.0]])
    probs = to_probs(logits, Sampling(vocab_limit=2))
    assert (probs[:, 2:] == 0).all()
    assert torch.allclose(probs[:, :2], torch.softmax(logits[:, :2], -1))
    greedy = to_probs(logits, Sampling(temperature=0, vocab_limit=2))
    assert greedy.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert draw_from(logits, Sampling(temperature=0, vocab_limit=2)).tolist() == [[1], [0]]
    g = torch.Generator().manual_seed(0)
    drawn = draw_from(logits.repeat(1000, 1), Sampling(top_k=3, top_p=0.99, vocab_limit=2), g)
    assert (drawn < 2).all()
    # no padding: no-op
    assert torch.equal(to_probs(logits, Sampling(vocab_limit=4)), to_probs(logits))
    assert logits[0, 2] == 9.0  # the caller's logits are not modified


@pytest.mark.parametrize("vocab_limit", [0, -1, 2.5, True])
def test_bad_vocab_limit_raises(vocab_limit):
    with pytest.raises(ValueError, match="vocab_limit"):
        Sampling(vocab_limit=vocab_limit)


# ---- sample ---------------------------------------------------------------------------------

def test_sample_is_reproducible_and_follows_probs():
    logits = torch.tensor([0.5, 0.3, 0.2, 0.0]).log().expand(40_000, 4)
    a = draw_from(logits, generator=torch.Generator().manual_seed(7))
    b = draw_from(logits, generator=torch.Generator().manual_seed(7))
    assert a.shape == (40_000, 1) and a.dtype == torch.long and torch.equal(a, b)
    freq = torch.bincount(a.flatten(), minlength=4).float() / 40_000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.015)
    assert not torch.equal(a, draw_from(logits, generator=torch.Generator().manual_seed(8)))
    assert torch.equal(draw_from(logits[:3], GREEDY), torch.zeros(3, 1, dtype=torch.long))



# ---- the one table: every setting read by its rule, a flag, an API field, on every path ----------

# a value of each Sampling field that changes what is drawn: a new rule's setting gets one here
EXAMPLES = {"repetition_penalty": 2.0, "temperature": 0.5, "top_k": 2, "top_p": 0.5, "min_p": 0.5,
            "vocab_limit": 4}


def test_every_setting_is_read_by_its_rule_and_is_a_flag_and_an_api_field(views):
    """Each Sampling field has its rule in RULES, which changes the probabilities; each setting a
    user sets (SETTINGS) is sample.py's flag and a field of the explorer's API, whose answer applies
    it (an API field no rule reads, or one the explorer ignores, fails here)."""
    import json

    import sample
    from viz.explorer.model_view import next_tokens
    from viz.explorer.request import parse_request

    assert set(EXAMPLES) == {f.name for f in fields(Sampling)} == set(RULES)
    assert set(SETTINGS) <= set(RULES)
    logits, ids = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0]), [0, 5]
    plain = to_probs(logits, Sampling(), torch.tensor(ids))
    for name, value in EXAMPLES.items():
        sampling = Sampling(**{name: value})
        assert not torch.equal(to_probs(logits, sampling, torch.tensor(ids)), plain), name
        if name not in SETTINGS:
            continue
        args = sample.parse_args(["--" + name.replace("_", "-"), str(value)])
        assert getattr(args.sampling, name) == value, name
        body = json.dumps({"text": "ROMEO", name: value}).encode()
        assert parse_request(body, views)["sampling"] == sampling, name
        assert next_tokens(logits, ids, sampling) != next_tokens(logits, ids, Sampling()), name


@pytest.fixture
def views(char_tok):
    from tests.helpers import tiny_model
    from viz.explorer.model_view import ModelView
    return [ModelView(tiny_model(char_tok.vocab_size, 0, n_layer=1, block_size=32), char_tok, "a")]


def _paths(model, idx, n, sampling, seed):
    """The tokens of the cached, uncached and captured (CUDA graph's step, run uncaptured) paths."""
    from model.fast_decode import FastDecode

    def run(**kw):
        g = torch.Generator().manual_seed(seed)
        return generate(model, idx, n, sampling, generator=g, **kw)
    return run(), run(use_kv_cache=False), run(decode=FastDecode(capture=False))


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_rule_draws_the_same_tokens_on_every_path(tiny_gpt_config, name):
    """Seeded, past the context (the window slides): the cached, uncached and captured paths draw
    the same tokens under each rule, and the rule matters there."""
    from tests.test_model_generate import spiky_model

    model = spiky_model(tiny_gpt_config)
    idx, n = torch.tensor([[1, 2, 3], [4, 5, 6]]), 2 * tiny_gpt_config.block_size
    value = tiny_gpt_config.vocab_size // 2 if name == "vocab_limit" else EXAMPLES[name]
    sampling = Sampling(**{"temperature": 1.5, name: value})
    cached, uncached, captured = _paths(model, idx, n, sampling, seed=3)
    assert torch.equal(cached, uncached) and torch.equal(cached, captured), name
    without = _paths(model, idx, n, Sampling(temperature=1.5), seed=3)[0]
    assert not torch.equal(cached, without), name


def test_rules_read_the_tokens_so_far_on_every_path(tiny_gpt_config, monkeypatch):
    """What a rule gets as the tokens so far, at each token of each path: the prompt and the tokens
    drawn before it, then -1 (the slots not drawn yet), past the context too."""
    from tests.test_model_generate import spiky_model

    seen = []

    def spy(logits, tokens, t):
        seen.append(tokens.clone())
        return temperature(logits, tokens, t)
    monkeypatch.setitem(RULES, "temperature", spy)
    model = spiky_model(tiny_gpt_config)
    idx, n = torch.tensor([[1, 2, 3], [4, 5, 6]]), 2 * tiny_gpt_config.block_size
    paths = _paths(model, idx, n, Sampling(temperature=1.5), seed=3)
    assert len(seen) == 3 * n
    for i, tokens in enumerate(seen):
        out, k = paths[i // n], 3 + i % n
        assert torch.equal(tokens[:, :k], out[:, :k]) and (tokens[:, k:] == -1).all(), i


# ---- the repetition penalty (CTRL's, HF's RepetitionPenaltyLogitsProcessor) ---------------------

def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_tokens_so_far():
    """By hand: tokens 0 and 1 are in the text (token 0 twice: penalised once), the -1 slots (not
    drawn yet) penalise nothing, not token 0 either; 1 is off; before top-k and the temperature."""
    from model.sampling import repetition_penalty

    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5], [2.0, -1.0, 3.0, 0.5]])
    tokens = torch.tensor([[0, 1, 0, -1], [3, -1, -1, -1]])
    assert repetition_penalty(logits, tokens, 2.0).tolist() == [[1.0, -2.0, 3.0, 0.5],
                                                                [2.0, -1.0, 3.0, 0.25]]
    assert torch.equal(repetition_penalty(logits, tokens, 1.0), logits)
    assert torch.equal(to_probs(logits, Sampling(repetition_penalty=2.0), tokens),
                       torch.softmax(torch.tensor([[1.0, -2.0, 3.0, 0.5], [2, -1, 3, 0.25]]), -1))
    # greedy applies it: token 1 (3.0) beats token 0 (4.0 / 2)
    assert to_probs(torch.tensor([4.0, 3.0]), Sampling(0, repetition_penalty=2.0),
                    torch.tensor([0])).tolist() == [0, 1]
    # before top-k: top_k=1 keeps the penalised text's likeliest
    assert to_probs(torch.tensor([4.0, 3.0]), Sampling(top_k=1, repetition_penalty=2.0),
                    torch.tensor([0])).tolist() == [0, 1]


@pytest.mark.parametrize("value", [0, -1.2, float("inf"), float("nan"), "1.2", True])
def test_bad_repetition_penalty_raises(value):
    with pytest.raises(ValueError, match="^repetition_penalty="):
        Sampling(repetition_penalty=value)


def test_repetition_penalty_repeats_less_in_a_sample(tiny_gpt_config):
    """Greedy decoding of a random model falls into a loop; the penalty draws more distinct
    tokens."""
    from tests.test_model_generate import spiky_model

    model = spiky_model(tiny_gpt_config)
    idx = torch.tensor([[1, 2, 3]])
    plain = generate(model, idx, 30, Sampling(temperature=0))
    penalised = generate(model, idx, 30, Sampling(temperature=0, repetition_penalty=1e6))
    assert len(set(penalised[0].tolist())) > len(set(plain[0].tolist()))
