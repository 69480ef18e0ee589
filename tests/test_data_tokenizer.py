"""data/tokenizer.py: char + GPT-2 BPE tokenizers, dict round-trips, offline errors, token_bytes, StreamDecoder."""
from __future__ import annotations

import json

import pytest

from data import sources
from data.tokenizer import CharTokenizer, GPT2Tokenizer, StreamDecoder, token_bytes, tokenizer_from_dict

MULTIBYTE = "héllo wörld — 你好，世界。🤗🚀 naïve café 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩‍👩‍👧 ok\n"


def _no_tiktoken_download(monkeypatch):
    import tiktoken

    def boom(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", boom)


# ------------------------------------------------------------------------------------------------ char
def test_char_roundtrip_and_sorted_vocab():
    tok = CharTokenizer("hello world\n")
    assert tok.chars == sorted(set("hello world\n"))
    assert tok.vocab_size == 9 and tok.eot_id is None
    ids = tok.encode("hello\nworld")
    assert ids == [tok.stoi[c] for c in "hello\nworld"]
    assert tok.decode(ids) == "hello\nworld"
    assert tok.decode_bytes(ids) == b"hello\nworld"


def test_char_unknown_characters_listed_in_one_line():
    tok = CharTokenizer("abc ")
    with pytest.raises(ValueError) as ei:
        tok.encode("abc ßé\nx")
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith("characters not in the vocabulary: '\\n', 'x', 'ß', 'é' (the model was trained on a "
                          "4-character vocabulary)")


def test_char_decode_out_of_range():
    tok = CharTokenizer("ab")
    with pytest.raises(ValueError, match=r"\[2, 7\]"):
        tok.decode([0, 2, 7])
    with pytest.raises(ValueError):
        tok.decode([-1])


def test_char_dict_roundtrip_is_json():
    tok = CharTokenizer(MULTIBYTE)
    d = json.loads(json.dumps(tok.to_dict()))
    tok2 = tokenizer_from_dict(d)
    assert isinstance(tok2, CharTokenizer) and tok2.to_dict() == tok.to_dict()
    assert tok2.decode(tok.encode(MULTIBYTE)) == MULTIBYTE


def test_unknown_dict():
    with pytest.raises(ValueError, match="unknown tokenizer"):
        tokenizer_from_dict({"type": "sentencepiece"})


# ------------------------------------------------------------------------------------------------ gpt2
def test_gpt2_hello_world(cache_with_gpt2, monkeypatch):
    _no_tiktoken_download(monkeypatch)  # must come from the local ranks file
    tok = GPT2Tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.decode([15496, 995]) == "Hello world"
    assert tok.decode(tok.encode(MULTIBYTE)) == MULTIBYTE


def test_gpt2_special_token_handling(cache_with_gpt2):
    tok = GPT2Tokenizer()
    assert tok.encode("a<|endoftext|>b")[1] == 50256          # prompts: the special token
    ordinary = tok.encode_ordinary("a<|endoftext|>b")          # corpus: plain text
    assert 50256 not in ordinary and tok.decode(ordinary) == "a<|endoftext|>b"
    with pytest.raises(ValueError, match="outside the GPT-2 vocabulary"):
        tok.decode([50257])


def test_gpt2_dict_roundtrip(cache_with_gpt2):
    tok = GPT2Tokenizer()
    assert tok.to_dict() == {"type": "gpt2"}
    tok2 = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert isinstance(tok2, GPT2Tokenizer) and tok2.encode("Hello world") == [15496, 995]


def test_gpt2_offline_without_ranks_says_where(monkeypatch):
    _no_tiktoken_download(monkeypatch)
    for make in (GPT2Tokenizer, lambda: tokenizer_from_dict({"type": "gpt2"})):
        with pytest.raises(FileNotFoundError) as ei:
            make()
        msg = str(ei.value)
        assert "\n" not in msg
        assert str(sources.gpt2_ranks_cache_path()) in msg and "Failed to resolve" in msg


# ----------------------------------------------------------------------------------------- token bytes
def test_token_bytes_count_utf8_bytes(cache_with_gpt2):
    import torch
    tb = token_bytes(CharTokenizer("aé你😀\n"))
    assert tb.dtype == torch.int64 and tb.tolist() == [1, 1, 2, 3, 4]  # sorted: \n a é 你 😀
    tok = GPT2Tokenizer()
    tb = token_bytes(tok)
    assert tb.shape == (50257,) and tb.dtype == torch.int64 and tb[50256] == 0 and tb[:50256].min() >= 1
    for text in (MULTIBYTE, "Hello world, it's 2024!\n\n   spaces"):  # bits per byte: the denominator is exact
        assert int(tb[torch.tensor(tok.encode(text))].sum()) == len(text.encode("utf-8"))
    assert int(tb[torch.tensor(tok.encode("a<|endoftext|>b"))].sum()) == 2


# ------------------------------------------------------------------------------------------ streaming
def _stream(tok, ids):
    dec = StreamDecoder(tok)
    parts = [dec.push([i]) for i in ids]
    parts.append(dec.flush())
    return parts


def test_stream_decoder_gpt2_holds_back_partial_utf8(cache_with_gpt2):
    tok = GPT2Tokenizer()
    ids = tok.encode(MULTIBYTE)
    # the premise: some single tokens are not valid UTF-8 on their own
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    parts = _stream(tok, ids)
    assert "".join(parts) == MULTIBYTE
    assert all("\ufffd" not in p for p in parts)
    assert "" in parts  # something was held back


def test_stream_decoder_char_and_batches(cache_with_gpt2):
    tok = CharTokenizer(MULTIBYTE)
    assert "".join(_stream(tok, tok.encode(MULTIBYTE))) == MULTIBYTE
    g = GPT2Tokenizer()
    dec = StreamDecoder(g)
    ids = g.encode(MULTIBYTE)
    out = dec.push(ids[:5]) + dec.push(ids[5:9]) + dec.push(ids[9:]) + dec.flush()
    assert out == MULTIBYTE


def test_stream_decoder_invalid_bytes_become_replacement_char(cache_with_gpt2):
    tok = GPT2Tokenizer()
    lead = tok.encode("🤗")[0]  # a token holding only the first bytes of the emoji
    dec = StreamDecoder(tok)
    assert dec.push([lead]) == ""
    assert dec.push(tok.encode("A")) == "\ufffdA"  # the lead bytes can never complete now
    dec.push([lead])
    assert dec.flush() == "\ufffd"


# ------------------------------------------------------------------------------------------- own BPE
BPE_TEXT = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings "
            "and arrows of outrageous fortune. Café naïve 你好世界 🤗\n") * 30


