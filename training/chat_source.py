"""Fine-tuning a model on conversations (`data=chat model.init_from=...`): the data is encoded with
the source's own tokenizer and its chat template (tinygpt's four chat tokens added where it has
none: data/chat_template.py), and a source without rows for those tokens gets them, initialised to
the mean of its other rows (as transformers' resize_token_embeddings does), so a new token starts as
an average token, not as noise the loss must undo.
"""
from __future__ import annotations

import hashlib
import json
import logging

import torch

from common.files import cache_dir, write_text_atomic
from data.chat_template import with_chat
from data.tokenizer import data_setting

log = logging.getLogger(__name__)
# the embedding and an untied head: one row per id
ROWS = ("transformer.wte.weight", "lm_head.weight")


def use_chat_tokenizer(c, src) -> None:
    """The run's data (data=chat) encoded with `src`'s tokenizer and a chat template: its
    description is written to the cache (by content) and named by data.tokenizer_file;
    `src.tokenizer` becomes it, so the prepared data's tokenizer is checked against it as any
    fine-tune's is."""
    tok = with_chat(src.tokenizer)
    text = json.dumps(tok, sort_keys=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = cache_dir(check=True) / "tokenizers" / f"{name}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    c.data.tokenizer, c.data.tokenizer_file, c.data.vocab_size = data_setting(tok), str(path), None
    src.tokenizer = tok


def add_rows(sd: dict, rows: int, key: str, tokenizer: dict) -> dict:
    """The weights `sd` with `rows` rows in the embedding (and an untied head), each new row the
    mean of the old, when the tokenizer has a chat template (else as they are: a wrong shape is
    check_weights' to report)."""
    old, chat = sd["transformer.wte.weight"].shape[0], tokenizer.get("chat")
    if old >= rows or not isinstance(chat, dict):
        return sd
    for name in ROWS:
        if name in sd and sd[name].shape[0] == old:
            w = sd[name]
            mean = w.float().mean(0, keepdim=True).to(w.dtype)
            sd[name] = torch.cat([w, mean.expand(rows - old, -1)])
    new = chat.get("special", [])[-(rows - old):]
    log.info(f"{key} has no rows for {rows - old} chat token(s) ({', '.join(new)}): added, each "
             f"the mean of its {old:,} rows")
    return sd
