"""training/muon.py: Newton-Schulz orthogonalisation, the AdamW half, parameter split, state round trip."""
from __future__ import annotations

import copy

import pytest
import torch

from model import GPT
from training.muon import MuonAdamW, muon_param_groups, newton_schulz
from training.optim import build_optimizer, set_lr


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (3, 48, 16)])
def test_newton_schulz_is_nearly_orthogonal(shape):
    torch.manual_seed(0)
    G = torch.randn(*shape)
    U = newton_schulz(G, steps=5)
    assert U.shape == G.shape
    s = torch.linalg.svdvals(U)
    assert s.min() > 0.5 and s.max() < 1.3  # Muon's quintic: singular values squeezed towards 1, not exactly 1


def test_param_split(tiny_gpt_config):
    model = GPT(tiny_gpt_config)
    groups = muon_param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for p in groups[0]["params"]]
    assert groups[0]["muon"] and all(n.startswith("transformer.h.") and n.endswith(".weight") for n in muon)
    assert not any("ln_" in n for n in muon) and len(muon) == 4 * tiny_gpt_config.n_layer
    adam = [names[id(p)] for g in groups[1:] for p in g["params"]]
    assert "transformer.wte.weight" in adam and "transformer.wpe.weight" in adam  # tied head counted once
    assert len(muon) + len(adam) == len(list(model.parameters()))


def test_adamw_half_matches_torch_adamw():
    torch.manual_seed(1)
    p1 = [torch.randn(10, 7, requires_grad=True), torch.randn(7, requires_grad=True)]
    p2 = [p.detach().clone().requires_grad_() for p in p1]
    ref = torch.optim.AdamW([{"params": [p1[0]], "weight_decay": 0.1}, {"params": [p1[1]], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), foreach=True)
    ours = MuonAdamW([{"params": [p2[0]], "weight_decay": 0.1}, {"params": [p2[1]], "weight_decay": 0.0}],
                     lr=1e-2, betas=(0.9, 0.95))
    for _ in range(10):
        grads = [torch.randn_like(p) for p in p1]
        for ps, opt in ((p1, ref), (p2, ours)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_training_steps_lr_scale_and_exact_resume(tiny_gpt_config, tmp_path):
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config)
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu", name="muon",
                          muon_lr=0.02)
    assert isinstance(opt, MuonAdamW) and opt.param_groups[0]["lr_scale"] == pytest.approx(0.02 / 3e-3)
    x = torch.randint(0, tiny_gpt_config.vocab_size, (4, tiny_gpt_config.block_size))

    def step(m, o, lr):
        set_lr(o, lr)
        m(x, x)[1].backward()
        o.step()
        o.zero_grad(set_to_none=True)

    losses = []
    for i in range(3):
        step(model, opt, 3e-3)
        losses.append(model(x, x)[1].item())
    assert losses[-1] < losses[0]
    # a checkpoint of (weights, optimizer state) continues bitwise like the uninterrupted run
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "c.pt")
    twin = copy.deepcopy(model)
    ck = torch.load(tmp_path / "c.pt", weights_only=True)
    twin.load_state_dict(ck["model"])
    twin_opt = build_optimizer(twin, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu", name="muon",
                               muon_lr=0.02)
    twin_opt.load_state_dict(ck["opt"])
    for m, o in ((model, opt), (twin, twin_opt)):
        step(m, o, 1e-3)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
