"""What an /api/attention request may hold (contract in docs/explore.md), checked strictly: a script's mistake is
one line saying what to fix, never a silent guess. So the body is JSON proper (no NaN or Infinity, no field given
twice), each field has its one type (`"scores": "no"` is not true, `1.0` is not model 1), and `text` and `ids`
together are refused rather than one of them winning.
"""
from __future__ import annotations

import collections
import json

from model.sampling import SETTINGS, Sampling

FIELDS = {"text", "ids", "layers", "model", "scores", "logits", *SETTINGS}  # SETTINGS: temperature, top_k, ...
LENS_FIELDS = {"text", "ids", "model", "top"}


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unique_fields(pairs: list) -> dict:
    names = [name for name, _ in pairs]
    if len(set(names)) < len(names):
        twice = next(n for n, count in collections.Counter(names).items() if count > 1)
        raise RequestError(f"the field {twice!r} is given twice: send each field once")
    return dict(pairs)


def _no_constant(name: str):
    raise RequestError(f"the request body holds {name}, which is not JSON: send finite numbers")


def read_json(body: bytes):
    """The body as strict JSON; RequestError when it is not."""
    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=_unique_fields, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON ({getattr(e, 'msg', 'not UTF-8')}): send an object "
                           'like {"text": "ROMEO:"}') from None


def _flag(req: dict, name: str) -> bool:
    value = req.get(name, False)
    if not isinstance(value, bool):
        raise RequestError(f"{name} {value!r} is invalid: use true or false (JSON), or leave it out")
    return value


def _text_or_ids(req: dict) -> tuple[str | None, list[int] | None]:
    if "ids" in req and "text" in req:
        raise RequestError('give "text" or "ids", not both: the text is tokenized into ids, so one says it all')
    if "ids" in req:
        if not isinstance(req["ids"], list) or not all(_whole(i) for i in req["ids"]):
            raise RequestError("ids must be a list of token ids (whole numbers)")
        return None, req["ids"]
    text = req.get("text")
    if not isinstance(text, str):
        raise RequestError('give the text to look at: {"text": "ROMEO:"}')
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"the text holds a lone surrogate ({text[e.start]!r}), which is no character: send "
                           "valid Unicode text") from None
    return text, None


def parse_request(body: bytes, views: list, fields: set = FIELDS) -> dict:
    """The checked fields of an /api/attention body (or with LENS_FIELDS a /api/lens body: the text, the model and
    `top`, 1 to 20 tokens per cell); RequestError (one line) for anything to fix."""
    req = read_json(body)
    if not isinstance(req, dict):
        raise RequestError('the request body must be a JSON object like {"text": "ROMEO:"}')
    unknown = sorted(set(req) - fields)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}: use {', '.join(sorted(fields))}")
    m = req.get("model", 0)
    if not _whole(m) or not 0 <= m < len(views):
        raise RequestError(f"model {m!r} does not exist: use 0" + (" or 1" if len(views) > 1 else
                                                                    " (start explore.py with two models to compare)"))
    view = views[m]
    text, ids = _text_or_ids(req)
    try:
        ids = view.encode(text) if ids is None else view.check_ids(ids)
    except ValueError as e:  # with two models, which one (the page calls them A and B): their contexts differ
        raise RequestError(f"model {'AB'[m]}: {e}" if len(views) > 1 else str(e)) from None
    if fields is LENS_FIELDS:
        top, most = req.get("top", 5), min(20, view.tokenizer.vocab_size)
        if not _whole(top) or not 1 <= top <= most:
            raise RequestError(f"top {top!r} is invalid: use a whole number from 1 to {most} (tokens per position)")
        return {"view": view, "ids": ids, "top": top}
    layers = req.get("layers", list(range(view.n_layer)))
    if not isinstance(layers, list) or not all(_whole(l) for l in layers):
        raise RequestError(f"layers must be a list of layer numbers, e.g. [0, {view.n_layer - 1}]")
    bad = [l for l in layers if not 0 <= l < view.n_layer]
    if bad:
        raise RequestError(f"layer {bad[0]} does not exist: the model has layers 0..{view.n_layer - 1}")
    if len(set(layers)) < len(layers):
        twice = next(l for l, count in collections.Counter(layers).items() if count > 1)
        raise RequestError(f"layer {twice} is asked twice: list each layer once")
    try:
        sampling = Sampling(**{name: req[name] for name in SETTINGS if name in req})  # (top_k null: as if left out)
    except ValueError as e:
        raise RequestError(str(e)) from None
    return {"view": view, "ids": ids, "layers": layers, "sampling": sampling, "scores": _flag(req, "scores"),
            "logits": _flag(req, "logits")}
