r"""Sample text from a trained tinygpt model: `python sample.py --prompt "ROMEO:"`.

Design
------
A plain argparse script (Hydra owns `key=value` overrides in train.py; here users type `--flags`).
One small function per step, run in this order by `main()`:

    parse_args -> validate_args -> read_prompt -> resolve_checkpoint -> load_model
               -> encode_prompt -> [draw_attention_map] -> stream_sample (x num_samples) -> report

* Which model: `--run DIR`, `--checkpoint FILE` or `--init HF_DIR` (a local Hugging Face GPT-2
  directory, with the GPT-2 tokenizer); with none of them the newest run under ./outputs and
  ./multirun (newest checkpoint file by mtime), announced on stderr. `best.pt` beats `last.pt`.
  Model and tokenizer are rebuilt from the checkpoint alone (`checkpoint.file.load_checkpoint`,
  i.e. `torch.load(weights_only=True)`: no pickled objects are ever executed). Logits of padding ids
  (a vocabulary padded with model.pad_vocab_to) are masked so they can never be sampled.
* Arguments (numbers, paths, the prompt file) are validated before torch is imported, so a typo costs
  milliseconds, not a model load.
* Prompt: `--prompt TEXT` or `--prompt-file FILE` (UTF-8; `-` reads stdin); with neither, generation
  starts from "\n" (as nanoGPT does), or from token 0 for a char vocabulary without "\n". A prompt
  longer than the context keeps its last block_size tokens (one-line notice on stderr); the prompt is
  still printed in full.
* Output: the prompt, then the generated text streamed token by token (flushed) through
  `data.tokenizer.StreamDecoder`, which holds back incomplete UTF-8 bytes so a BPE model never prints
  a broken character. Samples are separated by SEPARATOR; stdout ends with "\n". `--no-stream` prints
  each sample whole once it is done. The last stderr line is
  `generated N tokens in S s (X tokens/s, kv cache on|off)` (generation time only, all samples;
  with --compile it includes the compilation).
* `--stop STRING` (escapes \n, \t, \\ understood): generation of a sample stops at the first
  occurrence of STRING in the generated text (the prompt is not searched); the output includes the
  stop string. Text that might still grow into STRING is held back, so nothing after it is printed.
* `--attention-map FILE.png`: before sampling, runs the prompt (its last 64 tokens) through
  `model.attention_maps` (the manual attention path) and draws a layers x heads grid of the causal
  attention weights with the prompt's tokens as labels. Sampling follows as usual; use
  `--max-new-tokens 0` to only draw.
* Device: --device auto picks cuda > mps > cpu. On CUDA the model runs in bfloat16 where supported;
  `--compile` (CUDA only; elsewhere a one-line note) uses model.generate's static cache + torch.compile'd
  decode step (CUDA graphs).
* Errors: every user mistake becomes a ValueError/OSError with a one-line message; `main()` prints
  `error: <message>` on stderr and returns 2 (no traceback); running out of memory is one line and
  exit code 1. Ctrl-C prints a newline and returns 130. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from pathlib import Path

SEPARATOR = "\n---------------\n"
RUN_ROOTS = ("outputs", "multirun")          # Hydra's default output dirs, relative to the cwd
CHECKPOINT_NAMES = ("best.pt", "last.pt")     # in order of preference
ATTENTION_MAP_MAX_TOKENS = 64
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


# --------------------------------------------------------------------------------------------- arguments
class _ArgumentParser(argparse.ArgumentParser):
    """argparse prints usage + message over several lines; we want the one-line `error: ...` instead."""

    def error(self, message):
        raise ValueError(f"{message} (see python sample.py --help)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _ArgumentParser(description="Generate text from a trained tinygpt model (or a local HF GPT-2). Without "
                        "--run/--checkpoint/--init it uses the newest run under ./outputs or ./multirun.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--run", metavar="DIR", help="training run directory (uses best.pt, else last.pt)")
    src.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (.pt)")
    src.add_argument("--init", metavar="HF_DIR", help="local Hugging Face GPT-2 directory (config.json + weights)")
    pr = p.add_mutually_exclusive_group()
    pr.add_argument("--prompt", metavar="TEXT", help='text to continue (default: "\\n")')
    pr.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a UTF-8 text file (- = stdin)")
    p.add_argument("--max-new-tokens", type=int, default=500, metavar="N", help="tokens per sample (default 500)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, metavar="K", help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling: smallest set with mass >= P, 0 < P <= 1")
    p.add_argument("--num-samples", type=int, default=1, metavar="N", help="number of samples (default 1)")
    p.add_argument("--seed", type=int, help="random seed, for reproducible samples")
    p.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps")
    p.add_argument("--stop", metavar="STRING", help="stop a sample when STRING appears (\\n, \\t understood)")
    p.add_argument("--no-kv-cache", dest="kv_cache", action="store_false", help="recompute the whole window per token")
    p.add_argument("--no-stream", dest="stream", action="store_false", help="print each sample whole when done")
    p.add_argument("--compile", action="store_true", help="CUDA: static KV cache + torch.compile'd decode step")
    p.add_argument("--attention-map", metavar="FILE.png", help="draw the prompt's attention weights to a PNG")
    return p.parse_args(argv)


def unescape(text: str) -> str:
    r"""Turn the two-character sequences \n, \t and \\ typed on a command line into the characters."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def validate_args(args: argparse.Namespace) -> None:
    """Cheap checks (no torch) so that mistakes are reported before anything heavy is loaded."""
    if not args.temperature >= 0:  # also rejects nan
        raise ValueError(f"--temperature {args.temperature} is invalid: use 0 (greedy) or a positive number like 0.8")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p {args.top_p} is outside (0, 1]: use e.g. --top-p 0.9 (1 keeps every token)")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k {args.top_k} is invalid: use a whole number >= 1 (e.g. --top-k 50), or leave it out")
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} is negative: use 0 or more (default 500)")
    if args.num_samples < 1:
        raise ValueError(f"--num-samples {args.num_samples} is invalid: use 1 or more")
    if args.stop is not None:
        args.stop = unescape(args.stop)
        if not args.stop:
            raise ValueError("--stop is empty: give the text that should end a sample, e.g. --stop '\\n\\n'")
    if args.prompt_file not in (None, "-"):
        if not Path(args.prompt_file).exists():
            raise FileNotFoundError(f"prompt file {args.prompt_file} does not exist: check the path given to --prompt-file")
        if Path(args.prompt_file).is_dir():
            raise IsADirectoryError(f"--prompt-file {args.prompt_file} is a directory: give a text file")
    if args.checkpoint is not None:
        if Path(args.checkpoint).is_dir():
            raise IsADirectoryError(f"--checkpoint {args.checkpoint} is a directory: give a .pt file in it, or "
                                    "pass a run directory with --run DIR")
        if not Path(args.checkpoint).exists():
            raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist: check the path, or use --run DIR")
    if args.run is not None and not Path(args.run).is_dir():
        raise FileNotFoundError(f"run directory {args.run} does not exist: pass a directory containing best.pt or last.pt")
    if args.init is not None:
        if not Path(args.init).is_dir():
            raise FileNotFoundError(f"--init {args.init} is not a directory: pass a local Hugging Face GPT-2 directory")
        if not (Path(args.init) / "config.json").is_file():
            raise FileNotFoundError(f"--init {args.init} has no config.json: pass a Hugging Face GPT-2 directory "
                                    "(e.g. one saved with save_pretrained)")
    if args.attention_map is not None and not Path(args.attention_map).resolve().parent.is_dir():
        raise FileNotFoundError(f"cannot write --attention-map {args.attention_map}: its directory does not exist")


