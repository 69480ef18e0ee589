"""A checkpoint as a GGUF file for llama.cpp, LM Studio and Ollama, with an Ollama Modelfile beside
it (`python export.py --gguf FILE --run DIR`): the model's part from model.gguf, the tokenizer's
from data.gguf_vocab, composed here, the one layer that sees both. The file is written under a temp
name and renamed (never a half file).
"""
from __future__ import annotations

from pathlib import Path

from checkpoint.file import check_vocab, load_for_inference
from common.files import remove_quietly, replace, temp_path, with_open_mode
from common.interrupt import on_stop

# Ollama's Go template for ChatML (SmolLM2's and Qwen3's chat format)
CHATML = ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
          "{{ end }}<|im_start|>assistant\n")
# tinygpt's own chat template (data/chat_template.py): its tokens are the roles' names
TINYGPT_CHAT = ("{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}<|end|>{{ end }}"
                "<|assistant|>")
GGUF_MAGIC = b"GGUF"
# sample.py's --max-new-tokens default
MAX_NEW_TOKENS = 500


def sampling_defaults() -> dict:
    """sample.py's defaults (temperature, top_k, top_p, min_p, max_new_tokens)."""
    from model.sampling import SETTINGS, Sampling
    defaults = {name: getattr(Sampling(), name) for name in SETTINGS}
    return {**defaults, "max_new_tokens": MAX_NEW_TOKENS}


def modelfile(gguf_name: str, vocab: dict, block_size: int, sampling: dict) -> str:
    """An Ollama Modelfile for the GGUF file `gguf_name` beside it: FROM; the template (a plain
    run's prompt as it is, continued as sample.py does; ChatML's or tinygpt's own for a chat run of
    either; another chat template is left to Ollama, which reads tokenizer.chat_template); the stop
    tokens; sample.py's
    sampling defaults, with no top-k (0) and no repetition penalty (Ollama's default is 1.1)."""
    stem, template = gguf_name.rsplit(".", 1)[0], vocab.get("chat_template")
    lines = [f"# ollama create NAME -f {stem}.Modelfile, then: ollama run NAME",
             f"FROM ./{gguf_name}"]
    if not template:
        lines.append('TEMPLATE """{{ .Prompt }}"""')
    elif "<|im_start|>" in template:
        lines.append(f'TEMPLATE """{CHATML}"""')
    elif "<|assistant|>" in template and "<|end|>" in template:
        lines.append(f'TEMPLATE """{TINYGPT_CHAT}"""')
    else:
        lines.append("# TEMPLATE: Ollama reads the chat template in the GGUF file")
    ends = {vocab.get("eos"), vocab.get("eot")} - {None}
    lines += [f'PARAMETER stop "{s}"' for s in sorted(vocab["tokens"][i] for i in ends)]
    lines += [f"PARAMETER num_ctx {block_size}",
              f"PARAMETER num_predict {sampling['max_new_tokens']}",
              f"PARAMETER temperature {sampling['temperature']:g}",
              f"PARAMETER top_k {sampling.get('top_k') or 0}",
              f"PARAMETER top_p {sampling.get('top_p') or 1.0:g}",
              f"PARAMETER min_p {sampling.get('min_p') or 0.0:g}",
              "PARAMETER repeat_penalty 1"]
    return "\n".join(lines) + "\n"


def check_target(out: Path, force: bool) -> None:
    """FileExistsError unless `out` may be written: new, or (with --force) an earlier GGUF file."""
    if out.is_dir():
        raise FileExistsError(f"--gguf {out} is a directory: give the file to write, e.g. "
                              f"{out / 'model.gguf'}")
    if not out.exists():
        return
    if not force:
        raise FileExistsError(f"--gguf {out} exists: choose a new file name, or pass --force to "
                              f"replace it")
    with open(out, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise FileExistsError(f"--gguf {out} is not a GGUF file, and --force replaces only an "
                                  f"earlier export: choose a new file name")


def export_gguf(checkpoint, out, ftype: str = "f32", force: bool = False) -> dict:
    """Write the checkpoint's model and tokenizer as the GGUF file `out`, and `<stem>.Modelfile`
    beside it; what was written: {"arch", "tensors", "bytes", "path", "modelfile", "tokenizer",
    "block_size", "gelu_note"}. A setting llama.cpp lacks, or a tokenizer it would read
    differently: a ValueError before anything is written."""
    from data.gguf_vocab import gguf_vocab
    from data.tokenizer import tokenizer_from_dict
    from model.gguf import gguf_arch, import_gguf, write_gguf
    out = Path(out).expanduser()
    check_target(out, force)
    # the missing package's line, and a setting llama.cpp lacks, before the tokenizer's work
    import_gguf()
    model, tokenizer_dict, _ = load_for_inference(checkpoint)
    tokenizer = tokenizer_from_dict(tokenizer_dict)
    check_vocab(tokenizer.vocab_size, model)
    gguf_arch(model.config)
    vocab = gguf_vocab(tokenizer, tokenizer_dict)
    sampling = sampling_defaults()
    name = Path(str(checkpoint)).parent.name or "tinygpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    # a Ctrl-C or an error leaves no half file; the file gets the permissions open() would give
    with on_stop(lambda: remove_quietly(tmp)), with_open_mode(out):
        try:
            written = write_gguf(model, vocab, tmp, ftype, name=name, sampling=sampling)
            replace(tmp, out)
        finally:
            remove_quietly(tmp)
    mf = out.with_name(out.stem + ".Modelfile")
    mf.write_text(modelfile(out.name, vocab, model.config.block_size, sampling), encoding="utf-8")
    return {**written, "path": out, "modelfile": mf, "tokenizer": tokenizer.describe(),
            "block_size": model.config.block_size, "gelu_note": model.config.mlp == "gelu_exact"}


def report(written: dict) -> str:
    """export.py's lines for a GGUF export: what was written, how to run it."""
    out, mf = written["path"], written["modelfile"]
    types = "/".join(sorted(set(written["tensors"].values())))
    lines = [f"wrote {out} ({written['bytes'] / 1e6:,.1f} MB, llama.cpp architecture "
             f"{written['arch']}, tensors {types}, {written['tokenizer']}) and {mf.name}"]
    if written["gelu_note"]:
        lines.append("note: trained with the exact (erf) GELU; llama.cpp's gpt2 computes the tanh "
                     "form, so its logits differ slightly (docs/export_eval.md)")
    lines.append(f"run it: llama-completion -m {out} -no-cnv -c {written['block_size']} -p 'ROMEO:'"
                 f"   or: ollama create NAME -f {mf}")
    return "\n".join(lines)
