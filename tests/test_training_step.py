"""training/step.py: the training step and the evaluation without a Trainer (what bench.py calls), and the
compile guard's fallback."""
from __future__ import annotations

import contextlib
import logging
import math

import pytest
import torch

from training.config import OptimConfig, TrainConfig
from training.step import CompileGuard, EvalInterrupted, eval_stats, forward_backward, optimizer_step


def _model_and_opt(seed=0):
    from model.config import GPTConfig
    from model.gpt import GPT
    from training.config import OptimConfig
    from training.optim import build_optimizer
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    return m, build_optimizer(m, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")


def _batches(n, batch=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randint(0, 32, (batch, 16), generator=g), torch.randint(0, 32, (batch, 16), generator=g))
            for _ in range(n)]
    return iter(data).__next__, data


def test_accumulated_step_equals_one_big_batch():
    a, b = _model_and_opt()[0], _model_and_opt()[0]
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    nxt, data = _batches(2, batch=2)
    synced = []
    loss_a = forward_backward(a, nxt, TrainConfig(grad_accum_steps=2),
                              grad_sync=lambda last: synced.append(last) or contextlib.nullcontext())
    assert synced == [False, True]  # gradients reduced on the last micro-step only
    norm_a = optimizer_step(a, opt_a, OptimConfig(grad_clip=1.0))
    big = (torch.cat([data[0][0], data[1][0]]), torch.cat([data[0][1], data[1][1]]))
    loss_b = forward_backward(b, lambda: big, TrainConfig())
    norm_b = optimizer_step(b, opt_b, OptimConfig(grad_clip=1.0))
    assert set(loss_a) == {"loss"} and loss_a["loss"].shape == () and norm_a.shape == ()
    assert loss_a["loss"].item() == pytest.approx(loss_b["loss"].item(), abs=1e-6)
    assert norm_a.item() == pytest.approx(norm_b.item(), rel=1e-5)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6) and pa.grad is None  # zero_grad(set_to_none)


@pytest.mark.parametrize("grad_clip", [0.5, 0.0])
def test_optimizer_step_returns_the_norm_it_clips_and_steps_as_clip_grad_norm_does(grad_clip):
    """Issue 44: the gradient norm clipping computes (it was thrown away), and with clipping off the same norm,
    the gradients left as they are; the weights bitwise those of torch's clip_grad_norm_ and a plain step."""
    (a, opt_a), (b, opt_b) = _model_and_opt(), _model_and_opt()
    nxt, data = _batches(1)
    forward_backward(a, nxt, TrainConfig())
    norm = optimizer_step(a, opt_a, OptimConfig(grad_clip=grad_clip))
    _, loss = b(*data[0])
    loss.backward()
    want = torch.nn.utils.clip_grad_norm_(b.parameters(), grad_clip if grad_clip else math.inf, foreach=True)
    opt_b.step()
    assert torch.equal(norm, want) and norm.item() > grad_clip  # (a norm over the limit: clipping did clip)
    assert all(torch.equal(pa, pb) and pa.grad is None for pa, pb in zip(a.parameters(), b.parameters()))


def test_evaluate_counts_only_the_counted_batches_and_can_stop():
    m, _ = _model_and_opt()
    _, data = _batches(3)
    plan = [(0, True), (1, True), (2, False)]
    with torch.no_grad():
        m.eval()
        want = (m(*data[0])[1] + m(*data[1])[1]).item() / 2
    m.train()
    assert eval_stats(m, data.__getitem__, plan)["loss"] == pytest.approx(want, rel=1e-6) and m.training
    with pytest.raises(EvalInterrupted):
        eval_stats(m, data.__getitem__, plan, stop=lambda: True)
    assert m.training  # back in train mode after an interrupted evaluation too


def test_compile_guard_warns_once_rewinds_and_retries(caplog):
    class Counter:  # a Stateful the failed call consumed
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, sd):
            self.n = sd["n"]
    counter, eager, calls = Counter(), [], []

    def fn():
        counter.n += 1
        torch.rand(1)
        calls.append(torch.get_rng_state().clone())
        if not eager:
            raise RuntimeError("backend compiler failed\nmore")
        return counter.n
    guard = CompileGuard(True, lambda: eager.append(1), rewound=[counter])
    with caplog.at_level(logging.WARNING):
        assert guard.run("train", fn) == 1  # rewound before the eager retry
    assert torch.equal(calls[0], calls[1]) and not guard.enabled
    assert [r.message for r in caplog.records] == ["torch.compile failed (RuntimeError: backend compiler failed): "
                                                   "continuing without compilation (train.compile=false skips the "
                                                   "attempt)"]
    oom = CompileGuard(True, lambda: None)
    with pytest.raises(torch.OutOfMemoryError):
        oom.run("eval", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("out of memory")))


def test_eval_stats_bits_per_byte_is_nats_over_the_bytes_of_the_counted_targets():
    m, _ = _model_and_opt()
    _, data = _batches(3)
    data[1][1][0, :5] = -1  # ignored targets: neither nats nor bytes
    tb = torch.arange(32) % 4  # ids of 0..3 bytes
    plan = [(0, True), (1, True), (2, False)]
    nats = n_bytes = 0.0
    with torch.no_grad():
        m.eval()
        for x, y in data[:2]:
            real = y >= 0
            nats += m(x, y)[1].item() * real.sum().item()
            n_bytes += tb[y[real]].sum().item()
    m.train()
    sums = []
    got = eval_stats(m, data.__getitem__, plan, token_bytes=tb, reduce_sum=lambda t: sums.append(t) or t)
    assert got["bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert got["loss"] == pytest.approx(eval_stats(m, data.__getitem__, plan)["loss"], rel=1e-6) and len(sums) == 1
    assert eval_stats(m, data.__getitem__, plan)["bpb"] is None  # no byte table: no bpb
    assert eval_stats(m, data.__getitem__, plan, token_bytes=torch.zeros(32, dtype=torch.long))["bpb"] is None


def test_compile_guard_warns_with_the_reason_not_a_header(caplog):
    """torch 2.6's BackendCompilerFailed begins "backend='inductor' raised:"; the reason is on the next line."""
    guard, eager = CompileGuard(True, lambda: eager.append(1)), []

    def fn():
        if not eager:
            raise RuntimeError("backend='inductor' raised:\nInductorError: C++ compiler not found\n\nmore")
        return 1
    with caplog.at_level(logging.WARNING):
        assert guard.run("train", fn) == 1
    assert [r.message for r in caplog.records] == ["torch.compile failed (InductorError: C++ compiler not found): "
                                                   "continuing without compilation (train.compile=false skips the "
                                                   "attempt)"]


def test_eval_stats_reports_its_progress_after_each_batch():
    """Issue 50: an evaluation that takes minutes must be able to show how far it is
    (runtime.console.Progress)."""
    m, _ = _model_and_opt()
    _, data = _batches(3)
    seen = []
    plan = [(0, True), (1, False), (2, True)]
    eval_stats(m, data.__getitem__, plan, progress=lambda *a: seen.append(a))
    assert seen == [(1, 3), (2, 3), (3, 3)]
