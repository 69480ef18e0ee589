"""The explorer's HTTP server: the standard library's ThreadingHTTPServer, the page's static files and the
attention API (contract in docs/explore.md). Requests run the model one at a time, under no_grad.

Static files are a fixed table of names, never a path joined from the request, so no URL can read another file.
Every bad request is a 4xx JSON {"error": "..."} (one line, what to fix) and the server keeps serving.
"""
from __future__ import annotations

import json
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from common.cli import failure_reason
from viz.explorer.model_view import ModelView, next_tokens, token_text

MAX_BODY = 64 * 1024
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/index.html": ("index.html", "text/html; charset=utf-8"),
          "/explorer.js": ("explorer.js", "text/javascript; charset=utf-8"),
          "/draw.js": ("draw.js", "text/javascript; charset=utf-8"),
          "/snapshot.js": ("snapshot.js", "text/javascript; charset=utf-8"),
          "/explorer.css": ("explorer.css", "text/css; charset=utf-8")}
FIELDS = {"text", "ids", "layers", "temperature", "top_k", "model", "scores", "logits"}


class RequestError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_request(body: bytes, views: list[ModelView]) -> dict:
    """The checked fields of an /api/attention body; RequestError (one line) for anything to fix."""
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON ({getattr(e, 'msg', 'not UTF-8')}): send an object "
                           'like {"text": "ROMEO:"}') from None
    if not isinstance(req, dict):
        raise RequestError('the request body must be a JSON object like {"text": "ROMEO:"}')
    unknown = sorted(set(req) - FIELDS)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}: use {', '.join(sorted(FIELDS))}")
    m = req.get("model", 0)
    if m not in range(len(views)) or isinstance(m, bool):
        raise RequestError(f"model {m!r} does not exist: use 0" + (" or 1" if len(views) > 1 else
                                                                    " (start explore.py with two models to compare)"))
    view = views[m]
    try:
        if "ids" in req:
            ids = req["ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError("ids must be a list of token ids (whole numbers)")
            view.check_ids(ids)
        elif isinstance(req.get("text"), str):
            ids = view.encode(req["text"])
        else:
            raise ValueError('give the text to look at: {"text": "ROMEO:"}')
    except ValueError as e:
        raise RequestError(str(e)) from None
    layers = req.get("layers", list(range(view.n_layer)))
    if not isinstance(layers, list) or not all(isinstance(l, int) and not isinstance(l, bool) for l in layers):
        raise RequestError(f"layers must be a list of layer numbers, e.g. [0, {view.n_layer - 1}]")
    bad = [l for l in layers if not 0 <= l < view.n_layer]
    if bad:
        raise RequestError(f"layer {bad[0]} does not exist: the model has layers 0..{view.n_layer - 1}")
    temperature, top_k = req.get("temperature", 1.0), req.get("top_k")
    if not _number(temperature) or not temperature >= 0 or temperature == float("inf"):
        raise RequestError(f"temperature {temperature!r} is invalid: use 0 (greedy) or a positive number like 0.8")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise RequestError(f"top_k {top_k!r} is invalid: use a whole number >= 1, or leave it out")
    return {"view": view, "ids": ids, "layers": layers, "temperature": float(temperature), "top_k": top_k,
            "scores": bool(req.get("scores", False)), "logits": bool(req.get("logits", False))}


def answer(req: dict):
    """(the model's result for a parsed request, the JSON fields every answer has)."""
    view = req["view"]
    with torch.no_grad():
        result = view.run(req["ids"], req["layers"])
    tok = view.tokenizer
    head = {"tokens": [token_text(tok, i) for i in result.ids], "ids": result.ids,
            "next": [{"token": token_text(tok, i), "id": i, "prob": p}
                     for i, p in next_tokens(result.logits, req["temperature"], req["top_k"])]}
    return result, head


def _numbers(t: torch.Tensor) -> list:
    """Nested lists of t's values to 10 decimals: within 5e-11 of the float32 values, and a third shorter and faster
    to write as JSON than their float64 reprs (0.30000001192092896); zeros stay exactly 0."""
    return t.double().round(decimals=10).tolist()


def attention_json(req: dict) -> dict:
    """The contract's answer: tokens, ids, attention [layer][head][query][key] in the order asked, next."""
    result, out = answer(req)
    out["attention"] = [_numbers(result.weights[l]) for l in req["layers"]]
    if req["scores"]:
        out["scores"] = [_numbers(result.scores[l]) for l in req["layers"]]
    if req["logits"]:
        out["logits"] = _numbers(result.logits)
    return out


def attention_binary(req: dict) -> bytes:
    """The same data compact, for the page: uint32 header length, a JSON header (padded to 4 bytes) naming each
    array's shape and byte offset, then the little-endian float32 arrays themselves."""
    result, header = answer(req)
    arrays = [("attention", l, result.weights[l]) for l in req["layers"]]
    arrays += [("scores", l, result.scores[l]) for l in req["layers"] if req["scores"]]
    arrays += [("logits", None, result.logits)] if req["logits"] else []
    blobs, offset, header["arrays"] = [], 0, []
    for name, layer, t in arrays:
        blob = t.contiguous().numpy().astype("<f4").tobytes()
        header["arrays"].append({"name": name, "layer": layer, "shape": list(t.shape), "offset": offset})
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 4)  # the arrays start 4-byte aligned: Float32Array views need it
    return struct.pack("<I", len(text)) + text + b"".join(blobs)


