"""The tokenizer inside a GGUF file, as the plain values model/gguf.py writes (tokenizer.ggml.*),
chosen so that llama.cpp's tokenize gives tinygpt's ids for every text tinygpt encodes (special
tokens in the text included):

- GPT-2 BPE, your own BPE and an imported byte-level BPE (SmolLM2's, Qwen3's) are llama.cpp's "gpt2"
  model (byte-level BPE): the tokens in byte-level text, the merges in rank order, and the
  pre-tokenizer (the regex that cuts text into words before BPE) llama.cpp names for the one in
  tokenizer.json: gpt-2, smollm (digits one by one) or qwen2.
- Characters are llama.cpp's "rwkv" model: it takes the longest token matching the text's next
  bytes, and characters' UTF-8 codes are prefix-free, so it reads text one character at a time, as
  tinygpt does. Its "gpt2" model would make id 11 (a character) the end of every generation when no
  end token is given; "rwkv" has none. llama.cpp asserts that an rwkv vocabulary has a newline, so a
  vocabulary without one is refused.

A chat run's tokenizer dict may carry "chat_template" (Jinja, written as tokenizer.chat_template)
and the texts of its "eos_token" (the end of text) and "eot_token" (the end of a turn): the ids
llama.cpp stops at.
"""
from __future__ import annotations

import json

from data.tokenizer import (BPE_EOT, BPETokenizer, CharTokenizer, ChatTokenizer, GPT2Tokenizer,
                            Tokenizer)

# llama.cpp's token types (gguf.TokenType)
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
# a tokenizer.json Split regex -> llama.cpp's name for the pre-tokenizer (tokenizer.ggml.pre)
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPLIT_REGEXES = {_CONTRACTIONS + r"\p{N}" + _REST: "qwen2",
                 _CONTRACTIONS + r"\p{N}{1,3}" + _REST: "llama-bpe"}


def _byte_level(step: dict, regex: bool) -> bool:
    return (step.get("type") == "ByteLevel" and step.get("add_prefix_space", True) is False
            and bool(step.get("use_regex", True)) == regex)


def pre_tokenizer(pre: dict | None) -> str:
    """llama.cpp's name for a tokenizer.json pre-tokenizer; a ValueError for one it lacks."""
    pre = pre or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and _byte_level(steps[0], regex=True):
        return "gpt-2"
    first, last = steps[0], steps[-1]
    if len(steps) == 2 and first.get("type") == "Digits" and first.get("individual_digits") \
            and _byte_level(last, regex=True):
        return "smollm"
    if len(steps) == 2 and first.get("type") == "Split" and _byte_level(last, regex=False) \
            and first.get("behavior") == "Isolated" and not first.get("invert"):
        if name := SPLIT_REGEXES.get((first.get("pattern") or {}).get("Regex")):
            return name
    raise ValueError(f"pre_tokenizer={json.dumps(pre)[:120]} cannot be exported to GGUF: "
                     f"llama.cpp knows no pre-tokenizer that cuts text as this one does (GPT-2's, "
                     f"SmolLM2's and Qwen2/3's are known)")


def bpe_vocab(tokenizer: BPETokenizer) -> dict:
    """A byte-level BPE's tokenizer.json (your own, an imported model's) as llama.cpp's "gpt2"."""
    spec = json.loads(tokenizer.json)
    model, normalizer = spec.get("model") or {}, (spec.get("normalizer") or {}).get("type")
    for key, value, fine in (
            ("normalizer", normalizer, normalizer in (None, "NFC")),
            ("model.type", model.get("type"), model.get("type") == "BPE"),
            ("model.ignore_merges", model.get("ignore_merges"), not model.get("ignore_merges")),
            ("model.byte_fallback", model.get("byte_fallback"), not model.get("byte_fallback"))):
        if not fine:
            raise ValueError(f"{key}={value!r} in the tokenizer cannot be exported to GGUF: "
                             f"llama.cpp's byte-level BPE has no such setting")
    tokens, types = [""] * tokenizer.vocab_size, [NORMAL] * tokenizer.vocab_size
    for text, i in model["vocab"].items():
        tokens[i] = text
    # <|endoftext|>, <|im_start|>, <think>, ...: read whole from the text, as `tokenizers` does
    for added in spec.get("added_tokens") or []:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    # newer tokenizer.json files store a merge as [a, b]; llama.cpp reads "a b"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"model": "gpt2", "pre": pre_tokenizer(spec.get("pre_tokenizer")), "tokens": tokens,
            "token_types": types, "merges": merges}


