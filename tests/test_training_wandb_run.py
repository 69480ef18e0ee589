"""training/wandb_run.py: WANDB_MODE wins over logger.mode; a failing wandb.init is one line."""
from __future__ import annotations

import sys
import types

import pytest

from training.config import Config
from training.wandb_run import WandbRun


@pytest.mark.parametrize("env, mode, expect", [
    (None, "online", "online"), ("offline", "online", "offline"), ("dryrun", "online", "offline"),
    ("DISABLED", "offline", "disabled"), ("nonsense", "offline", "offline"),
])
def test_effective_mode(monkeypatch, env, mode, expect):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    if env is not None:
        monkeypatch.setenv("WANDB_MODE", env)
    assert WandbRun.effective_mode(mode) == expect


def _fake_wandb(monkeypatch, init):
    fake = types.SimpleNamespace(init=init, login=lambda **kw: True)
    monkeypatch.setitem(sys.modules, "wandb", fake)


def test_init_failure_is_one_line(monkeypatch, tmp_path):
    def init(**kw):
        raise RuntimeError("api.wandb.ai unreachable\nlong details")
    _fake_wandb(monkeypatch, init)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ValueError, match=r"wandb could not start a offline run \(RuntimeError: api.wandb.ai "
                                         r"unreachable\).*logger.mode=offline") as info:
        WandbRun().start(Config(), tmp_path, "abc123")
    assert "\n" not in str(info.value)


def test_logs_go_to_the_run_and_finish_once(monkeypatch, tmp_path):
    calls = []
    run = types.SimpleNamespace(log=lambda data, step: calls.append(("log", data, step)),
                                finish=lambda exit_code: calls.append(("finish", exit_code)))
    seen = {}
    _fake_wandb(monkeypatch, lambda **kw: seen.update(kw) or run)
    monkeypatch.setenv("WANDB_MODE", "offline")
    w = WandbRun()
    w.log({"loss": 1.0}, step=1)  # before start: nothing, no error
    w.start(Config(), tmp_path, "abc123")
    assert seen["id"] == "abc123" and seen["resume"] == "allow" and seen["mode"] == "offline"
    assert seen["config"]["logger"]["mode"] == "online"  # the run's config, resolved
    w.log({"loss": 2.0}, step=2)
    w.finish(3)
    w.finish(0)
    assert calls == [("log", {"loss": 2.0}, 2), ("finish", 3)]


def test_wandb_not_installed_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError, as when it is absent
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ValueError, match=r"^logger=wandb needs the wandb package, which is not installed: "
                                         r"pip install wandb") as info:
        WandbRun().start(Config(), tmp_path, "abc123")
    assert "\n" not in str(info.value)
