"""The OpenAI-compatible endpoint (serve.py): `/v1/chat/completions`, `/v1/completions` (each
streamed as server-sent events or whole) and `/v1/models`, on the standard library's
ThreadingHTTPServer.

Requests queue: each runs the model under one lock, so a second request waits for the first to
finish rather than failing. Bad requests get OpenAI's error shape (chat/openai_request.py). Who may
ask is the explorer's rule (viz/explorer/guard.py: the Host must be a name this server listens as, a
browser page of another site is refused), so a page on another site cannot use a model on 127.0.0.1.
"""
from __future__ import annotations

import json
import re
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chat.openai_request import BadRequest, parse
from chat.reply import Answer, Request, new_generator, stream
from common.cli import failure_reason
from viz.explorer import guard
from viz.explorer.request import RequestError

MAX_BODY = 1 << 20
IDLE_TIMEOUT = 60


class Endpoint:
    """The model behind the endpoint: its name, tokenizer, chat format (None for a base model) and
    lock."""

    def __init__(self, model, tokenizer, name: str, decode=None):
        from data.chat_template import ChatFormat, has_chat
        self.model, self.tokenizer, self.name, self.decode = model, tokenizer, name, decode
        self.fmt = ChatFormat(tokenizer) if has_chat(tokenizer) else None
        self.lock, self.created = threading.Lock(), int(time.time())

    def request(self, settings: dict, chat: bool) -> Request:
        """The prompt ids and sampling of a parsed request (a BadRequest when it cannot be
        answered)."""
        from model.sampling import Sampling
        block = self.model.config.block_size
        if chat:
            if self.fmt is None:
                raise BadRequest(f"{self.name} has no chat template (a base model): use "
                                 "/v1/completions, or fine-tune it on conversations "
                                 "(docs/chat.md)", "messages")
            param = "messages"
            try:
                ids = self.fmt.prompt(settings["messages"])
            except ValueError as e:
                raise BadRequest(str(e), param) from None
        else:
            param = "prompt"
            try:
                ids = self.tokenizer.encode(settings["prompt"])
            except ValueError as e:
                raise BadRequest(f"cannot encode the prompt: {e}", param) from None
        # as OpenAI: a prompt the context cannot hold is refused, never cut
        if len(ids) >= block:
            raise BadRequest(f"the {param} is {len(ids)} tokens, and this model's context is "
                             f"{block}: send a shorter one", param, code="context_length_exceeded")
        sampling = Sampling(temperature=settings["temperature"], top_p=settings["top_p"],
                            vocab_limit=self.tokenizer.vocab_size)
        room = block - len(ids)
        return Request(ids, min(settings["max_tokens"] or room, room), sampling,
                       new_generator(settings["seed"]), settings["stop"],
                       self.fmt.stop_ids if chat and self.fmt else [])


def _ident(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"


def _usage(a: Answer) -> dict:
    return {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens}


class Handler(BaseHTTPRequestHandler):
    server_version = "tinygpt-serve"
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT

    # quiet: one line per request would drown the terminal
    def log_message(self, format, *args):
        pass

    def send_json(self, status: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code, message=None, explain=None):
        """The standard library's own refusals in OpenAI's error shape."""
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        reason = message or self.responses.get(code, ("refused",))[0]
        self.send_json(code, BadRequest(f"{reason[:200]}", status=code).body())

    def do_GET(self):
        self.handle_route(self.get)

    def do_POST(self):
        self.handle_route(self.post)

    def handle_route(self, route) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            try:
                guard.check(self.headers, self.server.hosts, api=True)
            except RequestError as e:
                raise BadRequest(str(e), status=e.status) from None
            route(path)
        except BadRequest as e:
            self.send_json(e.status, e.body())
        except (ConnectionError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001 - a model failure ends this request, not the server
            print(f"serve: {self.path[:100]} failed: {failure_reason(e)}", file=sys.stderr)
            failed = BadRequest(f"the model failed ({failure_reason(e)})", status=500)
            self.send_json(500, failed.body())

    def get(self, path: str) -> None:
        ep = self.server.endpoint
        card = {"id": ep.name, "object": "model", "created": ep.created, "owned_by": "tinygpt"}
        if path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [card]})
        if path == f"/v1/models/{ep.name}":
            return self.send_json(200, card)
        raise BadRequest(f"no such route: GET {path[:100]} (GET /v1/models, POST "
                         "/v1/chat/completions, POST /v1/completions)", status=404)

    def post(self, path: str) -> None:
        if path not in ("/v1/chat/completions", "/v1/completions"):
            raise BadRequest(f"no such route: POST {path[:100]} (POST /v1/chat/completions or "
                             "/v1/completions)",
                             status=404)
        try:
            guard.check_json_body(self.headers)
        except RequestError as e:
            raise BadRequest(str(e), status=e.status) from None
        chat, ep = path == "/v1/chat/completions", self.server.endpoint
        settings = parse(self.read_json(), chat)
        req = ep.request(settings, chat)
        # one answer at a time: the others wait here, in turn
        with ep.lock:
            if settings["stream"]:
                return self.stream_answer(req, chat)
            answer = Answer()
            for _ in stream(ep.model, ep.tokenizer, req, answer, ep.decode):
                pass
        created, ident = int(time.time()), _ident(chat)
        choice = {"index": 0, "finish_reason": answer.finish_reason, "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": answer.text}} if chat else
                      {"text": answer.text})
        kind = "chat.completion" if chat else "text_completion"
        self.send_json(200, {"id": ident, "object": kind, "created": created, "model": ep.name,
                             "choices": [choice], "usage": _usage(answer)})

    def stream_answer(self, req: Request, chat: bool) -> None:
        """Server-sent events: one chunk per piece of text, then the finish reason, then [DONE]."""
        ep = self.server.endpoint
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": _ident(chat), "object": kind,
                "created": int(time.time()), "model": ep.name}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        # the end of the stream is the end of the connection
        self.send_header("Connection", "close")
        self.end_headers()

        def event(piece: str | None, finish: str | None = None, first: bool = False) -> None:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else \
                    {} if piece is None else {"content": piece}
                choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": piece or "", "finish_reason": finish,
                          "logprobs": None}
            self.wfile.write(f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode())
            self.wfile.flush()
        answer = Answer()
        if chat:
            event(None, first=True)
        for piece in stream(ep.model, ep.tokenizer, req, answer, ep.decode):
            event(piece)
        event(None, answer.finish_reason)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def read_json(self):
        length = self.headers.get("Content-Length", "")
        if not re.fullmatch(r"[0-9]{1,18}", length.strip()):
            raise BadRequest("the request has no Content-Length: send a JSON body with one",
                             status=411)
        if int(length) > MAX_BODY:
            raise BadRequest(f"the body is {int(length):,} bytes, over the {MAX_BODY >> 20} MB "
                             "limit", status=413)
        try:
            return json.loads(self.rfile.read(int(length)))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not valid JSON ({e})") from None


class ChatServer(ThreadingHTTPServer):
    # Ctrl-C does not wait for an open connection
    daemon_threads = True

    def __init__(self, address, endpoint: Endpoint):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.endpoint = endpoint
        self.hosts = guard.Hosts(address[0], self.server_address[0])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
