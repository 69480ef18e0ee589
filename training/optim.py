"""The optimizers, in one table, and the learning-rate schedule.

`OPTIMIZERS` is each optimizer's one home: how it is built from the `optim` group, its name in
messages, the OptimConfig fields it reads, the bytes of state it keeps, whether FSDP can shard it;
the config's checks and notes, the memory pre-flight, the CPU note, bench.py and
docs/configuration.md read it. AdamW as in GPT-2/nanoGPT (decay on >= 2-D weights only), in the
fastest correct implementation for the device; Muon (Keller Jordan et al., modded-nanogpt)
orthogonalises each block matrix's Nesterov-momentum update, with AdamW for everything else in ONE
torch.optim.Optimizer (one state_dict, GradScaler works, `set_lr` drives both rates). The schedule
is a pure function of the step, so a resumed run gets the same learning rates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
from torch.optim.adamw import adamw


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    # a shared (tied) Parameter comes once
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, o, device_type: str = "cpu") -> torch.optim.Optimizer:
    """The `optim` group's optimizer (`o`: training.config.OptimConfig), by its OPTIMIZERS entry."""
    opt = OPTIMIZERS[o.name].build(model, o, device_type)
    # a checkpoint of any device loads as this one's
    opt.register_load_state_dict_pre_hook(keep_impl_flags)
    return opt


def lr_at(step: int, *, lr: float, min_lr: float, warmup_iters: int, decay_iters: int,
          schedule: str = "cosine", cooldown_frac: float = 0.2) -> float:
    """Learning rate at (0-based) `step`: linear warmup to `lr`, then constant, or cosine/linear/wsd
    (`lr` held, then linear over the last `cooldown_frac`) decay to `min_lr` by `decay_iters`, and
    `min_lr` after it."""
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
        raise ValueError(f"optim.schedule={schedule!r} is not known: use cosine, linear, wsd or "
                         "constant")
    return min_lr + coeff * (lr - min_lr)


def schedule(o, max_iters: int) -> Callable[[int], float]:
    """The run's `lr_at` for an `optim` config (decay_iters null: over train.max_iters); step < 0
    counts as 0."""
    lr = partial(lr_at, lr=o.lr, min_lr=o.min_lr, warmup_iters=o.warmup_iters, schedule=o.schedule,
                 decay_iters=o.decay_iters or max_iters, cooldown_frac=o.cooldown_frac)
    return lambda step: lr(max(0, step))


IMPL_FLAGS = ("fused", "foreach", "capturable")