def read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt text, or None for "start from the default token"."""
    if args.prompt_file is not None:
        try:
            if args.prompt_file == "-":
                text = sys.stdin.buffer.read().decode("utf-8")
            else:
                text = Path(args.prompt_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"prompt file {args.prompt_file} is not UTF-8 text (byte {e.start}): "
                             "save it as UTF-8") from None
        source = f"prompt file {args.prompt_file}"
    elif args.prompt is not None:
        text, source = args.prompt, "--prompt"
    else:
        return None
    if not text:
        raise ValueError(f"{source} is empty: give some text, or leave out the prompt to start from a newline")
    return text


# ------------------------------------------------------------------------------------------ which model
def find_newest_checkpoint(roots=RUN_ROOTS) -> Path | None:
    """best.pt (else last.pt) of the run whose checkpoint was written most recently, under `roots`."""
    runs: dict[Path, float] = {}
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for name in CHECKPOINT_NAMES:
            for f in root.rglob(name):
                if f.is_file():
                    runs[f.parent] = max(runs.get(f.parent, 0.0), f.stat().st_mtime)
    if not runs:
        return None
    newest = max(runs, key=lambda d: (runs[d], str(d)))
    return checkpoint_in_run(newest)


def checkpoint_in_run(run_dir: Path) -> Path:
    for name in CHECKPOINT_NAMES:
        if (run_dir / name).is_file():
            return run_dir / name
    raise FileNotFoundError(f"run directory {run_dir} has no best.pt or last.pt: has its training saved a "
                            "checkpoint yet? (or pass --checkpoint FILE)")


def resolve_checkpoint(args: argparse.Namespace) -> Path | None:
    """The checkpoint file to load (None with --init); announces the choice on stderr."""
    if args.init is not None:
        return None
    if args.checkpoint is not None:
        return Path(args.checkpoint)
    if args.run is not None:
        path = checkpoint_in_run(Path(args.run))
        print(f"using {path}", file=sys.stderr)
        return path
    path = find_newest_checkpoint()
    if path is None:
        raise FileNotFoundError(f"no trained model found under ./{RUN_ROOTS[0]} or ./{RUN_ROOTS[1]} in {Path.cwd()}: "
                                "train one with `python train.py`, or pass --run DIR, --checkpoint FILE or --init HF_DIR")
    print(f"using {path} (newest run)", file=sys.stderr)
    return path


def pick_device(name: str) -> str:
    import torch
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown --device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine: use --device cpu (or auto)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {name}: MPS is not available on this machine: use --device cpu (or auto)")
    return str(device)


def load_model(args: argparse.Namespace, ckpt_path: Path | None, device: str):
    """(model in eval mode on `device`, tokenizer) from the checkpoint alone, or from --init HF_DIR.
    On a CUDA GPU with bfloat16 in hardware (Ampere or newer) the weights (and so the KV cache) are cast to bfloat16."""
    import torch

    from model.device import cuda_bf16_native
    if args.init is not None:
        from data.tokenizer import GPT2Tokenizer
        from model import GPT
        model, tokenizer = GPT.from_pretrained(args.init), GPT2Tokenizer()
    else:
        from data.tokenizer import tokenizer_from_dict
        from checkpoint.file import load_checkpoint, model_from_checkpoint
        ckpt = load_checkpoint(ckpt_path, map_location="cpu")
        try:
            model = model_from_checkpoint(ckpt)
        except ValueError as e:  # bad model_config, or weights that do not fit it: say which file
            raise ValueError(f"checkpoint {ckpt_path}: {e}") from None
        except RuntimeError as e:  # load_state_dict's own size/key mismatch message (many lines)
            first = str(e).strip().splitlines()[-1].strip() if str(e).strip() else type(e).__name__
            raise ValueError(f"checkpoint {ckpt_path}: weights do not match its model config ({first}): "
                             "the file is damaged or was edited; use another checkpoint") from None
        if "tokenizer" not in ckpt:
            raise ValueError(f"checkpoint {ckpt_path} has no tokenizer: it was not written by train.py; "
                             "use a last.pt or best.pt from a training run")
        tokenizer = tokenizer_from_dict(ckpt["tokenizer"])
        del ckpt  # optimizer state etc.: free it before generating
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                         f"{model.config.vocab_size}: model and tokenizer do not belong together")
    mask_padded_vocab(model, tokenizer.vocab_size)
    model = model.to(device).eval()
    if device.startswith("cuda") and cuda_bf16_native():
        model = model.to(dtype=torch.bfloat16)  # decoding is memory-bound: half the bytes per token
    return model, tokenizer


def mask_padded_vocab(model, vocab_size: int) -> None:
    """A model trained with a padded vocabulary (model.pad_vocab_to) has logits for ids that no tokenizer
    knows; set them to -inf on the way out of lm_head so they can never be sampled."""
    if model.config.vocab_size <= vocab_size:
        return

    def hook(module, inputs, logits):
        logits[..., vocab_size:] = float("-inf")
        return logits

    model.lm_head.register_forward_hook(hook)


# ----------------------------------------------------------------------------------------------- prompt
def encode_prompt(tokenizer, text: str | None, block_size: int) -> list[int]:
    """Token ids of the prompt (default: "\\n"), cut to the last `block_size` tokens with a notice."""
    if text is None:
        try:
            return tokenizer.encode("\n")[-block_size:] or [0]
        except (ValueError, KeyError):  # a char vocabulary without "\n": start from its first token
            return [0]
    try:
        ids = tokenizer.encode(text)
    except (ValueError, KeyError) as e:
        unknown = sorted({c for c in text if not _encodable(tokenizer, c)})
        if not unknown:
            raise ValueError(f"cannot encode the prompt: {e}") from None
        shown = ", ".join(repr(c) for c in unknown[:20]) + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
        raise ValueError(f"the prompt has {len(unknown)} character(s) outside the model's vocabulary: {shown}; "
                         "a char-level model knows only the characters of its training text: remove or replace them") from None
    if len(ids) > block_size:
        print(f"note: the prompt is {len(ids)} tokens, longer than the model's context of {block_size}: "
              f"the model sees its last {block_size} tokens", file=sys.stderr)
        ids = ids[-block_size:]
    return ids


def _encodable(tokenizer, char: str) -> bool:
    try:
        tokenizer.encode(char)
        return True
    except (ValueError, KeyError):
        return False


def prompt_text(tokenizer, text: str | None, ids: list[int]) -> str:
    """What to print before the generated text: the prompt as given, or the default start token."""
    return text if text is not None else tokenizer.decode(ids)


# ------------------------------------------------------------------------------------------- streaming
class StopAt:
    """Passes text through until the first occurrence of `stop` (included), then reports done.

    Text that could still turn into `stop` (a suffix that is a prefix of it) is held back, so nothing
    after the stop string is ever emitted even when it straddles tokens. stop=None: pass everything.
    """

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
        keep = 0  # the longest tail of buf that is a beginning of the stop string: hold it back
        for k in range(min(len(buf), len(self.stop) - 1), 0, -1):
            if buf.endswith(self.stop[:k]):
                keep = k
                break
        self.held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def stream_text(tokens, tokenizer, write, stop: str | None = None) -> int:
    """Decode an iterator of new tokens (tensors of shape (1, 1), or ints) and `write` the text as it
    becomes complete UTF-8. Stops consuming `tokens` (i.e. stops generation) at `stop`. Returns how
    many tokens were consumed."""
    from data.tokenizer import StreamDecoder
    decoder, stopper, n = StreamDecoder(tokenizer), StopAt(stop), 0
    for tok in tokens:
        n += 1
        ids = tok.reshape(-1).tolist() if hasattr(tok, "reshape") else [int(tok)]
        text = stopper.push(decoder.push(ids))
        if text:
            write(text)
        if stopper.done:
            return n
    text = stopper.push(decoder.flush())
    text += "" if stopper.done else stopper.flush()
    if text:
        write(text)
    return n


def generation_kwargs(args: argparse.Namespace, generator) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                use_kv_cache=args.kv_cache, generator=generator)


def stream_sample(model, tokenizer, ids: list[int], args, generator, out, head: str, compile_decode=False) -> int:
    """Print one sample (`head` = the prompt, then the continuation); returns the tokens generated."""
    import torch
    device = next(model.parameters()).device
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    kwargs = generation_kwargs(args, generator)
    if compile_decode:
        kwargs["compile"] = True
    tokens = model.generate_stream(idx, args.max_new_tokens, **kwargs)
    if args.stream:
        def write(text):
            out.write(text)
            out.flush()
    else:
        pieces = []
        write = pieces.append
    write(head)
    n = stream_text(tokens, tokenizer, write, args.stop)
    if not args.stream:
        out.write("".join(pieces))
        out.flush()
    return n


# ------------------------------------------------------------------------------------- attention map
LABEL_FONTS = ("DejaVu Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK KR",
               "WenQuanYi Zen Hei", "Droid Sans Fallback", "Noto Sans", "Noto Emoji", "Symbola", "Arial Unicode MS")


def label_fonts() -> tuple[list[str], set[int]]:
    """The installed LABEL_FONTS (matplotlib falls back along the list) and the code points they draw."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font
    installed = {f.name: f.fname for f in font_manager.fontManager.ttflist}
    families = [name for name in LABEL_FONTS if name in installed] or ["DejaVu Sans"]
    glyphs: set[int] = set()
    for name in families:
        try:
            glyphs.update(FT2Font(installed[name]).get_charmap())
        except (KeyError, OSError, RuntimeError):
            pass
    return families, glyphs


