"""Will one training step fit in memory? Asked before anything is allocated; and, if it did not fit after all,
the one line that says what to lower (`out_of_memory`).

Otherwise too large a batch ends in an allocator traceback, or silently in Linux's OOM killer minutes in.
How the estimate's terms are counted: docs/design.md (Memory).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

from common.platform import available_memory, uses_host_memory
from model.config import pad_vocab
from training.config import Config
from training.metrics import format_count

GPT2_VOCAB, CHAR_VOCAB = 50257, 256  # the char vocabulary is not known before the data is prepared: 256
# the first step's kernels, threads, allocator caches, cuBLAS: ~20 MiB measured on a CPU (no torch._dynamo import)
RUNTIME = {"cpu": 48 << 20, "cuda": 512 << 20}


@dataclass
class Estimate:
    params: int  # parameter count (a tied matrix once)
    static: int  # bytes held all along: weights, gradients, optimizer state, the runtime's own
    per_sequence: int  # bytes per sequence of the micro-batch: activations, logits, the batch itself
    batch_size: int

    @property
    def total(self) -> int:
        return self.static + self.per_sequence * self.batch_size


def vocab_size(c: Config, kind: Optional[str] = None) -> int:
    kind = kind or c.data.validate()
    n = GPT2_VOCAB if kind == "gpt2" else int(c.data.vocab_size) if kind == "bpe" else CHAR_VOCAB
    return pad_vocab(n, c.model.pad_vocab_to)


def meta_model(c: Config, vocab: int):
    """The GPT `c.model` describes, every setting included, built on the meta device (it allocates nothing): the
    estimate reads its parameters and its layers' widths."""
    import torch

    from model.gpt import GPT
    with torch.device("meta"):
        return GPT(dataclasses.replace(c.model, vocab_size=vocab))  # (vocab: padded already)


def saved_per_token(model, half: bool) -> int:
    """Bytes one block keeps for backward per token, from the model's own widths: a new MLP width or activation
    (gated: c_fc twice as wide) or head layout needs no edit here. Within 5% of what saved_tensors_hooks count on
    torch 2.13's CPU kernels, for every setting (tests/test_launch_memory.py); dropout's masks come apart."""
    m, attn, mlp = model.config, model.transformer.h[0].attn, model.transformer.h[0].mlp
    a = 2 if half else 4  # bytes of an activation: autocast's 16-bit copies, else fp32
    C, qkv, q, fc = m.n_embd, attn.c_attn.out_features, attn.c_proj.in_features, mlp.c_fc.out_features
    qk = (qkv + q) // 2  # q's and k's widths together (grouped-query attention: a narrower k)
    return (4 * 2 * C * (1 + (m.norm == "rmsnorm"))  # the norms' fp32 inputs (the residual stream); RMSNorm: x/rms(x)
            + a * (2 * C + qkv + q)  # the norms' outputs (c_attn's, c_fc's inputs); q, k, v; attention's output
            + a * qk * (m.position == "rope" or m.qk_norm)  # q and k rotated or normalised: new tensors
            + (4 + 4 * half) * qk * m.qk_norm  # qk_norm's x/rms(x) in fp32 (under autocast its fp32 input too)
            + a * 2 * fc)  # c_fc's output, and as much again: the activation's output (gated: and the gate's)


def estimate(c: Config, device_type: str = "cpu", half: bool = False, world_size: int = 1,
             vocab: Optional[int] = None) -> Estimate:
    """Peak bytes of one training step on one process. `half`: bf16/fp16 autocast (fp32 master weights)."""
    from training.optim import OPTIMIZERS
    m, t = c.model, c.train
    C, T, L, V, H = m.n_embd, m.block_size, m.n_layer, vocab or vocab_size(c), m.n_head
    model = meta_model(c, V)
    P = model.num_params(non_embedding=False)  # a tied matrix once
    # fp32 weights and gradients, and the optimizer's state (training/optim.py's table: how much)
    static = 8 * P + OPTIMIZERS[c.optim.name].state_bytes(model)
    if t.parallel == "fsdp":
        static //= world_size
    static += RUNTIME.get(device_type, 0)
    cpu, dropout = device_type == "cpu", m.dropout > 0
    drop = (4 if cpu else 1) * dropout  # dropout's mask per value: fp32 noise on the CPU, else a byte
    layer = saved_per_token(model, half) + 2 * drop * C  # and the masks after attention and after the MLP
    # the T x T attention matrix, where no fused kernel avoids it (fused kernels keep only logsumexp)
    manual = m.attention == "manual" or (cpu and dropout)
    attn = H * T * (4 + 2 * half + (8 if cpu else 5) * dropout) * manual + 4 * H
    workspace = 48 * C + 24 * H * T * manual  # one layer's temporaries, forward and backward
    logits = 16 * V  # logits, log-softmax output and their two gradients (fp32)
    batch = 40 if cpu else 16  # x, y int64 (+ the loader's index array, on the host)
    per_token = L * (layer + attn) + (8 + drop) * C + workspace + logits + batch
    return Estimate(params=P, static=static, per_sequence=T * per_token, batch_size=t.batch_size)


