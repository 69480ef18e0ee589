"""viz.attention_map: readable token labels (split characters, whitespace, missing glyphs) and the PNG itself."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.test_sample import assert_png
from viz.attention_map import draw_attention_map, token_labels


@pytest.fixture
def gpt2_tok(cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    return GPT2Tokenizer()


def test_labels_show_whitespace_and_split_characters(gpt2_tok):
    ids = gpt2_tok.encode("Hi 世界\n\tok")
    labels = token_labels(gpt2_tok, ids, glyphs={ord(c) for c in "Hi世界ok·⏎⇥…"})
    assert len(labels) == len(ids)
    assert labels[0] == "Hi" and "⏎" in "".join(labels) and "⇥" in "".join(labels)
    # "世" and "界" are 3 bytes each and GPT-2 splits them over tokens: each piece names its character
    pieces = [lab for lab in labels if "世" in lab or "界" in lab]
    assert pieces and all("…" in lab for lab in pieces)
    assert not any("\\x" in lab or "\ufffd" in lab for lab in labels)
    # characters the label fonts cannot draw are escaped instead of drawn as empty boxes
    assert token_labels(gpt2_tok, gpt2_tok.encode("世"), glyphs=set())[0].startswith("\\u4e16")


def test_draws_a_grid_png_of_the_last_tokens_and_leaves_the_model_alone(tiny_gpt_config, tmp_path):
    from data.tokenizer import CharTokenizer
    from model import GPT

    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz \n")
    model = GPT(dataclasses.replace(tiny_gpt_config, vocab_size=tok.vocab_size, block_size=128, dropout=0.1))
    model.train()
    ids = tok.encode("the quick brown fox\njumps over the lazy dog " * 4)  # > 64 tokens: the last 64 are drawn
    seen, attention_maps = [], model.attention_maps

    def spy(idx):
        seen.append(idx.shape)
        return attention_maps(idx)
    model.attention_maps = spy
    draw_attention_map(model, tok, ids, tmp_path / "att.png", title="tiny")
    assert seen == [torch.Size([1, 64])]
    assert_png(tmp_path / "att.png", min_side=400)
    assert model.training  # attention_maps turns dropout off only while it runs
