"""A sharded checkpoint's metadata (step, config, tokenizer, the trainer's, loader's and generators' state) as one
JSON file beside DCP's shards: readable by any tool, and no pickle. The few tensors in it (the generators' states)
are base64 with their dtype and shape; infinities are spelled out, so the file is strict JSON.
"""
from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

TENSOR, FLOAT = "__tensor__", "__float__"
DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")


def _encode(x, where: str):
    import torch
    if torch.is_tensor(x):
        t = x.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8)  # the bytes; dtype and shape say how to read them
        return {TENSOR: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                         "data": base64.b64encode(raw.numpy().tobytes()).decode("ascii")}}
    if isinstance(x, float) and not math.isfinite(x):
        return {FLOAT: repr(x)}  # 'inf', '-inf', 'nan'
    if isinstance(x, dict):
        assert all(isinstance(k, str) for k in x), f"{where}: JSON keys are strings"
        return {k: _encode(v, f"{where}.{k}") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(x)]
    assert x is None or isinstance(x, (str, int, float, bool)), f"{where}: {type(x).__name__} has no JSON form"
    return x


def _decode(obj: dict):
    if set(obj) == {FLOAT}:
        return float(obj[FLOAT])
    if set(obj) != {TENSOR}:
        return obj
    import torch
    t = obj[TENSOR]
    if t.get("dtype") not in DTYPES:
        raise ValueError(f"unknown tensor dtype {t.get('dtype')!r}")
    raw = torch.frombuffer(bytearray(base64.b64decode(t["data"], validate=True)), dtype=torch.uint8)
    return raw.view(getattr(torch, t["dtype"])).reshape(t["shape"]).clone()


def write_meta(meta: dict, path: str | os.PathLike) -> Path:
    """`meta` as JSON at `path`, atomically."""
    from common.files import write_text_atomic
    return write_text_atomic(Path(path), json.dumps(_encode(meta, "meta"), allow_nan=False))


def read_meta(path: str | os.PathLike) -> dict:
    """What write_meta wrote; ValueError (one line) if the file is not that, OSError if it cannot be read."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        return json.loads(text, object_hook=_decode)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:  # bad JSON, base64, dtype or shape
        raise ValueError(f"not the JSON tinygpt writes: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