def available(device) -> Optional[int]:
    """Bytes free on `device` (a torch.device): CUDA's free memory; for the CPU and Apple's MPS (unified memory)
    the machine's available RAM (common.platform); None where it cannot be read (no check)."""
    import torch
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except RuntimeError:  # a GPU that cannot answer: the loop will report it
            return None
    return available_memory() if uses_host_memory(device.type) else None


def gib(n: float) -> str:
    return f"{n / 2**40:.1f} TiB" if n >= 2**40 else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


CPU_OOM = ("can't allocate memory", "DefaultCPUAllocator: not enough memory")  # torch's CPU allocator failing


def out_of_memory(e: BaseException, c: Config) -> Optional[str]:
    """The one line for an allocation that failed while training (what to lower), or None: not one."""
    lower = (f"with train.batch_size={c.train.batch_size}, model.block_size={c.model.block_size}: lower "
             f"train.batch_size (and raise train.grad_accum_steps to keep the same global batch) or use a smaller "
             f"model")
    if type(e).__name__ == "OutOfMemoryError":  # torch's (CUDA)
        return "out of memory on the GPU " + lower
    if isinstance(e, MemoryError) or isinstance(e, RuntimeError) and any(s in str(e) for s in CPU_OOM):
        size = re.search(r"allocate (\d+) bytes|allocate ([\d.]+ \w+)", str(e))  # (numpy's: a MemoryError)
        what = f" (allocating {gib(int(size[1])) if size[1] else size[2]} failed)" if size else ""
        return f"out of memory on the CPU{what} " + lower
    return None


def check(c: Config, device, world_size: int = 1, local_world_size: int = 1) -> Optional[str]:
    """The one-line refusal when one training step would need more memory than the device has free, else None.
    CPU processes under torchrun share the host: each needs its own share. `device`: the run's (a torch.device)."""
    import torch
    from model.device import resolve_dtype
    if c.model.init_from:  # a fine-tune's shape is its source's, read later by the loop
        return None
    try:
        half = resolve_dtype(c.train.dtype, device) != torch.float32
    except ValueError:  # the loop reports a dtype the device lacks
        return None
    free = available(device)
    if free is None:
        return None
    share = local_world_size if device.type == "cpu" else 1
    kind = c.data.validate()
    e = estimate(c, device.type, half, world_size, vocab_size(c, kind))
    if e.total * share <= free:
        return None
    m, t, mem = c.model, c.train, "GPU memory" if device.type == "cuda" else "memory"
    note = "estimate" if kind != "char" else f"estimate, for up to {CHAR_VOCAB} distinct characters"
    have = f"{gib(free)} is free on {device}" if device.type == "cuda" else f"{gib(free)} is available"
    if share > 1:
        have += f" for {share} processes"
    if e.static * share > free:
        return (f"the model (model.n_layer={m.n_layer}, model.n_embd={m.n_embd}: {format_count(e.params)} parameters) "
                f"needs about {gib(e.static)} of {mem} for its weights, gradients and optimizer state alone "
                f"({note}), but {have}: use a smaller model (lower model.n_embd or model.n_layer)")
    fits = int((0.8 * free / share - e.static) // e.per_sequence)  # with room for the estimate's error
    lower = "lower train.batch_size" + (f" to at most {fits} (train.batch_size={fits} fits)"
                                        if fits >= 1 else "")
    return (f"train.batch_size={t.batch_size} with model.block_size={m.block_size} needs about {gib(e.total)} of "
            f"{mem} for one training step ({note}), but {have}: {lower} (raise train.grad_accum_steps to keep "
            f"the global batch) or use a smaller model")
