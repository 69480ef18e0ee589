r"""Sample text from a trained tinygpt model: `python sample.py --prompt "ROMEO:"` (see --help;
docs/sampling.md).

Load (checkpoint or HF directory), encode, generate, stream. Arguments are checked before torch is
imported, so a typo costs milliseconds; a user mistake is one `error: ...` line on stderr and exit
code 2. The sampling flags (--temperature, --top-k, ...) are model/sampling.py's settings.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

from common import startup

# TINYGPT_TRACE=startup: each start-up phase's seconds (common/startup.py)
startup.mark("python start-up")
import dataclasses
import io
import re
import sys
import time
from pathlib import Path

from checkpoint.file import load_model
from checkpoint.locate import add_checkpoint_options, check_hf_dir, resolve_checkpoint
from common.cli import ArgumentParser, cli_main, in_keys, nanogpt_init_from, read_text_file
from model.sampling import SETTINGS, WINDOWS, Sampling
from common.platform import command_line, configure_threads

# before torch is imported (run() imports it): 3x on busy cores, docs/sampling.md
configure_threads()
startup.mark("imports")

SEPARATOR = "\n---------------\n"
# --top-k for top_k: model/sampling.py's settings
FLAGS = {name: "--" + name.replace("_", "-") for name in SETTINGS}


def nanogpt_start(value: str | None) -> str:
    """nanoGPT's --start: the prompt, or FILE:path its file."""
    if value is not None and value.startswith("FILE:"):
        return command_line(["--prompt-file", value[5:]])
    return command_line(["--prompt", value]) if value is not None else "--prompt TEXT"


# nanoGPT's sample.py flags that are not ours with - for _ (--num_samples, --max_new_tokens:
# common.cli says those), and eval.py's name for a Hugging Face directory
NANOGPT = {"out_dir": "--run", "start": nanogpt_start, "init_from": nanogpt_init_from("--init"),
           "hf": "--init",
           "dtype": lambda _: "no dtype option (it decodes in bfloat16 on CUDA GPUs that have it, "
                              "else float32)"}


