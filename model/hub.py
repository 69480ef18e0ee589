"""Hugging Face model names where a local directory is wanted. tinygpt never downloads a model (a
run needs no network), so `--init gpt2`, `GPT.from_pretrained('gpt2')` or `model.init_from=gpt2`
with no such directory is told the command that downloads it, the same from every command. No torch
here: the CLIs check their arguments first.
"""
from __future__ import annotations

import re
from pathlib import Path

# nanoGPT's from_pretrained names (openai-community/)
GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # gpt2, HuggingFaceTB/SmolLM2-135M


def download_command(name: str) -> str:
    """The `hf download` command that puts the Hub model `name` in ./<its last part> (GPT-2's: only
    the two files tinygpt reads, not its TF, Flax and ONNX copies)."""
    if name in GPT2_NAMES:
        return (f"hf download openai-community/{name} config.json model.safetensors "
                f"--local-dir {name}")
    return f"hf download {name} --local-dir {name.rsplit('/', 1)[-1]}"


def looks_like_a_name(spec: str) -> bool:
    """Is `spec`, no local path, a Hub model's name (`gpt2`, `owner/model`) rather than a mistyped
    path?"""
    return bool(_NAME.fullmatch(spec)) and not spec.endswith((".pt", ".json", ".safetensors")) and \
        ("/" not in spec or not Path(spec).parent.exists())


def not_local(spec: str, given: str) -> str:
    """Why `spec` is no local model directory, and the fix: for a Hub name its download command.
    `given`: how the command line or code wrote it, with {} for `spec` ('--init {}',
    "GPT.from_pretrained('{}')")."""
    if looks_like_a_name(spec):
        local = given.format(spec.rsplit("/", 1)[-1])
        return (f"{given.format(spec)} is not a local directory, and tinygpt never downloads "
                f"models: get it with `{download_command(spec)}`, then use {local}")
    return (f"{given.format(spec)} does not exist: check the path (a Hugging Face model is a "
            f"local directory, e.g. `{download_command(GPT2_NAMES[0])}`)")
