"""data/encode.py: streamed encoding equals encoding the whole text; safe GPT-2 cuts; forced cuts."""
from __future__ import annotations

import random

import pytest

from data import encode
from data.config import DataConfig
from data.prepare import prepare
from data.safe_cut import find_safe_cut, split_safe
from data.tokenizer import GPT2Tokenizer
from tests.test_data_prepare import TRICKY, small_chunks, tokens, write


@pytest.mark.parametrize("tokenizer", ["char", "gpt2"])
def test_streamed_equals_whole_text(tokenizer, tmp_path, monkeypatch, cache_with_gpt2):
    rng = random.Random(0)
    text = "".join(rng.choice([TRICKY, TRICKY.upper(), TRICKY[::-1], "\n", " ", "x" * 50]) for _ in range(120))
    src = write(tmp_path, "t.txt", text)
    small_chunks(monkeypatch, chunk=997, seg=300)  # odd sizes: cuts inside multi-byte characters
    p = prepare(DataConfig(name="text", path=str(src), tokenizer=tokenizer, val_fraction=0.25), progress=False)
    n = int(len(text) * 0.75)
    tok = p.tokenizer
    assert tokens(p.train_path).tolist() == tok.encode_ordinary(text[:n])
    assert tokens(p.val_path).tolist() == tok.encode_ordinary(text[n:])
    assert tok.decode(tokens(p.train_path).tolist()) + tok.decode(tokens(p.val_path).tolist()) == text


def test_safe_cuts_never_change_gpt2_tokens(cache_with_gpt2):
    enc = GPT2Tokenizer().enc
    rng = random.Random(1)
    alphabet = list("ab cd\n\n  xyZ09'.,!?;:-\t\r_") + ["é", "你", "好", "。", "🤗", "\u00a0", "\u3000",
                                                        "\u2028", "\x1c", "ll", "'s", " 'll", "ǅ", "²", "①"]
    checked = 0
    for _ in range(600):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 40)))
        full = enc.encode_ordinary(s)
        for c in range(1, len(s)):
            if find_safe_cut(s, c, c) == c:
                checked += 1
                assert enc.encode_ordinary(s[:c]) + enc.encode_ordinary(s[c:]) == full, (s[:c], s[c:])
    assert checked > 500


def test_text_without_safe_cuts_is_still_prepared(tmp_path, monkeypatch, cache_with_gpt2):
    text = "x" * 5000 + "\n"
    src = write(tmp_path, "x.txt", text)
    small_chunks(monkeypatch, chunk=256, seg=100)
    monkeypatch.setattr(encode, "MAX_CARRY_CHARS", 1000)
    p = prepare(DataConfig(name="text", path=str(src), tokenizer="gpt2"), progress=False)
    assert p.meta["forced_bpe_cuts"] > 0
    assert p.tokenizer.decode(tokens(p.train_path).tolist() + tokens(p.val_path).tolist()) == text


def test_the_own_bpe_encodes_a_work_item_in_safe_pieces_exactly_as_in_one_go(shared_data_dir):
    """encode_bpe hands the own BPE's work items to `tokenizers` as a batch of safe sub-pieces (every core):
    the same ids as encoding the item whole, with non-ASCII text and long runs without a safe cut too."""
    pytest.importorskip("tokenizers")
    from data import bpe
    text = (shared_data_dir / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000]
    tok = bpe.train([text], 400)
    item = text[:60_000] + " naïve café 東京は晴れ。" * 300 + "x" * 20_000 + text[60_000:90_000]
    pieces = split_safe(item, 4096)
    assert "".join(pieces) == item and len(pieces) > 10
    batched = [i for piece in pieces for i in tok.encode_ordinary(piece)]
    assert batched == tok.encode_ordinary(item) == tok.encode_ordinary_numpy(item).tolist()
