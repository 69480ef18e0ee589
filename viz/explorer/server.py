"""The explorer's HTTP server: the standard library's ThreadingHTTPServer, the page's static files and the
attention, logit lens and probe snapshot API (contract in docs/explore.md). Requests run the model one at a time.

Static files are a fixed table of names, never a path joined from the request, so no URL can read another file.
Every reply but the pages is strict JSON (no NaN or Infinity), a refusal {"error": "..."} of one line, the standard
library's own refusals included, and it closes the connection saying so. Who may ask is guard.py's; what a request
may hold is request.py's. The terminal stays clean: a client gone or idle past IDLE_TIMEOUT is no error.
"""
from __future__ import annotations

import json
import re
import socket
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from common.cli import failure_reason
from viz import probes
from viz.explorer import guard
from viz.explorer.model_view import ModelView, first_prompt, next_tokens, token_text
from viz.explorer.request import FIELDS, LENS_FIELDS, RequestError, parse_request

MAX_BODY = 64 * 1024
IDLE_TIMEOUT = 20  # seconds a connection may wait for the client: an idle one holds a thread
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/index.html": ("index.html", "text/html; charset=utf-8"),
          "/explorer.js": ("explorer.js", "text/javascript; charset=utf-8"),
          "/draw.js": ("draw.js", "text/javascript; charset=utf-8"),
          "/snapshot.js": ("snapshot.js", "text/javascript; charset=utf-8"),
          "/next.js": ("next.js", "text/javascript; charset=utf-8"),
          "/lens.js": ("lens.js", "text/javascript; charset=utf-8"),
          "/panels.js": ("panels.js", "text/javascript; charset=utf-8"),
          "/timeline.js": ("timeline.js", "text/javascript; charset=utf-8"),
          "/explorer.css": ("explorer.css", "text/css; charset=utf-8")}


def answer(req: dict):
    """(the model's result for a parsed request, the JSON fields every answer has)."""
    view = req["view"]
    with torch.no_grad():
        result = view.run(req["ids"], req["layers"])
    tok = view.tokenizer
    head = {"tokens": [token_text(tok, i) for i in result.ids], "ids": result.ids, "text": view.text_of(result.ids),
            "next": [{"token": token_text(tok, i), "id": i, "prob": p}
                     for i, p in next_tokens(result.logits, result.ids, req["sampling"])]}
    return result, head


def _numbers(t: torch.Tensor) -> list:
    """Nested lists of t's values to 10 decimals: within 5e-11 of the float32 values, and a third shorter and faster
    to write as JSON than their float64 reprs (0.30000001192092896); zeros stay exactly 0."""
    return t.double().round(decimals=10).tolist()


def to_json(obj) -> bytes:
    """Strict JSON: a NaN or infinity raises (a 500 line) rather than reaching a parser that rejects it."""
    return json.dumps(obj, allow_nan=False).encode("utf-8")


def attention_json(req: dict) -> bytes:
    """The contract's answer: tokens, ids, text, attention [layer][head][query][key] in the order asked, next."""
    result, out = answer(req)
    out["attention"] = [_numbers(result.weights[l]) for l in req["layers"]]
    if req["scores"]:
        out["scores"] = [_numbers(result.scores[l]) for l in req["layers"]]
    if req["logits"]:
        out["logits"] = _numbers(result.logits)
    return to_json(out)


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
    text = to_json(header)
    text += b" " * (-len(text) % 4)  # the arrays start 4-byte aligned: Float32Array views need it
    return struct.pack("<I", len(text)) + text + b"".join(blobs)


def lens_cells(tokenizer, probs: torch.Tensor, ids: torch.Tensor) -> list:
    """[layer][position] -> [{"token", "id", "prob"}, ...] of (layers, T, top) probabilities and ids."""
    return [[[{"token": token_text(tokenizer, i), "id": i, "prob": p} for i, p in zip(*cell)] for cell in zip(*row)]
            for row in zip(ids.tolist(), _numbers(probs.float()))]


