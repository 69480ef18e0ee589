"""Export a trained model: to Hugging Face (`python export.py --hf OUT_DIR --run RUN_DIR`), or an FSDP run's sharded
checkpoint as one .pt file (`--pt RUN_DIR [-o OUT]`). --hf writes a temp directory and renames it into place (no
half export); --force replaces only an earlier export, never a directory holding anything else (a run's *.pt).
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import argparse
import os
import shutil
import sys
from pathlib import Path

from checkpoint.file import check_vocab, load_for_inference  # no torch
from checkpoint.locate import add_checkpoint_options, resolve_checkpoint
from common.cli import ArgumentParser, cli_main
from common.files import replace_dir
from common.interrupt import on_stop
from model.gguf import TYPES as GGUF_TYPES

# every file write_export can write: a directory of only these is an earlier export, the one kind --force replaces
EXPORT_FILES = frozenset({"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(
        prog="export.py", description="Export a tinygpt checkpoint as a Hugging Face GPT-2, Llama (rope, rmsnorm, "
                        "swiglu) or Qwen3 (and qk_norm) directory (config.json, model.safetensors and the tokenizer "
                        "files), loadable with transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR); or an "
                        "FSDP run's sharded checkpoint as one complete .pt file, which resumes and samples like any "
                        "last.pt.", spellings={"out_dir": "--run"})
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--hf", metavar="OUT_DIR", help="directory to write (created)")
    kind.add_argument("--gguf", metavar="FILE", help="a GGUF file to write for llama.cpp, LM "
                      "Studio and Ollama (pip install gguf), and an Ollama Modelfile beside it")
    kind.add_argument("--pt", metavar="SRC", help="a run directory (uses its last_dcp/) or a sharded checkpoint "
                      "directory, to write as one .pt file")
    add_checkpoint_options(p)
    p.add_argument("--force", action="store_true", help="with --hf: replace OUT_DIR when it is an "
                   "earlier export (only config.json, model.safetensors and tokenizer files); with "
                   "--gguf: replace FILE when it is a GGUF file")
    p.add_argument("--gguf-type", choices=GGUF_TYPES, help="with --gguf: how the matrices are "
                   "stored: f32 (exact, default), f16, bf16 or q8_0 (8-bit; norms and biases: f32)")
    p.add_argument("-o", "--out", metavar="FILE", help="with --pt: the file to write (default: <run dir>/last_full.pt)")
    args = p.parse_args(argv)
    if (args.hf or args.gguf) is not None and not (args.run or args.checkpoint):
        p.error("one of the arguments --run --checkpoint is required")
    if args.pt is not None and (args.run or args.checkpoint or args.force) or args.out and args.pt is None:
        p.error("--run, --checkpoint and --force go with --hf OUT_DIR or --gguf FILE, -o/--out "
                "with --pt SRC")
    if args.gguf is None and args.gguf_type is not None:
        p.error("--gguf-type goes with --gguf FILE")
    return args


def export_pt(src: str, out: str | None) -> Path:
    """checkpoint.sharded's export, with the AdamW an FSDP run trains with (Muon needs whole matrices), so the
    exported state resumes like any last.pt."""
    from checkpoint.sharded import export_single_file
    from training.optim import build_optimizer
    from training.config import OptimConfig
    return export_single_file(src, out, lambda model, o: build_optimizer(model, OptimConfig(
        lr=o.get("lr", 1e-3), weight_decay=o.get("weight_decay", 0.0), beta1=o.get("beta1", 0.9),
        beta2=o.get("beta2", 0.99))))


def force_refusal(out: Path) -> str | None:
    """Why --force must not replace `out` (files export.py did not write, a run's *.pt among them); None for an
    empty directory or an earlier export."""
    ours = {e.name for e in out.iterdir() if e.name in EXPORT_FILES and e.is_file() and not e.is_symlink()}
    # the foreign ones first, a checkpoint (*.pt) before anything else
    entries = sorted(out.iterdir(), key=lambda e: (e.name in ours, e.suffix != ".pt", e.name))
    if len(ours) == len(entries) and (not ours or {"config.json", "model.safetensors"} <= ours):
        return None
    names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"--hf {out} is not an earlier export, and --force would delete its {len(names)} entries ({shown}): "
            "--force replaces only a directory export.py wrote; choose a new directory, or move those files away")


def write_export(model, tokenizer, out: Path) -> list[str]:
    """Everything HF needs into `out` (an empty directory); the names of the files written."""
    from data.hf_tokenizer import write_tokenizer_files
    from model.hf import write_pretrained
    files = write_pretrained(model, tokenizer.vocab_size, out)
    files += write_tokenizer_files(tokenizer, out, model_max_length=model.config.block_size)
    return [f.name for f in files]


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pt is not None:
        print(f"wrote {export_pt(args.pt, args.out)}")
        return 0
    if args.gguf is not None:
        from checkpoint.to_gguf import export_gguf, report
        path = resolve_checkpoint(args.run, args.checkpoint, other="")
        print(report(export_gguf(path, args.gguf, args.gguf_type or "f32", args.force)))
        return 0
    out = Path(args.hf).expanduser()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--hf {out} is a file: give a directory to write the model into")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise FileExistsError(f"--hf {out} is not empty: choose a new directory, or pass --force to replace it")
    if out.is_dir() and (refusal := force_refusal(out)):
        raise FileExistsError(refusal)
    path = resolve_checkpoint(args.run, args.checkpoint, other="")
    model, tokenizer_dict, _ = load_for_inference(path)
    from data.tokenizer import tokenizer_from_dict
    tokenizer = tokenizer_from_dict(tokenizer_dict)
    check_vocab(tokenizer.vocab_size, model)
    from model.hf_llama import ARCHITECTURES, export_kind
    kind = export_kind(model.config)  # a setting no Hugging Face class has: one line, before anything is written

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with on_stop(lambda: shutil.rmtree(tmp, ignore_errors=True)):  # a Ctrl-C leaves no half export either
        try:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp.mkdir()
            except OSError as e:  # read-only filesystem, no permission: name the user's directory, not our temp name
                why = "permission denied" if isinstance(e, PermissionError) else (e.strerror or str(e)).lower()
                raise OSError(f"cannot write into {out.parent.resolve()} ({why}): choose a writable directory for "
                              "--hf, or fix its permissions") from None
            names = write_export(model, tokenizer, tmp)
            replace_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    padded = model.config.vocab_size - tokenizer.vocab_size
    print(f"wrote {out}: {', '.join(names)} ({tokenizer.describe()}"
          + (f"; {padded} padded vocabulary rows dropped" if padded else "")
          + ("; exact GELU as trained: activation_function gelu" if model.config.mlp == "gelu_exact" else "")
          + ")")
    load = "GPT2LMHeadModel.from_pretrained(d)" if kind == "gpt2" else \
        f"AutoModelForCausalLM.from_pretrained(d) (a {ARCHITECTURES[kind]})"
    print(f"load it with transformers: {load} and AutoTokenizer.from_pretrained(d), "
          f"d = {str(out)!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
