"""training/state.py: the Stateful parts of a run (counters, the unlogged metrics window, every rank's RNG)."""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from checkpoint import file as ck
from tests.helpers import find_non_plain
from training import state as TS
from runtime.ranks import Ranks


def test_rank_rng_state():
    base = TS.capture_rng_state()
    torch.manual_seed(5)
    other = TS.capture_rng_state()
    ckpt = {"rng": base, "rng_ranks": [base, other], "step": 7}
    two = [TS.rank_rng_state(ckpt, Ranks(rank=r, world_size=2, parallel="ddp"), 1) for r in range(2)]
    assert two[0] is base and two[1] is other  # same world size: each rank its own stream
    three = [TS.rank_rng_state(ckpt, Ranks(rank=r, world_size=3, parallel="ddp"), 1) for r in range(3)]
    assert three[0] is base
    assert not torch.equal(three[1]["torch"], three[2]["torch"])  # fresh, distinct, deterministic streams
    assert torch.equal(three[1]["torch"], TS.rank_rng_state(ckpt, Ranks(rank=1, world_size=3), 1)["torch"])
    single = {"rng": base, "step": 3}  # a single-process checkpoint
    assert TS.rank_rng_state(single, Ranks(), 1) is base


def test_train_state_round_trip_and_tokens_of_an_older_checkpoint():
    st = TS.TrainState(batch_tokens=64, step=5, tokens=320, best_val_loss=1.5, best_step=4, wandb_run_id="ab")
    sd = st.state_dict()
    assert set(sd) == {"step", "best_val_loss", "best_step", "wandb_run_id", "elapsed_s", "tokens", "eval_pending"}
    back = TS.TrainState(batch_tokens=64)
    back.load_state_dict(sd)
    assert (back.step, back.tokens, back.best_val_loss, back.best_step, back.wandb_run_id) == (5, 320, 1.5, 4, "ab")
    assert back.elapsed() >= sd["elapsed_s"]
    old = {"step": 3, "model_config": {"block_size": 8}, "rng_ranks": [{}, {}],  # before `tokens`, `best_*`
           "config": {"train": {"batch_size": 2, "grad_accum_steps": 2}}}
    back.load_state_dict(old)
    assert back.tokens == 3 * 2 * 2 * 2 * 8 and back.best_val_loss == math.inf and back.best_step is None
    back.load_state_dict({"step": 3})  # no config to go by: this run's global batch
    assert back.tokens == 3 * 64


def test_a_new_counter_is_one_field_saved_and_resumed_by_its_name(monkeypatch):
    """Issue 44: TrainState's state_dict is its fields, so a counter a resume must keep (a running mean) is one
    line; a checkpoint from before it gives the field's default."""
    import dataclasses
    Extended = dataclasses.make_dataclass("Extended", [("loss_mean", float, 0.0)], bases=(TS.TrainState,))
    st = Extended(step=3, loss_mean=2.5)
    assert st.state_dict()["loss_mean"] == 2.5 and "batch_tokens" not in st.state_dict()
    back = Extended(loss_mean=9.0)
    back.load_state_dict(st.state_dict())
    assert (back.step, back.loss_mean) == (3, 2.5)
    back.load_state_dict({"step": 4, "tokens": 8})
    assert (back.step, back.loss_mean) == (4, 0.0)


def _window(size):
    return TS.MetricsWindow(size, torch.device("cpu"), Ranks())


def test_metrics_window_keeps_unlogged_values_only_where_they_fit():
    w = _window(4)
    w.clear(8)
    for v in (1.0, 2.0):
        w.add({"loss": torch.tensor(v), "grad_norm": torch.tensor(v / 4)})
    sd = w.state_dict()
    assert sd == {"first_step": 8, "values": {"loss": [1.0, 2.0], "grad_norm": [0.25, 0.5]}}
    # kept where they end at the step and fit one window; else dropped (a wrong end, train.log_interval changed)
    for step, size, kept in ((10, 4, 2), (10, 8, 2), (11, 4, 0), (10, 2, 0), (10, 3, 0)):
        r = _window(size)
        r.load_state_dict(sd)
        r.start(step)
        assert r.read() == (sd["values"] if kept else {}) and r.restored == kept
        assert r.first_step == (8 if kept else step)
    bad = []
    w.add({"loss": torch.tensor(float("nan")), "grad_norm": torch.tensor(1.0)})
    assert w.read(lambda s, v: bad.append((s, v)))["loss"][:2] == [1.0, 2.0] and bad[0][0] == 11
    assert math.isnan(bad[0][1])


def test_metrics_window_reads_every_name_with_one_reduction_and_resumes_an_older_loss_window():
    """One all-reduce (one host sync) for every name and step; a checkpoint of the loss-only window (before
    grad_norm) resumes its losses, the names that come after it averaging over their own steps."""
    class Counting(Ranks):
        calls = 0

        def all_reduce_mean(self, t):
            Counting.calls += 1
            return t
    w = TS.MetricsWindow(4, torch.device("cpu"), Counting())
    w.load_state_dict({"first_step": 4, "losses": [3.0, 5.0]})
    w.start(6)
    w.add({"loss": torch.tensor(1.0), "grad_norm": torch.tensor(0.5)})
    assert w.read() == {"loss": [3.0, 5.0, 1.0], "grad_norm": [0.5]} and Counting.calls == 1
    assert (w.first_step, w.restored) == (4, 2)


def test_rng_state_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # a cached gaussian in numpy's state
    state = TS.capture_rng_state()
    assert find_non_plain(state) is None
    p = ck.save_checkpoint({"format": "tinygpt", "version": 1, "rng": state}, tmp_path / "rng.pt")
    expect = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    TS.seed_all(99)
    TS.restore_rng_state(torch.load(p, weights_only=True)["rng"])
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3))
    assert got[:3] == expect[:3] and torch.equal(got[3], expect[3])


def test_seed_all_is_reproducible():
    TS.seed_all(7)
    a = (random.random(), np.random.rand(), torch.rand(2))
    TS.seed_all(7)
    assert (random.random(), np.random.rand()) == a[:2] and torch.equal(torch.rand(2), a[2])