def _escape(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii")  # 世 -> \\u4e16, BEL -> \\x07


def token_labels(tokenizer, ids: list[int], glyphs: set[int] | None = None) -> list[str]:
    """Readable axis labels, one per token: newline/space/tab made visible (⏎ · ⇥). A BPE token holding
    part of a multi-byte character shows that character with "…" on the cut side ("世…", "…世").
    Characters outside `glyphs` (code points the label fonts can draw) are shown as \\u escapes."""
    if glyphs is None:
        glyphs = label_fonts()[1]
    parts = [tokenizer.decode_bytes([i]) for i in ids]
    data = b"".join(parts)
    is_cont = [(b & 0xC0) == 0x80 for b in data]  # UTF-8 continuation byte: not a character start
    labels, s = [], 0
    for part in parts:
        e = s + len(part)
        a, b = s, e
        while 0 < a < len(data) and is_cont[a]:
            a -= 1
        while b < len(data) and is_cont[b]:
            b += 1
        text = data[a:b].decode("utf-8", errors="backslashreplace")
        text = text.replace("\n", "⏎").replace(" ", "·").replace("\t", "⇥")
        text = "".join(c if c.isprintable() and ord(c) in glyphs else _escape(c) for c in text)
        labels.append(("…" if a < s else "") + text + ("…" if b > e else ""))
        s = e
    return labels


def draw_attention_map(model, tokenizer, ids: list[int], path: str, title: str = "") -> None:
    """A grid (rows = layers, columns = heads) of the causal attention weights of the prompt's last
    64 tokens: row i of a heatmap = how much query token i attends to each key token j <= i."""
    import numpy as np
    import torch
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure  # no pyplot: no global backend state, renders with Agg

    ids = ids[-ATTENTION_MAP_MAX_TOKENS:]
    device = next(model.parameters()).device
    with torch.no_grad():
        att = model.attention_maps(torch.tensor([ids], dtype=torch.long, device=device))
    att = att[:, 0].float().cpu().numpy()  # (n_layer, n_head, T, T)
    n_layer, n_head, T, _ = att.shape
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)
    families, glyphs = label_fonts()
    labels = token_labels(tokenizer, ids, glyphs)

    cell = min(max(2.4, 0.15 * T + 1.0), 9.0)           # inches per heatmap: room for T labels
    cell = min(cell, 50 / max(n_layer, n_head))         # but keep the whole picture <= ~50 inches
    font = min(10.0, max(3.0, 0.9 * cell * 72 / T))     # a label per row/column of the heatmap
    fig = Figure(figsize=(n_head * cell + 2.0, n_layer * cell + 1.5), dpi=100, layout="constrained")
    axes = fig.subplots(n_layer, n_head, squeeze=False)
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)     # sqrt scale: small weights stay visible
    for l in range(n_layer):
        for h in range(n_head):
            ax = axes[l][h]
            im = ax.imshow(np.ma.masked_array(att[l, h], mask=upper), cmap="viridis", norm=norm,
                           interpolation="nearest")
            ax.set_facecolor("#eeeeee")  # the masked future (upper triangle)
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(labels if l == n_layer - 1 else [], rotation=90, fontsize=font, family=families)
            ax.set_yticklabels(labels if h == 0 else [], fontsize=font, family=families)
            ax.tick_params(length=0, pad=1)
            if l == 0:
                ax.set_title(f"head {h}", fontsize=11)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=11)
    fig.colorbar(im, ax=axes, shrink=min(0.6, 4 / n_layer + 0.2), label="attention weight (sqrt scale)")
    fig.suptitle("causal self-attention weights: row = query token, column = key token it attends to\n"
                 f"{title + ', ' if title else ''}{T} prompt tokens (⏎ newline, · space)", fontsize=12)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph.*missing")  # e.g. CJK in DejaVu Sans
        fig.savefig(path, format="png")


