"""model/lens.py: the logit lens of every model setting: its last row is the model's own output, each row is the
final norm and head (and softcap) on that layer's residual stream, as a notebook computes it from transformers'
hidden states for imported Llama and Qwen3 weights; the hooks leave nothing behind."""
from __future__ import annotations

import pytest
import torch

from model.gpt import GPT
from model.lens import logit_lens, top_tokens
from tests.helpers import model_variants, randomize

VARIANTS = model_variants()


def by_hand(model, idx) -> torch.Tensor:
    """The lens written out as the textbook does: each layer's residual through ln_f, lm_head and the softcap."""
    x, at = model._embed(idx, torch.arange(idx.size(1)))
    rows = [x]
    for block in model.transformer.h:
        x, _ = block(x, at=at)
        rows.append(x)
    logits = model.lm_head(model.transformer.ln_f(torch.stack(rows)))
    c = model.config.logit_softcap
    return logits if c is None else c * torch.tanh(logits / c)


@pytest.mark.parametrize("config", [c for _, c in VARIANTS], ids=[name for name, _ in VARIANTS])
def test_the_last_row_is_the_models_output_and_every_row_the_textbooks(config):
    model = randomize(GPT(config)).train()  # dropout modules in train mode: the lens turns them off
    idx = torch.randint(0, config.vocab_size, (2, config.block_size), generator=torch.Generator().manual_seed(0))
    lens, weights = logit_lens(model, idx, attention=True)
    assert lens.shape == (config.n_layer + 1, 2, config.block_size, config.vocab_size) and model.training
    model.eval()
    with torch.no_grad():
        own = model(idx)[0]
        assert (lens[-1].softmax(-1) - own.softmax(-1)).abs().max() <= 1e-5
        assert (lens - by_hand(model, idx)).abs().max() <= 1e-4
        assert torch.equal(weights, model.attention_maps(idx))
    hooks = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooks == [] and logit_lens(model, idx)[1] is None


@pytest.mark.slow  # over ~1 s: transformers
def test_imported_llama_and_qwen3_match_their_hidden_states(tmp_path):
    """What nnsight or TransformerLens read from transformers: lm_head(norm(hidden state of layer l))."""
    from model.gpt import GPT
    from tests.test_model_hf_llama import hub_dir
    for kind in ("llama", "qwen3"):
        d, hf = hub_dir(tmp_path / kind, kind)
        ours = GPT.from_pretrained(d)
        idx = torch.randint(0, hf.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = hf(idx, output_hidden_states=True)
            expect = [hf.lm_head(hf.model.norm(h)) for h in out.hidden_states[:-1]] + [out.logits]  # last: normed
        lens, _ = logit_lens(ours, idx)
        assert (lens[..., :hf.config.vocab_size] - torch.stack(expect)).abs().max() <= 1e-4, kind


def test_top_tokens_leave_out_the_padded_ids_and_come_in_order():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0, 9.0]]])  # (rows, T, V): id 4 is a padded row
    probs, ids = top_tokens(logits, 3, vocab_size=4)
    assert ids.tolist() == [[[3, 2, 1]]]
    assert torch.allclose(probs, torch.tensor([0.0, 1.0, 2.0, 3.0]).softmax(-1)[[3, 2, 1]])


@pytest.mark.slow  # over ~1 s: torch.compile
def test_compiled_regions_run_the_lens_as_plain_python_and_keep_their_graphs():
    """Training compiles the blocks as regions (training/step.py): the lens's hooks must neither be skipped nor make
    them recompile (each new hook would be a guard failure, and a region past its recompile limit runs eagerly)."""
    from torch._dynamo.utils import counters
    model = randomize(GPT(VARIANTS[0][1]))
    idx = torch.randint(0, 32, (1, 16), generator=torch.Generator().manual_seed(0))
    want, _ = logit_lens(model, idx, attention=True)
    for block in model.transformer.h:
        block.compile(backend="eager")
    with torch.no_grad():
        model(idx)  # compiled here
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(3):
        assert torch.allclose(logit_lens(model, idx, attention=True)[0], want, atol=1e-6)
    with torch.no_grad():
        model(idx)
    assert counters["stats"]["unique_graphs"] == graphs
