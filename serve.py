"""Serve a model as an OpenAI-compatible endpoint: `python serve.py --run outputs/latest` answers
`/v1/chat/completions`, `/v1/completions` and `/v1/models` on http://127.0.0.1:8000/v1
(chat/server.py), so the `openai` client, or any tool that speaks its API, talks to your model
(docs/chat.md). Its own entry script, as explore.py is: a server runs until stopped and has its own
flags, where sample.py draws and exits. Arguments are checked before torch is imported; a user
mistake is one `error: ...` line.
"""
from __future__ import annotations

# first, so that a Ctrl-C during the imports below ends quietly too
if __name__ == "__main__":
    from common.interrupt import stop_quietly
    stop_quietly()

import sys
from pathlib import Path

from checkpoint.locate import add_checkpoint_options, check_hf_dir, resolve_checkpoint
from common.cli import ArgumentParser, cli_main, in_keys, nanogpt_init_from
from common.serving import listen, serve
from common.platform import configure_threads

# before torch is imported: see common/platform.py
configure_threads()

LOCAL = "127.0.0.1"


def parse_args(argv: list[str] | None = None):
    spellings = {"out_dir": "--run", "init_from": nanogpt_init_from("--init"), "hf": "--init"}
    p = ArgumentParser(prog="serve.py", spellings=spellings,
                       description="Serve a model as an OpenAI-compatible endpoint (chat and text "
                       "completions, streamed or not). Without --run/--checkpoint/--init it serves "
                       "the newest run under ./outputs or ./multirun.")
    src = add_checkpoint_options(p)
    src.add_argument("--init", metavar="HF_DIR", help="local Hugging Face GPT-2, Llama or Qwen3 "
                                                      "directory")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 = a "
                                                          "free one)")
    p.add_argument("--host", default=LOCAL, help="address to listen on (default 127.0.0.1: this "
                                                 "machine only)")
    p.add_argument("--name", metavar="NAME", help="the model's name in the API (default: the run "
                                                  "directory's)")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, "
                                                    "mps")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is outside 0..65535: use e.g. --port 8000, or --port "
                         "0 for a free one")
    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} is not a file: check the path, or "
                                "use --run DIR")
    if args.init is not None:
        check_hf_dir(args.init, "--init")
    return args


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = args.init if args.init is not None else resolve_checkpoint(args.run, args.checkpoint)
    from chat.server import ChatServer, Endpoint
    from checkpoint.file import load_model
    from model.device import resolve_device
    from viz.explorer.guard import LOOPBACK
    with in_keys({"device": "--device"}):
        device = resolve_device(args.device)
    model, tokenizer = load_model(source, args.init, device)
    path = Path(source)
    name = args.name or (path.parent.name if path.suffix == ".pt" else path.name)
    endpoint = Endpoint(model, tokenizer, name)
    if endpoint.fmt is None:
        print(f"note: {name} has no chat template (a base model): /v1/completions only; fine-tune "
              "it on conversations for /v1/chat/completions (docs/chat.md)", file=sys.stderr)
    if args.host.lower() not in LOOPBACK:
        print(f"warning: listening on {args.host}: anyone who can reach this address can use the "
              "model (there is no key); leave out --host to listen on 127.0.0.1 "
              "only", file=sys.stderr)
    server = listen(lambda: ChatServer((args.host, args.port), endpoint), args.host, args.port,
                    "another server")
    return serve(server, f"serving {name} at {server.url}  (OpenAI base_url; Ctrl-C to stop)")


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
