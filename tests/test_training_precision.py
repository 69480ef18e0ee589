"""training/precision.py: autocast, GradScaler and their refusals per device; training on MPS mocked (no Mac here):
float32 by default, 16-bit autocast, GradScaler's torch version."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.torch_version import TorchVersion

from model.device import resolve_device
from training.config import train_keys
from training.precision import Precision, setup_precision

MPS = torch.device("mps")  # a device object only: nothing is allocated on it


@pytest.fixture
def mps(monkeypatch):
    """A Mac as torch reports it: MPS on macOS 15, no CUDA; torch 2.8 unless a test says otherwise."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: (15, 0) >= (major, minor))
    monkeypatch.setattr(torch, "__version__", TorchVersion("2.8.0"))
    return monkeypatch


def test_the_cpu_trains_in_float32_without_autocast_or_scaler():
    p = setup_precision(torch.device("cpu"), "auto")
    assert p == Precision(torch.device("cpu"), torch.float32) and p.dtype_name == "float32"
    assert isinstance(p.autocast(), contextlib.nullcontext) and not p.use_grad_scaler and p.grad_scaler() is None
    with pytest.raises(ValueError, match="float16 needs a GPU"):
        setup_precision(torch.device("cpu"), "float16")


def test_mps_auto_trains_in_float32_without_autocast(mps):
    p = setup_precision(resolve_device("auto"), "auto")
    assert p.device == MPS and p.dtype == torch.float32 and not p.use_grad_scaler
    assert isinstance(p.autocast(), contextlib.nullcontext)


@pytest.mark.parametrize("dtype, scaler", [("bfloat16", False), ("float16", True)])
def test_mps_16_bit_autocasts_on_mps(mps, dtype, scaler):
    p = setup_precision(resolve_device("mps"), dtype)
    assert p.dtype == getattr(torch, dtype) and p.use_grad_scaler is scaler and p.dtype_name == dtype
    ctx = p.autocast()
    assert isinstance(ctx, torch.autocast) and ctx.device == "mps" and ctx.fast_dtype == p.dtype


def test_mps_float16_before_torch_2_8_is_refused_in_one_line(mps):
    """Fails before issue 23: float16 was accepted, and GradScaler's first step failed on MPS (torch < 2.8)."""
    mps.setattr(torch, "__version__", TorchVersion("2.7.1"))
    with pytest.raises(ValueError) as e, train_keys():
        setup_precision(resolve_device("mps"), "float16")
    assert str(e.value) == ("train.dtype=float16 on Apple's MPS needs torch 2.8 or newer (its GradScaler): "
                            "upgrade torch, or use train.dtype=bfloat16 (macOS 14+) or train.dtype=float32")
    assert setup_precision(resolve_device("mps"), "bfloat16").dtype == torch.bfloat16  # no GradScaler: fine on 2.7


def test_fsdp_refuses_float16_in_one_line(mps):
    """FSDP's shards would each see their own inf checks in a GradScaler."""
    with pytest.raises(ValueError, match="^train.parallel=fsdp does not support float16 with a GradScaler: use "
                                         r"train.dtype=bfloat16 \(or float32\), or train.parallel=ddp$"):
        setup_precision(MPS, "float16", parallel="fsdp")
    assert setup_precision(MPS, "float16", parallel="ddp").use_grad_scaler
