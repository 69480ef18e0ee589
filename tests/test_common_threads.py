"""common/threads.py: threads sleep instead of spinning only when other processes use the CPUs."""
from __future__ import annotations

import os

import pytest

from common import threads


@pytest.mark.parametrize("busy, env, want", [
    (0.0, {}, None),                                   # quiet: OpenMP's default (spinning is faster there)
    (None, {}, None),                                  # the load cannot be read here: leave it
    (1.0, {}, "PASSIVE"),                              # another process holds a core: sleep, don't spin
    (1.0, {"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),    # the user's choice wins
    (1.0, {"OMP_NUM_THREADS": "1"}, None),             # the user chose the threads: leave the policy alone
])
def test_wait_policy_follows_the_load(monkeypatch, busy, env, want):
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"):  # setenv first: undo then restores the original state
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(threads, "busy_cores", lambda: busy)
    threads.configure_threads()
    assert os.environ.get("OMP_WAIT_POLICY") == want

