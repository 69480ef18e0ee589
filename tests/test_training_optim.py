"""training/optim.py (the table of optimizers: each one's state and exact resume; AdamW groups, LR
schedule; Muon: Newton-Schulz, the AdamW half, parameter split, state round trip)."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from model.gpt import GPT
from training.config import OptimConfig
from training.optim import (OPTIMIZERS, AdamW, MuonAdamW, build_optimizer, lr_at, muon_param_groups,
                            newton_schulz, param_groups, set_lr)


def test_weight_decay_only_on_matrices(tiny_gpt_config):
    from model.gpt import GPT
    model = GPT(tiny_gpt_config)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n_group = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n_group == sum(p.numel() for p in model.parameters())  # every parameter once (tied head counted once)
    assert any(p is model.lm_head.weight for p in decay["params"])


def test_optimizer_implementation_per_device(tiny_gpt_config):
    from model.gpt import GPT
    opt = build_optimizer(GPT(tiny_gpt_config), OptimConfig(lr=1e-3), "cpu")
    assert isinstance(opt, AdamW) and isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0].get("fused")
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)


def test_schedule_warmup_cosine_floor():
    kw = dict(lr=1e-3, min_lr=1e-4, warmup_iters=10, decay_iters=110)
    assert lr_at(0, **kw) == pytest.approx(1e-3 / 11)
    assert lr_at(9, **kw) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, **kw) == pytest.approx(1e-3)  # peak right after warmup
    assert lr_at(60, **kw) == pytest.approx((1e-3 + 1e-4) / 2)  # cosine midpoint
    assert lr_at(110, **kw) == pytest.approx(1e-4)
    assert lr_at(10_000, **kw) == pytest.approx(1e-4)
    values = [lr_at(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay


def test_schedule_linear_and_constant():
    kw = dict(lr=1.0, min_lr=0.0, warmup_iters=0, decay_iters=100)
    assert lr_at(50, schedule="linear", **kw) == pytest.approx(0.5)
    assert lr_at(99, schedule="constant", **kw) == 1.0
    with pytest.raises(ValueError, match="optim.schedule"):
        lr_at(50, schedule="step", **kw)


def test_schedule_wsd_holds_then_cools_down():
    kw = dict(lr=1.0, min_lr=0.1, warmup_iters=10, decay_iters=110, schedule="wsd")
    assert lr_at(10, **kw) == 1.0 and lr_at(87, **kw) == 1.0  # stable until the last 20% of 110 steps
    assert lr_at(88, **kw) == pytest.approx(1.0) and lr_at(99, **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(109, **kw) == pytest.approx(0.1 + 0.9 / 22) and lr_at(110, **kw) == 0.1
    assert lr_at(5, **kw) == lr_at(5, **{**kw, "schedule": "cosine"})  # the same warmup
    # the cooldown never starts inside the warmup; cooldown_frac=1 is the linear schedule
    assert lr_at(12, **kw, cooldown_frac=1.0) == lr_at(12, **{**kw, "schedule": "linear"})
    assert lr_at(50, **kw, cooldown_frac=0.0) == 1.0 and lr_at(110, **kw, cooldown_frac=0.0) == 0.1
    values = [lr_at(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_resumed_state_takes_this_devices_implementation(tiny_gpt_config):
    """A CPU run's AdamW state (foreach) resumed where AdamW is fused (CUDA): every `step` must follow the
    parameters to their device, which torch decides from the flags in the saved groups."""
    from model.gpt import GPT
    from training.optim import keep_impl_flags
    torch.manual_seed(0)
    src_model = GPT(tiny_gpt_config)
    src = build_optimizer(src_model, OptimConfig(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")
    src_model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    src.step()
    with torch.device("meta"):  # stands in for CUDA: a device other than the CPU
        dst_model = GPT(tiny_gpt_config)
    dst = torch.optim.AdamW(param_groups(dst_model, 0.1), lr=1e-3, foreach=False)
    for g in dst.param_groups:
        g.update(fused=True, foreach=None)  # what build_optimizer sets on CUDA
    dst.register_load_state_dict_pre_hook(keep_impl_flags)  # as build_optimizer does
    dst.load_state_dict(src.state_dict())
    states = list(dst.state.values())
    assert states and all(s["step"].device.type == "meta" and s["exp_avg"].device.type == "meta" for s in states)
    assert all(g["fused"] is True and g["foreach"] is None for g in dst.param_groups)
    assert [g["lr"] for g in dst.param_groups] == [g["lr"] for g in src.param_groups]


def test_schedule_is_the_gpt2_124m_recipes():
    """experiment=gpt2_124m's schedule is build-nanogpt's get_lr (warmup 700, cosine to 10% by 19,073): equal
    after the warmup; during it, tinygpt's (nanoGPT's) lr * (step + 1) / 701 is within 1/700 of its / 700."""
    from training.optim import lr_at
    max_lr, min_lr, warmup, steps = 6e-4, 6e-5, 700, 19073

    def get_lr(it):  # build-nanogpt's train_gpt2.py
        if it < warmup:
            return max_lr * (it + 1) / warmup
        ratio = (it - warmup) / (steps - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
    for step in (0, 350, 699, 700, 701, 5000, 10000, 19072):
        ours = lr_at(step, lr=max_lr, min_lr=min_lr, warmup_iters=warmup, decay_iters=steps)
        assert ours == pytest.approx(get_lr(step), rel=1 / 700 if step < warmup else 1e-12)


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


@pytest.mark.parametrize("ours", [MuonAdamW, AdamW])
def test_adamw_half_matches_torch_adamw(ours):
    """MuonAdamW's AdamW half, and AdamW (torch's, its step called without the wrapper that imports torch._dynamo)."""
    torch.manual_seed(1)
    p1 = [torch.randn(10, 7, requires_grad=True), torch.randn(7, requires_grad=True)]
    p2 = [p.detach().clone().requires_grad_() for p in p1]
    ref = torch.optim.AdamW([{"params": [p1[0]], "weight_decay": 0.1}, {"params": [p1[1]], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), foreach=True)
    ours = ours([{"params": [p2[0]], "weight_decay": 0.1}, {"params": [p2[1]], "weight_decay": 0.0}],
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
    opt = build_optimizer(model, OptimConfig(name="muon", lr=3e-3, weight_decay=0.1, beta2=0.95,
                                                   muon_lr=0.02), "cpu")
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
    twin_opt = build_optimizer(twin, OptimConfig(name="muon", lr=3e-3, weight_decay=0.1, beta2=0.95,
                                                        muon_lr=0.02), "cpu")
    twin_opt.load_state_dict(ck["opt"])
    for m, o in ((model, opt), (twin, twin_opt)):
        step(m, o, 1e-3)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_keeps_the_state_its_entry_says_and_resumes_exactly(name, tiny_gpt_config,
                                                                           tmp_path):
    """Each OPTIMIZERS entry (issue 51: the one home of an optimizer): built from the `optim` group,
    the fields it reads exist, its state_bytes is what it keeps (the memory pre-flight's figure),
    and a checkpoint of its state continues bitwise like the uninterrupted run."""
    import dataclasses
    spec = OPTIMIZERS[name]
    assert spec.display and spec.about
    assert set(spec.reads) <= {f.name for f in dataclasses.fields(OptimConfig)}
    o = OptimConfig(name=name, lr=1e-3)
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config)
    opt = build_optimizer(model, o, "cpu")
    x = torch.randint(0, tiny_gpt_config.vocab_size, (4, tiny_gpt_config.block_size))

    def step(m, opt):
        m(x, x)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(model, opt)
    kept = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0)  # (a step counter is a scalar)
    assert kept == spec.state_bytes(model)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "c.pt")
    ck = torch.load(tmp_path / "c.pt", weights_only=True)
    twin = copy.deepcopy(model)
    twin.load_state_dict(ck["model"])
    twin_opt = build_optimizer(twin, o, "cpu")
    twin_opt.load_state_dict(ck["opt"])
    for m, opt_ in ((model, opt), (twin, twin_opt)):
        step(m, opt_)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