@pytest.fixture(scope="module")
def bpe_tok():
    from data.bpe import train
    return train([BPE_TEXT], 300)


def test_bpe_roundtrip_non_ascii_and_end_of_text(bpe_tok):
    tok = bpe_tok
    assert tok.vocab_size == 300 and tok.decode_bytes([tok.eot_id]) == b"<|endoftext|>"
    for text in (MULTIBYTE, BPE_TEXT[:400], "", " \n\t  x", "unseen: Ωμέγα 𝔘𝔫𝔦 ĳ"):
        assert tok.decode(tok.encode(text)) == text and tok.decode(tok.encode_ordinary(text)) == text
        assert sum(token_bytes(tok)[tok.encode_ordinary(text)].tolist()) == len(text.encode())
    assert len(tok.encode("the question")) < len("the question")  # merges learnt from the text
    text = "a<|endoftext|>b"
    assert tok.encode(text).count(tok.eot_id) == 1 and tok.eot_id not in tok.encode_ordinary(text)
    assert tok.decode(tok.encode(text)) == tok.decode(tok.encode_ordinary(text)) == text
    assert token_bytes(tok)[tok.eot_id] == 0
    dec = StreamDecoder(tok)
    assert "".join(dec.push([i]) for i in tok.encode(MULTIBYTE)) + dec.flush() == MULTIBYTE
    with pytest.raises(ValueError, match=r"token ids \[300\] are outside this 300-token BPE vocabulary"):
        tok.decode([5, 300])


def test_bpe_dict_survives_a_weights_only_checkpoint(bpe_tok, tmp_path):
    import torch

    from tests.helpers import find_non_plain
    d = bpe_tok.to_dict()
    assert d["type"] == "bpe" and d["vocab_size"] == 300 and isinstance(d["json"], str)
    torch.save({"tokenizer": d}, tmp_path / "t.pt")
    loaded = torch.load(tmp_path / "t.pt", weights_only=True)
    assert find_non_plain(loaded) is None
    tok = tokenizer_from_dict(loaded["tokenizer"])
    assert tok.to_dict() == d and tok.encode(MULTIBYTE) == bpe_tok.encode(MULTIBYTE)
    assert tokenizer_from_dict(json.loads(json.dumps(d))).encode(BPE_TEXT) == bpe_tok.encode(BPE_TEXT)


def _word_level_json() -> str:
    import tokenizers
    return tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}, unk_token="a")).to_str()


def test_bpe_damaged_dict_is_one_line(bpe_tok):
    d = bpe_tok.to_dict()
    for bad, words in (({**d, "json": "{not json"}, "the bpe tokenizer description is damaged"),
                       ({**d, "vocab_size": 301}, "says 301 tokens but holds 300"),
                       ({**d, "json": _word_level_json()}, "not a byte-level BPE with <|endoftext|>")):
        with pytest.raises(ValueError) as e:
            tokenizer_from_dict(bad)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_bpe_without_the_tokenizers_package_names_the_pip_command(bpe_tok, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # what `import tokenizers` meets when it is not installed
    with pytest.raises(ValueError, match=r"needs Hugging Face's tokenizers package, which is not installed: "
                                         r"pip install tokenizers$"):
        tokenizer_from_dict(bpe_tok.to_dict())
