"""model/device.py: the device auto-choice (CUDA > MPS > CPU) and the dtype rules per device, MPS mocked (no Mac
here), and what an MPS device means for sampling: never a CUDA graph, never the compiled decode; and compile=auto on
MPS (training's precision there: tests/test_training_precision.py)."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

from model.fast_decode import pick_decode
from model.generate import next_token_probs
from model import device as training_device
from model.device import resolve_compile, resolve_device, resolve_dtype

MPS = torch.device("mps")  # a device object only: nothing is allocated on it


@pytest.fixture
def gpus(monkeypatch):
    """gpus(cuda=N, mps=bool, macos=(major, minor)): what torch reports about the accelerators."""
    def set_(cuda: int = 0, mps: bool = False, macos=(15, 0)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos >= (major, minor))
    return set_


@pytest.mark.parametrize("cuda, mps, expected", [(2, True, "cuda:1"), (0, True, "mps"), (0, False, "cpu")])
def test_auto_prefers_cuda_then_mps_then_cpu(gpus, cuda, mps, expected):
    gpus(cuda=cuda, mps=mps)
    assert resolve_device("auto", local_rank=1) == torch.device(expected)


def test_mps_asked_for_where_there_is_none_is_one_line(gpus):
    gpus(mps=False)
    with pytest.raises(ValueError, match="^device=mps but Apple's MPS backend is not available: use device=auto"):
        resolve_device("mps")
    gpus(mps=True)
    assert resolve_device("mps") == MPS


def test_dtype_auto_on_mps_is_float32_and_16_bit_is_allowed(gpus):
    gpus(mps=True, macos=(14, 0))
    assert resolve_dtype("auto", MPS) == torch.float32  # fp16 needs a GradScaler; bf16 saves memory, not time
    assert resolve_dtype("float16", MPS) == torch.float16
    assert resolve_dtype("bfloat16", MPS) == torch.bfloat16


def test_bfloat16_on_mps_before_macos_14_is_refused_in_one_line(gpus):
    """Fails before issue 23: bfloat16 was accepted, and torch's autocast then warned and ran in float32."""
    gpus(mps=True, macos=(13, 6))
    with pytest.raises(ValueError) as e:
        resolve_dtype("bfloat16", MPS)
    assert str(e.value) == ("dtype=bfloat16 on Apple's MPS needs macOS 14 or newer: use dtype=float32 (or auto), "
                            "or dtype=float16")
    assert resolve_dtype("float16", MPS) == torch.float16


def test_float16_on_the_cpu_is_still_refused():
    with pytest.raises(ValueError, match="^dtype=float16 needs a GPU"):
        resolve_dtype("float16", torch.device("cpu"))


# Sampling on MPS (model/fast_decode.py's pick_decode): the CUDA-graph and compiled paths are CUDA's alone.

@pytest.mark.parametrize("cuda_graphs, use_kv_cache", [(True, True), (False, True), (True, False)])
def test_mps_decodes_eagerly_without_cuda_graphs(cuda_graphs, use_kv_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and says nothing: eager is the plain path there
        assert pick_decode(MPS, False, cuda_graphs, use_kv_cache) is next_token_probs


def test_mps_compile_warns_and_decodes_eagerly(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile was called for MPS"))
    with pytest.warns(RuntimeWarning, match="needs a CUDA device; running the eager cached decode on mps"):
        assert pick_decode(MPS, True, True, True) is next_token_probs


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


def test_cpu_device_and_dtype():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="float16 needs a GPU"):
        resolve_dtype("float16", torch.device("cpu"))
    assert resolve_compile("auto", torch.device("cpu")) is False
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_auto_dtype_on_cuda_needs_bf16_in_hardware(monkeypatch):
    """V100/T4 emulate bf16 (torch says "supported" by default): auto picks fp16 + GradScaler there."""
    asked = {}

    def supported(including_emulation=True):
        asked["including_emulation"] = including_emulation
        return including_emulation  # an emulating GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.float16
    assert asked == {"including_emulation": False}
    assert resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16  # asked for: allowed