def lens_json(req: dict) -> bytes:
    """The logit lens of a text (model/lens.py): tokens, ids, lens [layer][position] -> the top tokens."""
    view, ids = req["view"], req["ids"]
    return to_json({"tokens": [token_text(view.tokenizer, i) for i in ids], "ids": ids,
                    "lens": lens_cells(view.tokenizer, *view.lens(ids, req["top"]))})


def probes_json(view: ModelView, step: str | None) -> bytes:
    """Model A's run's probe snapshots (viz/probes.py): the probe, its steps and losses (val at an evaluation, else
    the step's train loss; null where none), or one step's."""
    recorded = probes.steps(view.run_dir) if view.run_dir is not None else []
    if step is None:  # (the metadata only: the tensors are not read)
        snaps = [probes.read_snapshot(view.run_dir, s, tensors=False) for s in recorded]
        first = snaps[0] if snaps else {"text": "", "ids": []}
        return to_json({"text": first["text"], "tokens": [token_text(view.tokenizer, i) for i in first["ids"]],
                        "steps": recorded, **{k: [s[k] for s in snaps] for k in ("val_loss", "train_loss")}})
    if int(step) not in recorded:
        raise RequestError(f"no probe snapshot at step {step[:20]}: GET /api/probes lists the steps recorded", 404)
    snap = probes.read_snapshot(view.run_dir, int(step))
    return to_json({"step": snap["step"], "attention": _numbers(snap["attention"].float()),
                    "lens": lens_cells(view.tokenizer, snap["lens_probs"], snap["lens_ids"])})


ROUTES = {"/api/attention": (attention_json, "application/json"),
          "/api/attention.bin": (attention_binary, "application/octet-stream"),
          "/api/lens": (lens_json, "application/json")}


