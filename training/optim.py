"""The optimizer and the learning-rate schedule.

AdamW as in GPT-2/nanoGPT (decay on >= 2-D weights only), in the fastest correct implementation for the
device; the schedule is a pure function of the step, so a resumed run gets the same learning rates.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]  # a shared (tied) Parameter comes once
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                    device_type: str, name: str = "adamw", muon_lr: float = 0.02, muon_momentum: float = 0.95,
                    muon_ns_steps: int = 5) -> torch.optim.Optimizer:
    """AdamW over `param_groups` (fused on CUDA, foreach elsewhere), or with name="muon" Muon for the blocks'
    matrices and AdamW for the rest (training/muon.py)."""
    if name == "muon":
        from training.muon import MuonAdamW, muon_param_groups
        opt = MuonAdamW(muon_param_groups(model, weight_decay), lr=lr, muon_lr=muon_lr, betas=betas,
                        weight_decay=weight_decay, momentum=muon_momentum, ns_steps=muon_ns_steps)
    else:
        kwargs = {"fused": True} if device_type == "cuda" else {"foreach": True}
        opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, **kwargs)
    opt.register_load_state_dict_pre_hook(keep_impl_flags)  # a checkpoint of any device loads as this one's
    return opt


def lr_at(step: int, *, lr: float, min_lr: float, warmup_iters: int, decay_iters: int,
          schedule: str = "cosine", cooldown_frac: float = 0.2) -> float:
    """Learning rate at (0-based) `step`: linear warmup to `lr`, then constant, or cosine/linear/wsd (`lr` held,
    then linear over the last `cooldown_frac`) decay to `min_lr` by `decay_iters`, and `min_lr` after it."""
    if step < warmup_iters:
        return lr * (step + 1) / (warmup_iters + 1)
    if schedule == "constant":
        return lr
    if step >= decay_iters:
        return min_lr
    decay_from = warmup_iters
    if schedule == "wsd":  # stable until the cooldown, which never starts inside the warmup
        decay_from = max(warmup_iters, decay_iters - cooldown_frac * decay_iters)
        if step < decay_from:
            return lr
    ratio = (step - decay_from) / max(1, decay_iters - decay_from)  # 0 -> 1 over the decay
    if schedule == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    elif schedule in ("linear", "wsd"):
        coeff = 1.0 - ratio
    else:
        raise ValueError(f"optim.schedule={schedule!r} is not known: use cosine, linear, wsd or constant")
    return min_lr + coeff * (lr - min_lr)


def schedule(o, max_iters: int) -> Callable[[int], float]:
    """The run's `lr_at` for an `optim` config (decay_iters null: over train.max_iters); step < 0 counts as 0."""
    lr = partial(lr_at, lr=o.lr, min_lr=o.min_lr, warmup_iters=o.warmup_iters, schedule=o.schedule,
                 decay_iters=o.decay_iters or max_iters, cooldown_frac=o.cooldown_frac)
    return lambda step: lr(max(0, step))


IMPL_FLAGS = ("fused", "foreach", "capturable")


def keep_impl_flags(optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """load_state_dict pre-hook: the saved param groups get `optimizer`'s fused/foreach/capturable flags.
    load_state_dict places each `step` by the SAVED flags: a CPU (foreach) checkpoint resumed on CUDA (fused)
    would leave `step` on the CPU, where the fused kernel reads it through a device pointer."""
    groups = state["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return state  # not this optimizer's state: the load itself says so
    return dict(state, param_groups=[dict(saved, **{k: g[k] for k in IMPL_FLAGS if k in g})
                                     for saved, g in zip(groups, optimizer.param_groups)])


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
