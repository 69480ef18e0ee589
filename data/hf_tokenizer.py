"""Tokenizer files for Hugging Face, each for `AutoTokenizer.from_pretrained`: GPT-2's vocab.json +
merges.txt rebuilt from tiktoken's ranks, the own BPE's tokenizer.json (it is one already), or a
char vocabulary's tokenizer.json (one token per character). The GPT-2 ranks hold every token but not
the merges, so each merge is recovered by running BPE on the token's bytes with only lower-ranked
merges: the last two parts are the pair whose merge made the token.
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


def _write_files(out_dir: str | Path, eot: str | None, files: dict[str, str],
                 tokenizer_config: dict) -> list[Path]:
    """`files` plus the tokenizer config (and, with an end-of-text token `eot`, the special-token
    map) HF tokenizers read, written into `out_dir`. Decoding gives the text as it is (no clean-up
    of the spaces before punctuation)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    special = {"bos_token": eot, "eos_token": eot, "unk_token": eot} if eot is not None else {}
    config = {**tokenizer_config, **special, "add_prefix_space": False,
              "clean_up_tokenization_spaces": False}
    files = {**files, "tokenizer_config.json": json.dumps(config, indent=2)}
    if special:
        files["special_tokens_map.json"] = json.dumps(special, indent=2)
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


# every character alone (a newline too), in the Oniguruma regex `tokenizers` runs
EACH_CHARACTER = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated",
                  "invert": False}
# not a character, so never in the vocabulary: a character outside it is an error, as in tinygpt
UNKNOWN = "[UNK]"


def char_tokenizer_json(tokenizer: CharTokenizer) -> str:
    """A `tokenizers` tokenizer.json of a char vocabulary: each character alone (the pre-tokenizer),
    its id (a WordLevel model), the tokens joined back with nothing between them (the Fuse decoder):
    any text of its characters round-trips exactly, spaces and newlines included."""
    model = {"type": "WordLevel", "vocab": tokenizer.stoi, "unk_token": UNKNOWN}
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                       "normalizer": None, "pre_tokenizer": EACH_CHARACTER, "post_processor": None,
                       "decoder": {"type": "Fuse"}, "model": model}, ensure_ascii=False, indent=1)


def read_char_tokenizer_json(text: str) -> CharTokenizer | None:
    """The CharTokenizer of a tokenizer.json `char_tokenizer_json` wrote; None for any other."""
    if '"WordLevel"' not in text:  # (a Hub BPE's tokenizer.json is megabytes: not parsed twice)
        return None
    try:
        d = json.loads(text)
        model, vocab = d["model"], d["model"]["vocab"]
        ours = model["type"] == "WordLevel" and d["pre_tokenizer"] == EACH_CHARACTER
        if not ours or d.get("added_tokens"):
            return None
        tokenizer = CharTokenizer(vocab)
    except (ValueError, KeyError, TypeError):
        return None
    return tokenizer if tokenizer.stoi == vocab else None


def write_char_tokenizer(tokenizer: CharTokenizer, out_dir: str | Path,
                         model_max_length: int) -> list[Path]:
    """A char vocabulary's tokenizer.json and a config naming the fast tokenizer, for
    `AutoTokenizer.from_pretrained(out_dir)` (no end-of-text token: a char vocabulary has none)."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    return _write_files(out_dir, None, {"tokenizer.json": char_tokenizer_json(tokenizer)}, config)


def write_bpe_tokenizer(tokenizer: BPETokenizer, out_dir: str | Path, model_max_length: int) -> list[Path]:
    """The own BPE's tokenizer.json (exactly the one tinygpt encodes with) and a config naming the fast tokenizer,
    for `AutoTokenizer.from_pretrained(out_dir)`; like BPETokenizer.encode it reads "<|endoftext|>" as the token."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    return _write_files(out_dir, BPE_EOT, {"tokenizer.json": tokenizer.json}, config)


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
        return write_char_tokenizer(tokenizer, out_dir, model_max_length)
    return write_hf_tokenizer(out_dir, model_max_length)


def hf_tokenizer_dict(hf_dir: str | Path) -> dict:
    """read_hf_tokenizer(hf_dir).to_dict(), without loading GPT-2's ranks for a GPT-2 directory."""
    d = Path(hf_dir).expanduser()
    return GPT2Tokenizer.to_dict() if _reads_gpt2(d) else read_hf_tokenizer(d).to_dict()


def _reads_gpt2(d: Path) -> bool:
    """Whether `d`'s tokenizer is GPT-2 BPE: no tokenizer.json but GPT-2's own (beside merges.txt,
    in a GPT-2 directory), and merges.txt or no vocab.json (an older char export has one alone)."""
    merges = (d / "merges.txt").is_file()
    ours = (d / "tokenizer.json").is_file() and not (merges and _model_type(d) in (None, "gpt2"))
    return not ours and (merges or not (d / "vocab.json").is_file())


def _read(path: Path) -> str:
    """A tokenizer file's text ("" when it is not UTF-8: the reader that needs it says so)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return ""


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
    """The tokenizer of a local HF directory, for sample.py --init, eval.py --hf and model.init_from
    alike: its tokenizer.json (export.py's char or own BPE, a Llama/Qwen3 model's), or (older
    exports) a char vocab.json without merges.txt, else GPT-2 BPE."""
    d = Path(hf_dir).expanduser()
    if _reads_gpt2(d):
        return GPT2Tokenizer()
    if (d / "tokenizer.json").is_file():
        if char := read_char_tokenizer_json(_read(d / "tokenizer.json")):
            return char
        if _model_type(d) not in (None, "gpt2"):
            return read_tokenizer_json(d / "tokenizer.json")
        return BPETokenizer((d / "tokenizer.json").read_text(encoding="utf-8"))
    try:
        vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
        tokenizer = CharTokenizer(vocab) if isinstance(vocab, dict) else None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        tokenizer = None
    if tokenizer is None or tokenizer.stoi != vocab:
        raise ValueError(f"{d / 'vocab.json'} is not a char vocabulary written by export.py (its ids are not the "
                         "sorted characters), and there is no merges.txt for GPT-2 BPE: export the model again")
    return tokenizer
