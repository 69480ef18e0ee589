"""data/hf_tokenizer.py: the exported GPT-2, own-BPE and char files encode exactly as tinygpt's
tokenizer, and decode back to the very text."""
from __future__ import annotations

import json

import pytest

from data.hf_tokenizer import read_hf_tokenizer, write_char_tokenizer, write_hf_tokenizer
from data.tokenizer import CharTokenizer, GPT2Tokenizer

transformers = pytest.importorskip("transformers", reason="transformers (test-only dependency) is not installed")

TEXTS = [
    "Hello world", "", " ", "plain ASCII, with punctuation: (a) [b] {c}; d! e? f... g-h_i/j",
    "line one\nline two\n\n\nafter blank lines\r\nwindows\rmac", "\t\ttabs\tand    runs   of spaces   \n   ",
    "don't won't I'm you're they've we'll she'd IT'S O'Neil 'quoted'",
    "1 22 333 4444 55555 3.14159 1,000,000 2024-06-01",
    "你好，世界。日本語のテキスト。한국어 텍스트", "emoji 😀🤗🚀 family 👩‍👩‍👧 flags 🇫🇷 skin 👍🏽",
    "naïve café résumé Zürich Ångström façade São Paulo ĳ ǅ", "a<|endoftext|>b <|endoftext|>",
]


@pytest.mark.slow  # over ~1 s
def test_gpt2_files_encode_like_tinygpt(cache_with_gpt2, shared_data_dir, tmp_path):
    out = tmp_path / "hf"
    paths = write_hf_tokenizer(out, model_max_length=1024)
    assert sorted(p.name for p in paths) == ["merges.txt", "special_tokens_map.json", "tokenizer_config.json",
                                             "vocab.json"]
    tok = GPT2Tokenizer()
    shakespeare = (shared_data_dir / "tinyshakespeare.txt").read_text(encoding="utf-8")[100_000:120_000]
    for hf in (transformers.GPT2TokenizerFast.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(out)):
        assert hf.eos_token_id == 50256 and hf.model_max_length == 1024 and len(hf) == 50257
        for text in [*TEXTS, shakespeare]:
            ids = tok.encode(text)
            assert hf.encode(text) == ids, text[:40]
            assert hf.decode(ids) == text
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 50257 and vocab["Hello"] == 15496 and vocab["Ġworld"] == 995
    assert len((out / "merges.txt").read_text(encoding="utf-8").splitlines()) == 1 + 50000


def test_char_files_encode_like_tinygpt(tmp_path):
    """A char vocabulary's tokenizer.json: one token per character (a newline, a space, "\r", an
    emoji, a character that looks like a regex's or a special token's part), back to the very text;
    a character outside it is an error in both. tinygpt reads it back as the same vocabulary."""
    chars = "".join(sorted({*"".join(TEXTS), "\x00", "\x85", "\u2028", "[", "]", "U", "N", "K"}))
    tok = CharTokenizer(chars)
    paths = write_char_tokenizer(tok, tmp_path / "out", model_max_length=64)
    assert sorted(p.name for p in paths) == ["tokenizer.json", "tokenizer_config.json"]
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert isinstance(hf, transformers.PreTrainedTokenizerFast)
    assert hf.model_max_length == 64 and len(hf) == len(chars)
    for text in [*TEXTS, chars, chars[::-1] * 3, "[UNK]"]:
        ids = tok.encode(text)
        assert hf.encode(text) == ids and hf.decode(ids) == text, text[:40]
    with pytest.raises(Exception):
        hf.encode("\x01")  # (not in the vocabulary: tinygpt refuses it too)
    back = read_hf_tokenizer(tmp_path / "out")
    assert back.to_dict() == tok.to_dict()


def test_own_bpe_files_encode_like_tinygpt(shared_data_dir, tmp_path):
    from data.bpe import train
    from data.hf_tokenizer import write_tokenizer_files
    shakespeare = (shared_data_dir / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    tok = train([shakespeare], 400)
    paths = write_tokenizer_files(tok, tmp_path / "hf", model_max_length=64)
    assert sorted(p.name for p in paths) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf.eos_token_id == tok.eot_id and hf.model_max_length == 64 and len(hf) == tok.vocab_size == 400
    for text in [*TEXTS, shakespeare[100_000:110_000]]:
        ids = tok.encode(text)
        assert hf.encode(text) == ids, text[:40]
        assert hf.decode(ids) == text
