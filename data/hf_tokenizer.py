"""Tokenizer files for Hugging Face: GPT-2's vocab.json + merges.txt rebuilt from tiktoken's ranks, the own BPE's
tokenizer.json (it is one already), or a char-level vocab.json. The GPT-2 ranks hold every token but not the
merges, so each merge is recovered by running BPE on the token's bytes with only lower-ranked merges: the last two
parts are the pair whose merge made the token.
"""
from __future__ import annotations

import json
from pathlib import Path

from common.files import write_text_atomic
from data.sources import GPT2_EOT, GPT2_EOT_ID, gpt2_ranks
from data.tokenizer import (BPE_EOT, BPETokenizer, CharTokenizer, ChatTokenizer, GPT2Tokenizer,
                            Tokenizer, bytes_to_unicode)


def _last_merge(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The pair BPE merges last when it builds `token` from its bytes using lower-ranked merges only."""
    parts = [bytes([b]) for b in token]
    limit = ranks[token]
    while len(parts) > 2:
        r, i = min((ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1))
        assert r < limit, f"token {token!r} cannot be built from lower-ranked merges"
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts[0], parts[1]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[str]]:
    """vocab.json's mapping and merges.txt's lines (in rank order) for these ranks."""
    enc = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            a, b = _last_merge(ranks, token)
            merges.append(f"{text(a)} {text(b)}")
    return vocab, merges


def _write_files(out_dir: str | Path, eot: str, files: dict[str, str], tokenizer_config: dict) -> list[Path]:
    """`files` plus the tokenizer config and special-token map both HF tokenizers read, written into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    files = {**files, "tokenizer_config.json": json.dumps({**tokenizer_config, **special, "add_prefix_space": False},
                                                          indent=2),
             "special_tokens_map.json": json.dumps(special, indent=2)}
    for name, content in files.items():
        write_text_atomic(out_dir / name, content)
    return [out_dir / name for name in files]


def write_hf_tokenizer(out_dir: str | Path, model_max_length: int) -> list[Path]:
    """The GPT-2 tokenizer files for `AutoTokenizer.from_pretrained(out_dir)`; like tinygpt's
    GPT2Tokenizer.encode, they read a literal "<|endoftext|>" as the special token."""
    vocab, merges = vocab_and_merges(gpt2_ranks())
    vocab[GPT2_EOT] = GPT2_EOT_ID
    return _write_files(out_dir, GPT2_EOT, {"vocab.json": json.dumps(vocab, ensure_ascii=False),
                                            "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n"},
                        {"tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length})


def write_char_vocab(tokenizer: CharTokenizer, out_dir: str | Path) -> Path:
    """vocab.json ({character: id}) for a char-level model (transformers has no char tokenizer to load it into)."""
    path = Path(out_dir) / "vocab.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(tokenizer.stoi, ensure_ascii=False))
    return path


def write_bpe_tokenizer(tokenizer: BPETokenizer, out_dir: str | Path, model_max_length: int) -> list[Path]:
    """The own BPE's tokenizer.json (exactly the one tinygpt encodes with) and a config naming the fast tokenizer,
    for `AutoTokenizer.from_pretrained(out_dir)`; like BPETokenizer.encode it reads "<|endoftext|>" as the token."""
    return _write_files(out_dir, BPE_EOT, {"tokenizer.json": tokenizer.json},
                        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
                         "clean_up_tokenization_spaces": False})


def write_tokenizer_files(tokenizer: Tokenizer, out_dir: str | Path, model_max_length: int) -> list[Path]:
    """The tokenizer files an export needs, for whichever tokenizer the model was trained with; a
    chat tokenizer's base files, then its template and tokens in tokenizer_config.json
    (data/chat_hf.py)."""
    if isinstance(tokenizer, ChatTokenizer):
        from data.chat_hf import add_to_config
        files = write_tokenizer_files(tokenizer.base, out_dir, model_max_length)
        return files + [f for f in add_to_config(out_dir, tokenizer) if f not in files]
    if isinstance(tokenizer, BPETokenizer):
        return write_bpe_tokenizer(tokenizer, out_dir, model_max_length)
    if isinstance(tokenizer, CharTokenizer):
        return [write_char_vocab(tokenizer, out_dir)]
    return write_hf_tokenizer(out_dir, model_max_length)


def _model_type(d: Path):
    """config.json's model_type (None when unreadable: reading the model reports that)."""
    try:
        return json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def read_tokenizer_json(path: Path) -> BPETokenizer:
    """A model's tokenizer.json as tinygpt's BPETokenizer (byte-level BPE with <|endoftext|>: SmolLM2's, Qwen3's)."""
    try:
        return BPETokenizer(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{path} is not a byte-level BPE with {BPE_EOT} (as SmolLM2's and Qwen3's are): tinygpt "
                         f"cannot encode with it; use a model whose tokenizer is one") from None


def read_hf_tokenizer(hf_dir: str | Path) -> Tokenizer:
    """The tokenizer of a local HF directory with its chat template, if it has one (an export's
    added tokens are in its tokenizer_config.json only: data/chat_hf.py)."""
    from data.chat_hf import chat_of
    tokenizer = read_base_tokenizer(hf_dir)
    chat = chat_of(hf_dir, tokenizer)
    return tokenizer if chat is None else ChatTokenizer(tokenizer, chat)


def read_base_tokenizer(hf_dir: str | Path) -> Tokenizer:
    """The tokenizer of a local HF directory, for sample.py --init and eval.py --hf alike: a Llama/Qwen3 model's
    tokenizer.json; export.py's own-BPE tokenizer.json or char vocab.json (either without merges.txt), else GPT-2
    BPE."""
    d = Path(hf_dir).expanduser()
    if (d / "tokenizer.json").is_file() and _model_type(d) not in (None, "gpt2"):
        return read_tokenizer_json(d / "tokenizer.json")
    if (d / "tokenizer.json").is_file() and not (d / "merges.txt").is_file():
        return BPETokenizer((d / "tokenizer.json").read_text(encoding="utf-8"))
    if not (d / "vocab.json").is_file() or (d / "merges.txt").is_file():
        return GPT2Tokenizer()
    try:
        vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
        tokenizer = CharTokenizer(vocab) if isinstance(vocab, dict) else None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        tokenizer = None
    if tokenizer is None or tokenizer.stoi != vocab:
        raise ValueError(f"{d / 'vocab.json'} is not a char vocabulary written by export.py (its ids are not the "
                         "sorted characters), and there is no merges.txt for GPT-2 BPE: export the model again")
    return tokenizer