def gpt2_vocab() -> dict:
    """GPT-2's BPE as llama.cpp's "gpt2" (tiktoken's ranks; the merges recovered as for --hf)."""
    from data.hf_tokenizer import vocab_and_merges
    from data.sources import GPT2_EOT, GPT2_EOT_ID, gpt2_ranks
    vocab, merges = vocab_and_merges(gpt2_ranks())
    tokens = [""] * (GPT2_EOT_ID + 1)
    for text, i in vocab.items():
        tokens[i] = text
    tokens[GPT2_EOT_ID] = GPT2_EOT
    return {"model": "gpt2", "pre": "gpt-2", "tokens": tokens,
            "token_types": [NORMAL] * GPT2_EOT_ID + [CONTROL], "merges": merges}


def _rwkv_escape(ch: str) -> str:
    """A character as llama.cpp's rwkv vocabulary stores it: backslash escapes, \\xNN for the
    other control characters."""
    named = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    if ch in named:
        return named[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def char_vocab(tokenizer: CharTokenizer) -> dict:
    """A char-level vocabulary as llama.cpp's "rwkv" model (longest match: a token a character)."""
    if "\n" not in tokenizer.stoi:
        raise ValueError("a char vocabulary without a newline cannot be exported to GGUF: "
                         "llama.cpp's character tokenizer (rwkv) needs a newline token; train on "
                         "text that has one")
    return {"model": "rwkv", "pre": None, "tokens": [_rwkv_escape(c) for c in tokenizer.chars],
            "token_types": [NORMAL] * tokenizer.vocab_size, "merges": None}


def _token_id(vocab: dict, tokenizer_dict: dict, key: str) -> int | None:
    """The id of the special token whose text the tokenizer dict gives under `key` (a chat run's
    eos_token, eot_token), made a control token: llama.cpp stops at it and never prints it."""
    text = tokenizer_dict.get(key)
    if text is None:
        return None
    types = vocab["token_types"]
    ids = [i for i, t in enumerate(vocab["tokens"]) if t == text and types[i] != NORMAL]
    if not ids:
        raise ValueError(f"{key}={text!r} of the tokenizer is not one of its special tokens: the "
                         f"checkpoint's tokenizer is damaged")
    types[ids[0]] = CONTROL
    return ids[0]


def gguf_vocab(tokenizer: Tokenizer, tokenizer_dict: dict) -> dict:
    """The plain values model.gguf.write_gguf writes for this tokenizer: model, pre, tokens,
    token_types, merges, the bos/eos/eot ids and the chat template. What llama.cpp would read
    differently: a ValueError naming it."""
    # a chat run's tokenizer (data/chat_template.py): its base's vocabulary, then the special
    # tokens its template added (control tokens), the template, and its end of turn as eot
    chat = tokenizer_dict.get("chat")
    if isinstance(tokenizer, ChatTokenizer):
        vocab = gguf_vocab(tokenizer.base, {k: v for k, v in tokenizer_dict.items() if k != "chat"})
        vocab["tokens"] += list(chat["special"])
        vocab["token_types"] += [CONTROL] * len(chat["special"])
        eot = _token_id(vocab, {"eot_token": chat["end"]}, "eot_token")
        vocab.update(eot=eot, chat_template=chat["template"])
        return vocab
    if isinstance(tokenizer, CharTokenizer):
        vocab = char_vocab(tokenizer)
    elif isinstance(tokenizer, GPT2Tokenizer):
        vocab = gpt2_vocab()
    else:
        assert isinstance(tokenizer, BPETokenizer), type(tokenizer)
        vocab = bpe_vocab(tokenizer)
    assert len(vocab["tokens"]) == tokenizer.vocab_size, (len(vocab["tokens"]),
                                                          tokenizer.vocab_size)
    # <|endoftext|> begins and ends texts (bos and eos), as Hugging Face's GPT-2 config says
    eot = tokenizer.eot_id
    if eot is not None:
        assert vocab["tokens"][eot] == BPE_EOT, vocab["tokens"][eot]
        vocab["token_types"][eot] = CONTROL
    eos = _token_id(vocab, tokenizer_dict, "eos_token")
    vocab.update(bos=eot, eos=eot if eos is None else eos,
                 eot=_token_id(vocab, tokenizer_dict, "eot_token"),
                 chat_template=tokenizer_dict.get("chat_template"))
    return vocab
