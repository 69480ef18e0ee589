"""training/optim.py (AdamW groups, LR schedule), plus the small pure helpers of device.py."""
from __future__ import annotations

import math

import pytest
import torch

from launch import device as dv
from model.device import resolve_device
from training.optim import build_optimizer, lr_at, param_groups


def test_weight_decay_only_on_matrices(tiny_gpt_config):
    from model import GPT
    model = GPT(tiny_gpt_config)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n_group = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n_group == sum(p.numel() for p in model.parameters())  # every parameter once (tied head counted once)
    assert any(p is model.lm_head.weight for p in decay["params"])


def test_optimizer_implementation_per_device(tiny_gpt_config):
    from model import GPT
    opt = build_optimizer(GPT(tiny_gpt_config), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu")
    assert isinstance(opt, torch.optim.AdamW)
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


@pytest.mark.parametrize("name, expect", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA A10G", None),  # not the A10: unknown -> no MFU rather than a wrong one
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12),
    ("NVIDIA GeForce RTX 3090", 71e12),
    ("NVIDIA GeForce RTX 3090 Ti", None),
    ("Tesla V100-SXM2-16GB", 125e12),
    ("Some Future GPU", None),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None),  # a slice: the whole GPU's peak would be wrong
])
def test_peak_flops_table(name, expect):
    got = dv.peak_flops(name)
    assert (got[1] if got else None) == expect


def test_cpu_device_and_dtype():
    assert resolve_device("cpu").type == "cpu"
    assert dv.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert dv.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="float16 needs a GPU"):
        dv.resolve_dtype("float16", torch.device("cpu"))
    setup = dv.setup_device(torch.device("cpu"), "auto")
    assert setup.peak_flops is None and not setup.use_grad_scaler  # no MFU on CPU
    assert dv.resolve_compile("auto", torch.device("cpu")) is False
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_resumed_state_takes_this_devices_implementation(tiny_gpt_config):
    """A CPU run's AdamW state (foreach) resumed where AdamW is fused (CUDA): every `step` must follow the
    parameters to their device, which torch decides from the flags in the saved groups."""
    from model import GPT
    from training.optim import keep_impl_flags
    torch.manual_seed(0)
    src_model = GPT(tiny_gpt_config)
    src = build_optimizer(src_model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device_type="cpu")
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


def test_auto_dtype_on_cuda_needs_bf16_in_hardware(monkeypatch):
    """V100/T4 emulate bf16 (torch says "supported" by default): auto picks fp16 + GradScaler there."""
    asked = {}

    def supported(including_emulation=True):
        asked["including_emulation"] = including_emulation
        return including_emulation  # an emulating GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert dv.resolve_dtype("auto", torch.device("cuda")) == torch.float16
    assert asked == {"including_emulation": False}
    assert dv.resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16  # asked for: allowed


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
