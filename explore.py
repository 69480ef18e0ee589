"""See attention work: `python explore.py --run outputs/latest` serves an interactive attention explorer for your
own checkpoint on http://127.0.0.1:8000/ (a second --run/--checkpoint compares two models; see --help and
docs/explore.md). Arguments are checked before torch is imported; a user mistake is one `error: ...` line.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import argparse
import sys
from pathlib import Path

from checkpoint.locate import check_hf_dir  # no torch
from common.cli import ArgumentParser, cli_main, in_keys, nanogpt_init_from
from common.serving import listen, serve
from common.platform import configure_threads

configure_threads()  # before torch is imported (run() imports it): see common/platform.py

LOCAL = "127.0.0.1"


class AddSource(argparse.Action):
    """--run/--checkpoint/--init append (kind, path) to one list, in command-line order: model 0, then model 1."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.sources = [*(namespace.sources or []), (self.dest, value)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(spellings={"out_dir": "--run", "init_from": nanogpt_init_from("--init"), "hf": "--init"},
                       prog="explore.py",
                       description="Serve an interactive attention explorer for a checkpoint "
                       "(two to compare them). Without a model argument it uses the newest run under ./outputs "
                       "or ./multirun.")
    p.set_defaults(sources=[])
    p.add_argument("--run", action=AddSource, metavar="DIR", help="training run directory (best.pt, else last.pt; "
                   "a nanoGPT out_dir: its ckpt.pt)")
    p.add_argument("--checkpoint", action=AddSource, metavar="FILE", help="checkpoint file (.pt)")
    p.add_argument("--init", action=AddSource, metavar="HF_DIR", help="local Hugging Face GPT-2, Llama or Qwen3 "
                   "directory (an export.py --hf export too)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 = a free one)")
    p.add_argument("--host", default=LOCAL, help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--prompt", default="", metavar="TEXT",
                   help="text the page starts with (default: the run's probe text, else a line of Shakespeare)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, mps or auto")
    args = p.parse_args(argv)
    if len(args.sources) > 2:
        p.error(f"{len(args.sources)} models given: give one, or two to compare (--run A --run B)")
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port} is outside 0..65535: use e.g. --port 8000, or --port 0 for a free one")
    for kind, path in args.sources:
        if kind == "checkpoint" and Path(path).is_dir():
            raise IsADirectoryError(f"--checkpoint {path} is a directory: give a .pt file in it, or pass "
                                    "a run directory with --run DIR")
        if kind == "checkpoint" and not Path(path).exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist: check the path, or use --run DIR")
        if kind == "init":
            check_hf_dir(path, "--init")
    return args


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from model.device import resolve_device
    from viz.explorer.guard import LOOPBACK
    from viz.explorer.model_view import load_views
    from viz.explorer.server import make_server
    with in_keys({"device": "--device"}):
        device = resolve_device(args.device)
    views = load_views(args.sources, device)
    if args.host.lower() not in LOOPBACK:
        print(f"warning: listening on {args.host}: anyone who can reach this address can use the explorer "
              "(there is no login); leave out --host to listen on 127.0.0.1 only", file=sys.stderr)
    server = listen(lambda: make_server(views, args.host, args.port, args.prompt), args.host,
                    args.port, "another explorer")
    return serve(server, f"explorer: {server.url}  (Ctrl-C to stop)")


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
