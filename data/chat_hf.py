"""A chat template in Hugging Face's files, both ways. Written: tokenizer_config.json's
`chat_template` (the same Jinja string tinygpt renders, so transformers' `apply_chat_template` gives
tinygpt's ids), the added tokens (`added_tokens_decoder`, as special tokens) and `tinygpt_chat`, the
description read back exactly. Read: an export's `tinygpt_chat`, or an imported model's
`chat_template` with the tokens it names (bos/eos; the end of a turn: its eos token and
generation_config.json's eos ids), whose tokens are in its own vocabulary already.
"""
from __future__ import annotations

import json
from pathlib import Path


def config_entries(tokenizer) -> dict:
    """What a chat tokenizer adds to tokenizer_config.json ({} without a template)."""
    chat = getattr(tokenizer, "chat", None)
    if not isinstance(chat, dict):
        return {}
    n = tokenizer.vocab_size - len(chat.get("special", []))
    added = {str(n + i): {"content": s, "lstrip": False, "rstrip": False, "normalized": False,
                          "single_word": False, "special": True}
             for i, s in enumerate(chat.get("special", []))}
    return {"chat_template": chat["template"], "added_tokens_decoder": added,
            "additional_special_tokens": list(chat.get("special", [])), "tinygpt_chat": chat}


def add_to_config(out_dir: str | Path, tokenizer) -> list[Path]:
    """tokenizer_config.json in `out_dir` with the chat entries merged in (written if absent: char
    models)."""
    from common.files import write_text_atomic
    entries = config_entries(tokenizer)
    if not entries:
        return []
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    write_text_atomic(path, json.dumps({**config, **entries}, indent=2, ensure_ascii=False))
    return [path]


def _content(token) -> str | None:
    """A token as tokenizer_config.json gives it: a string, or {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def chat_of(hf_dir: str | Path, tokenizer) -> dict | None:
    """The chat description of a Hugging Face directory whose base tokenizer is `tokenizer`, or
    None."""
    d = Path(hf_dir).expanduser()
    config = _read_json(d / "tokenizer_config.json")
    if isinstance(config.get("tinygpt_chat"), dict):
        return config["tinygpt_chat"]
    template = config.get("chat_template")
    # several named templates: the default one
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict)
                         and t.get("name") == "default"), None)
    if not isinstance(template, str):
        return None
    tokens = {k: _content(config.get(k)) for k in ("bos_token", "eos_token")}
    eos = _read_json(d / "generation_config.json").get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    stop = [tokenizer.decode([i]) for i in eos
            if isinstance(i, int) and 0 <= i < tokenizer.vocab_size]
    return {"template": template, "special": [], "end": tokens["eos_token"], "stop": stop,
            "tokens": {k: v for k, v in tokens.items() if v is not None}}