class Handler(BaseHTTPRequestHandler):
    server_version = "tinygpt-explore"
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT

    def log_message(self, format, *args):  # quiet: the terminal shows the URL line and nothing per request
        pass

    def send_body(self, status: int, body: bytes, content_type: str, *headers: tuple[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers:
            self.send_header(name, value)
        if status >= 400 or self.body_unread():  # a body left unread must not be taken for the next request
            self.send_header("Connection", "close")  # (sets close_connection)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj, *headers: tuple[str, str]) -> None:
        self.send_body(status, to_json(obj), "application/json", *headers)

    def send_error(self, code, message=None, explain=None):
        """The standard library's own refusals (a malformed request line, an unknown method, headers too long) as
        the same JSON line as the explorer's, not an HTML page."""
        if self.request_version == "HTTP/0.9":  # a malformed line is taken for HTTP/0.9, which has no status line
            self.request_version = self.protocol_version
        reason = message or self.responses.get(code, ("refused",))[0]
        self.send_json(code, {"error": f"{reason[:200]}: the explorer answers HTTP/1.1 GET of its pages and POST "
                                       "/api/attention"})

    def do_GET(self):
        self.reply(self.page)

    do_HEAD = do_GET

    def do_POST(self):
        self.reply(self.api)

    def do_PUT(self):
        self.send_json(405, {"error": f"{self.command} is not supported: use GET for pages, POST for /api/attention"},
                       ("Allow", "GET, HEAD, POST"))

    do_DELETE = do_PATCH = do_OPTIONS = do_PUT

    def reply(self, route) -> None:
        """route(path) -> (body, content type) answered, a RequestError as its line, any other failure as a 500
        line; a client gone or timed out ends the connection quietly (the server's handle_error)."""
        path = self.path.split("?", 1)[0]
        try:
            guard.check(self.headers, self.server.hosts, api=path.startswith("/api/"))
            body, content_type = route(path)
        except RequestError as e:
            return self.send_json(e.status, {"error": str(e)})
        except (ConnectionError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001 - a model failure (out of memory, ...) ends this request, not the server
            print(f"explorer: {self.path[:100]} failed: {failure_reason(e)}", file=sys.stderr)
            return self.send_json(500, {"error": f"the model failed on this request ({failure_reason(e)})"})
        self.send_body(200, body, content_type)

    def page(self, path: str) -> tuple[bytes, str]:
        if path == "/api/info":
            return to_json({"models": [v.describe() for v in self.server.views],
                            "prompt": self.server.prompt}), "application/json"
        if (probe := re.fullmatch(r"/api/probes(?:/(\d{1,12}))?", path)) is not None:
            return probes_json(self.server.views[0], probe.group(1)), "application/json"  # files: no model lock
        if path in ROUTES:
            raise RequestError(f"{path} takes a POST with a JSON body, not a {self.command}", 405)
        if path not in STATIC:
            raise RequestError(f"no such page: {path[:100]} (the explorer is at /)", 404)
        name, content_type = STATIC[path]
        return (STATIC_DIR / name).read_bytes(), content_type

    def api(self, path: str) -> tuple[bytes, str]:
        if path not in ROUTES:
            raise RequestError(f"no such API: {path[:100]} (use POST /api/attention)", 404)
        guard.check_json_body(self.headers)
        body = self.read_body()
        route, content_type = ROUTES[path]
        with self.server.lock:  # one model run at a time
            fields = LENS_FIELDS if path == "/api/lens" else FIELDS
            return route(parse_request(body, self.server.views, fields)), content_type

    def body_unread(self) -> bool:
        """Whether the request announced a body the explorer does not read (a GET with one)."""
        return self.command != "POST" and (self.headers.get("Content-Length", "0").strip() != "0"
                                            or "Transfer-Encoding" in self.headers)

    def read_body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:
            raise RequestError("a chunked body is not supported: send the JSON with a Content-Length", 411)
        length = ", ".join(self.headers.get_all("Content-Length", []))  # two headers: ambiguous, refused below
        if not length:
            raise RequestError("the request has no Content-Length: send a JSON body", 411)
        if not re.fullmatch(r"[0-9]{1,18}", length):
            raise RequestError(f"Content-Length {length[:40]!r} is not a number of bytes: send the body's length", 400)
        if int(length) > MAX_BODY:
            raise RequestError(f"the request body is {int(length):,} bytes, over the {MAX_BODY // 1024} KB limit: "
                               "send a shorter text", 413)
        return self.rfile.read(int(length))


class ExplorerServer(ThreadingHTTPServer):
    daemon_threads = True  # Ctrl-C does not wait for an open browser connection

    def __init__(self, address, views: list[ModelView], prompt: str = ""):
        if ":" in address[0]:  # an IPv6 address (--host ::1, --host ::)
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.views, self.prompt, self.lock = views, prompt, threading.Lock()
        self.hosts = guard.Hosts(address[0], self.server_address[0])  # as given, and as the URL line prints it

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if self.address_family == socket.AF_INET6 else host}:{port}/"

    def handle_error(self, request, client_address):
        """A client that closed its connection (a tab closed, a script stopped) or stalled past IDLE_TIMEOUT is no
        failure of the explorer's: nothing is printed. Anything else is one line, not a traceback per connection."""
        e = sys.exc_info()[1]
        if not isinstance(e, (ConnectionError, TimeoutError)):
            print(f"explorer: a connection from {client_address[0]} failed: {failure_reason(e)}", file=sys.stderr)


def make_server(views: list[ModelView], host: str = "127.0.0.1", port: int = 8000,
                prompt: str = "") -> ExplorerServer:
    """A bound server (port 0: a free one, see server.server_address); OSError when the port is taken. The page
    starts with `prompt`, or else first_prompt's, so that its first load shows every panel."""
    return ExplorerServer((host, port), views, prompt or first_prompt(views))