class Handler(BaseHTTPRequestHandler):
    server_version = "tinygpt-explore"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: the terminal shows the URL line and nothing per request
        pass

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj) -> None:
        self.send_body(status, json.dumps(obj).encode("utf-8"), "application/json")

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/api/info":
            return self.send_json(200, {"models": [v.describe() for v in self.server.views],
                                        "prompt": self.server.prompt})
        if path not in STATIC:
            return self.send_json(404, {"error": f"no such page: {path[:100]} (the explorer is at /)"})
        name, content_type = STATIC[path]
        self.send_body(200, (STATIC_DIR / name).read_bytes(), content_type)

    do_HEAD = do_GET

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        routes = {"/api/attention": attention_json, "/api/attention.bin": attention_binary}
        try:
            if path not in routes:
                raise RequestError(f"no such API: {path[:100]} (use POST /api/attention)", 404)
            body = self.read_body()
            with self.server.lock:  # one model run at a time
                req = parse_request(body, self.server.views)
                out = routes[path](req)
        except RequestError as e:
            self.close_connection = True  # an unread or partly read body must not become the next request
            return self.send_json(e.status, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - a model failure (out of memory, ...) ends this request, not the server
            print(f"explorer: {self.path[:100]} failed: {failure_reason(e)}", file=sys.stderr)
            return self.send_json(500, {"error": f"the model failed on this request ({failure_reason(e)})"})
        if isinstance(out, bytes):
            return self.send_body(200, out, "application/octet-stream")
        self.send_json(200, out)

    def read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError("the request has no Content-Length: send a JSON body", 411)
        if int(length) > MAX_BODY:
            raise RequestError(f"the request body is {int(length):,} bytes, over the {MAX_BODY // 1024} KB limit: "
                               "send a shorter text", 413)
        return self.rfile.read(int(length))

    def do_PUT(self):
        self.send_json(405, {"error": f"{self.command} is not supported: use GET for pages, POST for /api/attention"})

    do_DELETE = do_PATCH = do_PUT


class ExplorerServer(ThreadingHTTPServer):
    daemon_threads = True  # Ctrl-C does not wait for an open browser connection

    def __init__(self, address, views: list[ModelView], prompt: str = ""):
        super().__init__(address, Handler)
        self.views, self.prompt, self.lock = views, prompt, threading.Lock()


def make_server(views: list[ModelView], host: str = "127.0.0.1", port: int = 8000,
                prompt: str = "") -> ExplorerServer:
    """A bound server (port 0: a free one, see server.server_address); OSError when the port is taken."""
    return ExplorerServer((host, port), views, prompt)