def keep_impl_flags(optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """load_state_dict pre-hook: the saved param groups get `optimizer`'s fused/foreach/capturable
    flags. load_state_dict places each `step` by the SAVED flags: a CPU (foreach) checkpoint resumed
    on CUDA (fused) would leave `step` on the CPU, where the fused kernel reads it through a device
    pointer."""
    groups = state["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return state  # not this optimizer's state: the load itself says so
    return dict(state, param_groups=[dict(saved, **{k: g[k] for k in IMPL_FLAGS if k in g})
                                     for saved, g in zip(groups, optimizer.param_groups)])


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise the last two dims of G (..., m, n): U V^T of its SVD, by a
    quintic iteration."""
    a, b, c = NS_COEFFS
    X = G / (G.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT  # iterate on the smaller Gram matrix
    X = X.contiguous().reshape(-1, *X.shape[-2:])  # one batch dimension for bmm
    # X <- a X + (b A + c A^2) X, A = X X^T; baddbmm fuses the scalings (~20% faster on CPU)
    for _ in range(steps):
        A = torch.bmm(X, X.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a, alpha=1.0)
    X = X.reshape(*G.shape[:-2], *X.shape[-2:])
    return X.mT if tall else X


def muon_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """[muon: >=2-D weights inside transformer.h], [adamw decay: other >=2-D], [adamw no decay:
    <2-D]."""
    muon, other = [], []
    for name, p in model.named_parameters():  # a tied Parameter is yielded once
        if p.requires_grad:
            (muon if p.dim() >= 2 and name.startswith("transformer.h.") else other).append(p)
    return [{"params": muon, "muon": True},
            {"params": [p for p in other if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in other if p.dim() < 2], "weight_decay": 0.0}]


class NoDynamo:
    """torch.optim.Optimizer marks its methods "not for torch.compile" through a wrapper that
    imports torch._dynamo the first time one runs (0.9 s and ~65 MiB on a CPU, ~4 s on a GPU
    machine, before a run's first step); nothing here compiles an optimizer, so tinygpt's optimizers
    call the methods themselves."""
    add_param_group, zero_grad, state_dict, load_state_dict = (
        getattr(f, "__wrapped__", f)
        for f in (torch.optim.Optimizer.add_param_group, torch.optim.Optimizer.zero_grad,
                                               torch.optim.Optimizer.state_dict,
                                               torch.optim.Optimizer.load_state_dict))


class AdamW(NoDynamo, torch.optim.AdamW):
    step = torch.no_grad()(getattr(torch.optim.AdamW.step, "__wrapped__", torch.optim.AdamW.step))


class MuonAdamW(NoDynamo, torch.optim.Optimizer):
    def __init__(self, params, *, lr: float, muon_lr: float = 0.02, betas=(0.9, 0.95),
                 eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.95, ns_steps: int = 5):
        # foreach/fused: unused, but torch's state-dict helpers
        # add them on load (a resumed run's groups must match)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, muon=False,
                        lr_scale=1.0,
                        momentum=momentum, ns_steps=ns_steps, foreach=None, fused=None)
        super().__init__(params, defaults)
        for g in self.param_groups:
            if g["muon"]:
                g["lr_scale"] = muon_lr / lr
                g["weight_decay"] = 0.0  # no decay on the Muon matrices

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            params = [p for p in g["params"] if p.grad is not None]
            if params:
                (self._muon if g["muon"] else self._adamw)(g, params)
        return loss

    def _muon(self, g: dict, params: list[torch.Tensor]) -> None:
        lr, mom, wd = g["lr"] * g["lr_scale"], g["momentum"], g["weight_decay"]
        grads = [p.grad for p in params]
        bufs = []
        for p in params:
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            bufs.append(st["momentum_buffer"])
        torch._foreach_lerp_(bufs, grads, 1 - mom)           # buf = mom * buf + (1 - mom) * g
        nesterov = torch._foreach_lerp(grads, bufs, mom)     # g' = (1 - mom) * g + mom * buf
        by_shape: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)
        if wd:
            torch._foreach_mul_(params, 1 - lr * wd)
        for shape, idx in by_shape.items():
            U = newton_schulz(torch.stack([nesterov[i] for i in idx]), g["ns_steps"])
            scale = -lr * math.sqrt(max(1.0, shape[0] / shape[1]))
            for j, i in enumerate(idx):
                params[i].add_(U[j].to(params[i].dtype), alpha=scale)

    # torch's own AdamW step, on this group
    def _adamw(self, g: dict, params: list[torch.Tensor]) -> None:
        states = [self.state[p] for p in params]
        for p, st in zip(params, states):
            if "exp_avg" not in st:
                st.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                          exp_avg_sq=torch.zeros_like(p))
        adamw([p for p in params], [p.grad for p in params], [st["exp_avg"] for st in states],
              [st["exp_avg_sq"] for st in states], [], [st["step"] for st in states], foreach=True,
              amsgrad=False,
              beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"],
              eps=g["eps"],
              maximize=False)


# ----------------------------------------------------------------------- the table of optimizers
@dataclass(frozen=True)
class OptimizerSpec:
    """What the rest of tinygpt knows of an optimizer (its key in OPTIMIZERS: optim.name)."""
    display: str  # its name in messages ("trained with AdamW")
    about: str  # one line for docs/configuration.md's table of optimizers
    # (model, optim group, device type) -> the torch optimizer; it reads only the fields in `reads`
    build: Callable[[torch.nn.Module, object, str], torch.optim.Optimizer]
    # the OptimConfig fields it reads (the schedule's and grad_clip are every optimizer's)
    reads: tuple[str, ...]
    state_bytes: Callable[[torch.nn.Module], int]  # its state's bytes for a model (launch/memory)
    no_fsdp: Optional[str] = None  # why train.parallel=fsdp cannot shard it; None: it can


def per_parameter(n: int) -> Callable[[torch.nn.Module], int]:
    """`state_bytes` of an optimizer that keeps n bytes for every trained parameter."""
    return lambda model: n * sum(p.numel() for p in model.parameters() if p.requires_grad)


def _adamw(model: torch.nn.Module, o, device_type: str) -> torch.optim.Optimizer:
    kwargs = {"fused": True} if device_type == "cuda" else {"foreach": True}
    return AdamW(param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), **kwargs)


def _muon(model: torch.nn.Module, o, device_type: str) -> torch.optim.Optimizer:
    return MuonAdamW(muon_param_groups(model, o.weight_decay), lr=o.lr, muon_lr=o.muon_lr,
                     betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                     momentum=o.muon_momentum, ns_steps=o.muon_ns_steps)


def _muon_state(model: torch.nn.Module) -> int:
    # AdamW's two fp32 moments, but one (the momentum) for the blocks' matrices
    matrices = sum(p.numel() for p in muon_param_groups(model, 0.0)[0]["params"])
    return per_parameter(8)(model) - 4 * matrices


ADAMW_READS = ("lr", "weight_decay", "beta1", "beta2")
OPTIMIZERS = {
    "adamw": OptimizerSpec(
        display="AdamW", about="AdamW; weight decay on matrices only; fused on CUDA",
        build=_adamw, reads=ADAMW_READS, state_bytes=per_parameter(8)),
    "muon": OptimizerSpec(
        display="Muon", about="Muon (momentum, then Newton-Schulz orthogonalisation) for the "
        "transformer blocks' weight matrices, AdamW (`optim.lr`, ...) for the embeddings, the "
        "head and the norms' gains",
        build=_muon, reads=(*ADAMW_READS, "muon_lr", "muon_momentum", "muon_ns_steps"),
        state_bytes=_muon_state, no_fsdp="Muon needs whole weight matrices"),
}
