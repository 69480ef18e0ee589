"""What an OpenAI request may hold, checked: `/v1/chat/completions` and `/v1/completions` bodies
become one plain dict of settings, or a `BadRequest` naming the field (the server answers it as
OpenAI does: status 400 and `{"error": {"message", "type": "invalid_request_error", "param",
"code"}}`).
"""
from __future__ import annotations

from data.chat import check_messages


class BadRequest(ValueError):
    """A request the endpoint refuses: `param` names the field, `status` the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param,
                          "code": self.code}}


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(body: dict, name: str, lo: float, hi: float, default):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise BadRequest(f"{name}={value!r} is invalid: give a number from {lo} to {hi}", name)
    return value


def parse(body, chat: bool) -> dict:
    """The settings of a completion request: messages (chat) or prompt, temperature, top_p,
    max_tokens, stop, seed, stream."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    out = {"stream": body.get("stream", False)}
    if not isinstance(out["stream"], bool):
        raise BadRequest("stream must be true or false", "stream")
    if chat:
        try:
            out["messages"] = check_messages(body.get("messages"), "messages", answered=False)
        except ValueError as e:
            raise BadRequest(str(e), "messages") from None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("prompt must be a non-empty string", "prompt")
        out["prompt"] = prompt
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1: this endpoint draws one answer per request", "n")
    out["temperature"] = _number(body, "temperature", 0, 2, 1.0)
    out["top_p"] = _number(body, "top_p", 0, 1, 1.0)
    if out["top_p"] == 0:
        raise BadRequest("top_p=0 keeps no token: give a number in (0, 1]", "top_p")
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if tokens is not None and not (_whole(tokens) and tokens >= 1):
        raise BadRequest(f"max_tokens={tokens!r} is invalid: give a whole number of at least "
                         "1", "max_tokens")
    out["max_tokens"] = tokens
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and len(stop) <= 4
            and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("stop must be a non-empty string or a list of up to 4 of them", "stop")
    out["stop"] = stop
    seed = body.get("seed")
    if seed is not None and not (_whole(seed) and 0 <= seed < 2 ** 63):
        raise BadRequest(f"seed={seed!r} is invalid: give a whole number from 0 to 2**63 - 1",
                         "seed")
    out["seed"] = seed
    return out