# ----------------------------------------------------------------------------------------------- main
def run(argv: list[str] | None = None, out=None) -> int:
    """The whole CLI; raises ValueError/OSError for user mistakes (main() turns them into one line)."""
    out = out if out is not None else sys.stdout
    args = parse_args(argv)
    validate_args(args)
    text = read_prompt(args)
    ckpt_path = resolve_checkpoint(args)

    import torch
    device = pick_device(args.device)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    model, tokenizer = load_model(args, ckpt_path, device)
    ids = encode_prompt(tokenizer, text, model.config.block_size)
    head = prompt_text(tokenizer, text, ids)

    compile_decode = False
    if args.compile:
        if device.startswith("cuda"):
            compile_decode = True
        else:
            print(f"note: --compile speeds up CUDA decoding only; running uncompiled on {device}", file=sys.stderr)

    if args.attention_map:
        name = args.init if args.init is not None else ckpt_path
        draw_attention_map(model, tokenizer, ids, args.attention_map, title=str(name))
        print(f"attention map written to {args.attention_map}", file=sys.stderr)

    n_tokens, seconds = 0, 0.0
    with torch.no_grad():
        for i in range(args.num_samples):
            if i:
                out.write(SEPARATOR)
            t0 = time.perf_counter()
            n_tokens += stream_sample(model, tokenizer, ids, args, generator, out, head, compile_decode)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds += time.perf_counter() - t0
    out.write("\n")
    out.flush()
    rate = n_tokens / seconds if seconds > 0 else 0.0
    mode = "kv cache " + ("on" if args.kv_cache else "off") + (", compiled" if compile_decode else "")
    print(f"generated {n_tokens} tokens in {seconds:.2f} s ({rate:.1f} tokens/s, {mode})", file=sys.stderr)
    return 0


def error_message(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror and e.filename:  # raised by the OS, e.g. permission denied
        return f"{e.filename}: {e.strerror}"
    return str(e)


def one_line(message: str) -> str:
    return " ".join(str(message).split()) or "unknown error"


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        sys.stdout.flush()
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `python sample.py | head`: the reader left; exit quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as e:
        print(f"error: {one_line(error_message(e))}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:  # running out of (GPU) memory is a resource problem, not a bug: one line
        if not re.search(r"out of memory|can't allocate memory", str(e), re.IGNORECASE):
            raise
        print("error: out of memory while generating: use a smaller --max-new-tokens or --num-samples, "
              "or another --device", file=sys.stderr)
        return 1


if __name__ == "__main__":
    from data.sources import cache_dir
    # matplotlib (--attention-map) keeps its font cache in tinygpt's cache, not in ~/.cache or ~/.config
    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir() / "matplotlib"))
    sys.exit(main())
