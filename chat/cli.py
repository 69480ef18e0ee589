"""`python sample.py --chat`: talk to a chat model in the terminal. Each line you type is a user
message; the answer streams as it is drawn and ends at the model's end-of-turn token. The history is
kept (its oldest turns dropped when it outgrows the context; --system stays), `/reset` forgets it,
`/exit` or Ctrl-D leaves, Ctrl-C while the model answers stops the answer (the next Ctrl-C, at the
prompt, leaves).
"""
from __future__ import annotations

import signal
import sys

from chat.reply import Answer, Request, fit, new_generator, stream
from data.chat_template import ChatFormat

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) leaves; Ctrl-C stops an answer"


class Interrupt:
    """Ctrl-C while an answer is drawn: a flag the token loop reads, the usual handler back
    afterwards."""

    def __init__(self):
        self.hit, self.previous = False, None

    def __enter__(self):
        self.hit, self.previous = False, signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)

    def __call__(self) -> bool:
        return self.hit


def read_line(prompt: str):
    """The next line typed (None at Ctrl-D or the end of piped input); the prompt only on a
    terminal."""
    try:
        return input(prompt if sys.stdin.isatty() else "")
    except EOFError:
        return None


def chat_loop(model, tokenizer, args, decode=None) -> int:
    """The terminal conversation; `args`: sample.py's (system, max_new_tokens, sampling, seed)."""
    import dataclasses
    # a model without a template: one line, from here
    fmt = ChatFormat(tokenizer)
    try:
        import readline  # noqa: F401 - line editing and the arrow keys' history for input()
    except ImportError:
        pass
    block = model.config.block_size
    system = [{"role": "system", "content": args.system}] if args.system else []
    sampling = dataclasses.replace(args.sampling, vocab_limit=tokenizer.vocab_size)
    generator, messages = new_generator(args.seed), list(system)
    tty = sys.stdin.isatty()
    if tty:
        print(f"chat with a {block}-token context ({HELP})", file=sys.stderr)
    while True:
        line = read_line("you> ")
        if line is None or line.strip() in ("/exit", "/quit"):
            print(end="\n" if tty and line is None else "", flush=True)
            return 0
        if line.strip() == "/reset":
            messages = list(system)
            print("(the conversation is forgotten)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            ids, dropped = fit(fmt, messages, block, min(args.max_new_tokens, block // 2))
        except ValueError as e:
            messages.pop()
            print(f"error: {e}", file=sys.stderr)
            continue
        if dropped:
            messages = system + messages[len(system) + dropped:]
            print(f"(the {dropped} oldest message(s) no longer fit the context: left out)",
                  file=sys.stderr)
        answer = Answer()
        req = Request(ids, args.max_new_tokens, sampling, generator, stop_ids=fmt.stop_ids)
        print("model> " if tty else "", end="", flush=True)
        with Interrupt() as stopped:
            for piece in stream(model, tokenizer, req, answer, decode, interrupted=stopped):
                print(piece, end="", flush=True)
        print(flush=True)
        if stopped.hit:
            print("(answer stopped)", file=sys.stderr)
        messages.append({"role": "assistant", "content": answer.text})
