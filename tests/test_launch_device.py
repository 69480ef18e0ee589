"""launch/device.py on Apple's MPS, mocked (no Mac here): precision, GradScaler's torch version, autocast, MFU,
compile=auto; and launch/distributed.py refusing MPS under torchrun."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from torch.torch_version import TorchVersion

from launch import device as training_device
from launch import distributed
from launch.ranks import DistInfo
from training.config import train_keys
from launch.device import resolve_compile, setup_device
from model.device import resolve_device

MPS = torch.device("mps")


@pytest.fixture
def mps(monkeypatch):
    """A Mac as torch reports it: MPS on macOS 15, no CUDA; torch 2.8 unless a test says otherwise."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: (15, 0) >= (major, minor))
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.8.0"))
    return monkeypatch


def test_mps_auto_trains_in_float32_without_autocast(mps):
    dev = setup_device(resolve_device("auto"), "auto")
    assert dev.device == MPS and dev.dtype == torch.float32 and not dev.use_grad_scaler
    assert dev.autocast is contextlib.nullcontext
    assert dev.name == "MPS" and dev.peak_flops is None  # no datasheet figure: no MFU


@pytest.mark.parametrize("dtype, scaler", [("bfloat16", False), ("float16", True)])
def test_mps_16_bit_autocasts_on_mps(mps, dtype, scaler):
    dev = setup_device(resolve_device("mps"), dtype)
    assert dev.dtype == getattr(torch, dtype) and dev.use_grad_scaler is scaler and dev.peak_flops is None
    ctx = dev.autocast()
    assert isinstance(ctx, torch.autocast) and ctx.device == "mps" and ctx.fast_dtype == dev.dtype


def test_mps_float16_before_torch_2_8_is_refused_in_one_line(mps):
    """Fails before issue 23: float16 was accepted, and GradScaler's first step failed on MPS (torch < 2.8)."""
    mps.setattr(torch, "__version__", TorchVersion("2.7.1"))
    with pytest.raises(ValueError) as e, train_keys():
        setup_device(resolve_device("mps"), "float16")
    assert str(e.value) == ("train.dtype=float16 on Apple's MPS needs torch 2.8 or newer (its GradScaler): "
                            "upgrade torch, or use train.dtype=bfloat16 (macOS 14+) or train.dtype=float32")
    assert setup_device(resolve_device("mps"), "bfloat16").dtype == torch.bfloat16  # no GradScaler: fine on 2.7


def test_compile_auto_is_off_on_mps_with_its_reason(caplog):
    """Fails before issue 23: compile=auto was off on MPS without a word."""
    with caplog.at_level(logging.WARNING, logger=training_device.__name__):
        assert resolve_compile("auto", MPS) is False
    assert [r.getMessage() for r in caplog.records] == [
        "train.compile=auto: compiling off: torch.compile on Apple's MPS backend is a prototype"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=training_device.__name__):
        assert resolve_compile("auto", torch.device("cpu")) is False  # the CPU: off, and nothing to say
        assert resolve_compile(True, MPS) is True  # asked for: tried
    assert not caplog.records


def test_torchrun_on_mps_is_refused_before_any_process_group(mps):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost",
                 "MASTER_PORT": "29500"}.items():
        mps.setenv(k, v)
    mps.setattr(distributed.dist, "init_process_group", lambda *a, **k: pytest.fail("a process group was started"))
    with pytest.raises(ValueError, match="^multi-process training does not support Apple's MPS device: use "
                                         r"train.device=cpu \(gloo\)"):
        distributed.init(DistInfo(), "auto", "none")
    for k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        mps.delenv(k)
    assert not distributed.init(DistInfo(), "mps", "none").distributed  # one process on MPS: no process group needed