def parse_args(argv: list[str] | None = None):
    p = ArgumentParser(prog="sample.py", description="Generate text from a trained tinygpt model "
                       "(or a local HF GPT-2). Without --run/--checkpoint/--init it uses the "
                       "newest run under ./outputs or ./multirun.", spellings=NANOGPT)
    src = add_checkpoint_options(p)
    src.add_argument("--init", metavar="HF_DIR", help="local Hugging Face GPT-2, Llama or Qwen3 "
                     "directory (config.json + weights; GPT-2 BPE, its tokenizer.json, or a char "
                     "model exported by export.py); --init gpt2 before the download prints the "
                     "command that gets it")
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--prompt", type=unescape, metavar="TEXT", help='text to continue (default: '
                    '"\\n"; \\n, \\t understood)')
    pr.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a UTF-8 text file "
                    "(- = stdin)")
    p.add_argument("--max-new-tokens", type=int, default=500, metavar="N",
                   help="tokens per sample, N >= 0 (default 500)")
    for name, setting in SETTINGS.items():  # --temperature, --top-k, --top-p, ...
        p.add_argument(FLAGS[name], default=setting.default, **setting.metadata)
    p.set_defaults(temperature=0.8)  # nanoGPT's sample.py's
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="number of samples, N >= 1 (default 1)")
    p.add_argument("--seed", type=int, metavar="S",
                   help="random seed, for reproducible samples, 0 <= S < 2^64")
    p.add_argument("--device", default="auto",
                   help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps")
    p.add_argument("--stop", type=unescape, metavar="STRING", help="stop a sample when STRING "
                   "appears (\\n, \\t understood)")
    p.add_argument("--no-kv-cache", dest="kv_cache", action="store_false",
                   help="recompute the whole window per token")
    p.add_argument("--window", choices=WINDOWS, default="half", help="the context once a sample "
                   "outgrows the model's (block_size): half keeps its last half, re-read once per "
                   "half (fast; the default); sliding keeps the last block_size tokens, re-read "
                   "for every token (nanoGPT's sample.py; slower)")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="print each sample whole when done")
    p.add_argument("--compile", action="store_true",
                   help="CUDA: decode with a torch.compile'd step (longest runs)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="CUDA: decode without CUDA graphs")
    p.add_argument("--attention-map", metavar="FILE.png",
                   help="draw the prompt's attention weights to a PNG")
    p.add_argument("--chat", action="store_true", help="talk to a chat model (fine-tuned on "
                   "conversations): multi-turn, /reset, /exit; see docs/chat.md")
    p.add_argument("--system", metavar="TEXT",
                   help="--chat: the system message of the conversation")
    return check_args(p.parse_args(argv))


def unescape(text: str) -> str:
    r"""Turn the two-character sequences \n, \t and \\ typed on a command line into the
    characters."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def check_args(a):
    """Cheap checks (no torch) so that mistakes are reported before anything heavy is loaded."""
    with in_keys(FLAGS):
        a.sampling = Sampling(**{name: getattr(a, name) for name in SETTINGS})
    mistakes = [(a.max_new_tokens < 0, f"--max-new-tokens {a.max_new_tokens} is negative: use 0 "
                                       "or more (default 500)"),
                (a.num_samples < 1, f"--num-samples {a.num_samples} is invalid: use 1 or more"),
                # torch.Generator.manual_seed's range
                (a.seed is not None and not 0 <= a.seed < 2**64,
                 f"--seed {a.seed} is out of range: use a whole number from 0 to {2**64 - 1}"),
                (a.stop == "", "--stop is empty: give the text that should end a sample, e.g. "
                               "--stop '\\n\\n'")]
    for wrong, message in mistakes:
        if wrong:
            raise ValueError(message)
    if a.run is not None and Path(a.run).is_file():  # --run RUN/best.pt: that file
        a.checkpoint, a.run = a.run, None
    if a.checkpoint is not None:
        ckpt = Path(a.checkpoint)
        if ckpt.is_dir():
            raise IsADirectoryError(f"--checkpoint {ckpt} is a directory: give a .pt file in it, "
                                    "or pass a run directory with --run DIR")
        if not ckpt.exists():
            raise FileNotFoundError(f"checkpoint {ckpt} does not exist: check the path, or use "
                                    "--run DIR")
    if a.init is not None:
        check_hf_dir(a.init, "--init")
    if a.attention_map is not None:
        png = Path(a.attention_map)
        if png.is_dir():
            raise IsADirectoryError(f"--attention-map {png} is a directory: give a file name, "
                                    f"e.g. {png / 'att.png'}")
        if not png.resolve().parent.is_dir():
            raise FileNotFoundError(f"cannot write --attention-map {png}: its directory does not "
                                    "exist")
    if a.system is not None and not a.chat:
        raise ValueError("--system applies to --chat only: add --chat, or leave --system out")
    if a.chat and (a.prompt is not None or a.prompt_file is not None or a.num_samples != 1):
        raise ValueError("--chat reads your messages from the terminal: leave out --prompt, "
                         "--prompt-file and --num-samples")
    if a.prompt_file is not None:
        a.prompt = read_text_file(a.prompt_file, "--prompt-file")
    if a.prompt == "":
        source = "--prompt" if a.prompt_file is None else f"--prompt-file {a.prompt_file}"
        raise ValueError(f"{source} is empty: give some text, or leave out the prompt to start "
                         "from a newline")
    return a


def encode_prompt(tokenizer, text: str | None, block_size: int) -> list[int]:
    """Token ids of the prompt (default "\\n", else token 0), cut to its last `block_size` with a
    notice."""
    if text is None:  # token 0 if a char vocabulary has no "\n"
        if tokenizer.unknown_characters("\n"):
            return [0]
        return tokenizer.encode("\n")[-block_size:] or [0]
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:
        if not (unknown := tokenizer.unknown_characters(text)):
            raise ValueError(f"cannot encode the prompt: {e}") from None
        more = f" and {len(unknown) - 20} more" if len(unknown) > 20 else ""
        raise ValueError(f"the prompt has {len(unknown)} character(s) outside the model's "
                         f"vocabulary: {', '.join(repr(c) for c in unknown[:20])}{more}; a "
                         "char-level model knows only the characters of its training text: "
                         "remove or replace them") from None
    if len(ids) > block_size:
        print(f"note: the prompt is {len(ids)} tokens, longer than the model's context of "
              f"{block_size}: the model sees its last {block_size} tokens", file=sys.stderr)
    return ids[-block_size:]


class StopAt:
    """Passes text on up to the first `stop` (included), then is done; never emits text past it."""
    def __init__(self, stop: str | None):
        self.stop, self.held, self.done = stop, "", False

    def push(self, text: str) -> str:
        if not self.stop:
            return text
        buf, self.held = self.held + text, ""
        i = buf.find(self.stop)
        if i >= 0:
            self.done = True
            return buf[: i + len(self.stop)]
        # hold back the longest tail of buf that is a beginning of the stop string
        keep = max((k for k in range(1, len(self.stop)) if buf.endswith(self.stop[:k])), default=0)
        self.held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def stream_text(tokens, tokenizer, write, stop: str | None = None) -> int:
    """`write` the text of `tokens` ((1, 1) tensors or ints) in complete characters, up to `stop`;
    the count."""
    from data.tokenizer import StreamDecoder
    decoder, stopper, n = StreamDecoder(tokenizer), StopAt(stop), 0
    for n, tok in enumerate(tokens, 1):
        ids = tok.reshape(-1).tolist() if hasattr(tok, "reshape") else [int(tok)]
        write(stopper.push(decoder.push(ids)))
        if stopper.done:
            return n
    write(stopper.push(decoder.flush()) + ("" if stopper.done else stopper.flush()))
    return n


def decode_step(args, device):
    """The one-token decode step: on CUDA model/fast_decode.py's (CUDA graphs, or --compile), else
    the eager one."""
    from model.generate import next_token_probs
    if device.type == "cuda":
        from common.files import keep_tool_caches
        from model.fast_decode import pick_decode
        keep_tool_caches()  # --compile's graphs and kernels, kept for the next run
        return pick_decode(device, args.compile, args.cuda_graphs, args.kv_cache)
    if args.compile:
        print(f"note: --compile speeds up CUDA decoding only; running uncompiled on {device}",
              file=sys.stderr)
    return next_token_probs


def run(argv: list[str] | None = None) -> int:
    """The whole CLI; raises ValueError/OSError for user mistakes (main() turns them into one
    line)."""
    args, out = parse_args(argv), sys.stdout
    source = args.init if args.init is not None else resolve_checkpoint(args.run, args.checkpoint)
    startup.mark("arguments checked")
    with startup.gc_paused():  # (common/startup.py)
        import torch
        from model.device import cuda_bf16_native, resolve_device
        from model.generate import generate_tokens, next_token_probs
    startup.mark("torch import")
    with in_keys({"device": "--device"}):
        device = resolve_device(args.device)
    generator = None if args.seed is None else torch.Generator(device).manual_seed(args.seed)
    # in eval mode, from the checkpoint alone (weights_only)
    model, tokenizer = load_model(source, args.init, device)
    if device.type == "cuda" and cuda_bf16_native():
        model = model.bfloat16()  # decoding is memory-bound: half the bytes per token
    startup.mark("model loaded")
    # the terminal conversation (chat/cli.py)
    if args.chat:
        from chat.cli import chat_loop
        return chat_loop(model, tokenizer, args, decode_step(args, device))
    ids = encode_prompt(tokenizer, args.prompt, model.config.block_size)
    # the prompt is printed in full
    head = args.prompt if args.prompt is not None else tokenizer.decode(ids)
    decode = decode_step(args, device)
    startup.mark("decode step")
    # padded ids: never sampled
    sampling = dataclasses.replace(args.sampling, vocab_limit=tokenizer.vocab_size)
    if args.attention_map:
        from viz.attention_map import draw_attention_map
        draw_attention_map(model, tokenizer, ids, args.attention_map, title=str(source))
        print(f"attention map written to {args.attention_map}", file=sys.stderr)
    n_tokens, seconds, tail = 0, 0.0, ""  # tail: the last character printed

    def write(text):  # to this sample's sink
        nonlocal tail
        print(text, end="", file=sink, flush=True)
        tail = text[-1:] or tail
    for i in range(args.num_samples):
        # --no-stream: each sample is printed whole once done
        sink = out if args.stream else io.StringIO()
        write((SEPARATOR if i else "") + head)
        t0 = time.perf_counter()
        tokens = generate_tokens(model, torch.tensor([ids], device=device), args.max_new_tokens,
                                 sampling, use_kv_cache=args.kv_cache, generator=generator,
                                 decode=decode, window=args.window)
        # (each token printed, so read back: no sync needed for the time)
        n_tokens += stream_text(startup.first(tokens, "first token"), tokenizer, write, args.stop)
        seconds += time.perf_counter() - t0
        out.write("" if sink is out else sink.getvalue())
    # end the last line, never add one (--stop '\n')
    print(end="" if tail == "\n" else "\n", file=out, flush=True)
    fast = "" if decode is next_token_probs else f", {decode.kind}"
    print(f"generated {n_tokens} tokens in {seconds:.2f} s "
          f"({n_tokens / max(seconds, 1e-9):.1f} tokens/s, kv cache "
          f"{'on' if args.kv_cache else 'off'}{fast})", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv, "while generating: use a smaller --max-new-tokens or "
                    "--num-samples, or another --device")


if __name__ == "__main__":
    sys.exit(main())
