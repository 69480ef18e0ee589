"""One answer of a chat model, for the terminal (chat/cli.py) and the endpoint (chat/server.py)
alike: the conversation fitted into the context (the oldest turns dropped, a system message kept),
tokens drawn until the end-of-turn token, the room left or a stop string, and the text streamed in
whole characters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from data.tokenizer import StreamDecoder


@dataclass
class Answer:
    """What a finished answer left: its text, why it ended (stop / length) and the token counts."""
    text: str = ""
    finish_reason: str = "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0


def fit(fmt, messages: list[dict], block_size: int, room: int) -> tuple[list[int], int]:
    """(the prompt ids of `messages` with at least `room` positions left in the context, the number
    of messages dropped from the front to get there; a leading system message stays). ValueError if
    even the last one does not fit."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest, dropped = messages[len(system):], 0
    while True:
        ids = fmt.prompt(system + rest)
        if len(ids) + room <= block_size or len(rest) <= 1:
            break
        rest, dropped = rest[1:], dropped + 1
    if len(ids) >= block_size:
        raise ValueError(f"the message is {len(ids)} tokens with its template, more than the "
                         f"model's context of {block_size}: send a shorter one")
    return ids, dropped


class StopStrings:
    """Text passed on up to the first of `stops` (excluded, as OpenAI's `stop`); a tail that may
    begin one is held back until it cannot."""

    def __init__(self, stops: list[str]):
        self.stops, self.held, self.done = [s for s in stops if s], "", False

    def push(self, text: str) -> str:
        if not self.stops:
            return text
        buf, self.held = self.held + text, ""
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.done = True
            return buf[:min(hits)]
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])),
                   default=0)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


@dataclass
class Request:
    """One answer to draw: the prompt ids, at most `max_tokens`, the sampling settings, a seeded
    generator."""
    ids: list[int]
    max_tokens: int
    # model.sampling.Sampling
    sampling: object
    # torch.Generator or None
    generator: object = None
    stops: list[str] = field(default_factory=list)
    # the end-of-turn token(s); none for a plain completion
    stop_ids: list[int] = field(default_factory=list)


def stream(model, tokenizer, req: Request, answer: Answer, decode=None,
           interrupted=lambda: False) -> Iterator[str]:
    """Yield the answer's text piece by piece; `answer` is filled in as it goes (finish_reason at
    the end). `interrupted()`: checked after each token (Ctrl-C in the terminal), ends the answer as
    a stop."""
    import torch
    from model.generate import generate_tokens, next_token_probs
    device = next(model.parameters()).device
    # the answer stays in the context
    room = min(req.max_tokens, model.config.block_size - len(req.ids))
    answer.prompt_tokens, answer.finish_reason = len(req.ids), "length"
    decoder, stops = StreamDecoder(tokenizer), StopStrings(req.stops)
    ids = torch.tensor([req.ids], device=device)
    tokens = generate_tokens(model, ids, max(room, 0), req.sampling, generator=req.generator,
                             decode=decode or next_token_probs)
    for tok in tokens:
        t = int(tok)
        if t in req.stop_ids:
            answer.finish_reason = "stop"
            break
        answer.completion_tokens += 1
        if piece := stops.push(decoder.push([t])):
            answer.text += piece
            yield piece
        if stops.done or interrupted():
            answer.finish_reason = "stop"
            break
    tail = stops.push(decoder.flush()) + ("" if stops.done else stops.flush())
    if tail:
        answer.text += tail
        yield tail


def new_generator(seed: Optional[int]):
    """A CPU generator seeded with `seed` (the same draws on every device), or None."""
    import torch
    return None if seed is None else torch.Generator().manual_seed(seed)
