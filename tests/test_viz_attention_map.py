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


@pytest.mark.slow  # over ~1 s
def test_draws_a_grid_png_of_the_last_tokens_and_leaves_the_model_alone(tiny_gpt_config, tmp_path):
    from data.tokenizer import CharTokenizer
    from model.gpt import GPT

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


def test_label_glyphs_come_from_a_familys_widest_file_not_its_last(monkeypatch):
    """With fonts-dejavu-extra, DejaVu Sans is many files, and one registered last (ExtraLight) lacks ⏎:
    the newline label must still be drawn as ⏎, not escaped to \\u23ce."""
    from matplotlib import font_manager, ft2font
    from matplotlib.font_manager import FontEntry

    from data.tokenizer import CharTokenizer
    from viz import attention_map

    basic = {ord(c) for c in "ROMEO:abc·⇥…"}
    charmaps = {"DejaVuSans.ttf": basic | {0x23CE} | set(range(0x400, 0x500)),  # the regular face: wider
                "DejaVuSans-ExtraLight.ttf": basic, "broken.ttf": None}

    class FakeFT2Font:
        def __init__(self, path):
            if charmaps[path] is None:
                raise RuntimeError("unsupported font")
            self.path = path

        def get_charmap(self):
            return {c: i for i, c in enumerate(sorted(charmaps[self.path]))}
    fonts = [FontEntry(fname=f, name="DejaVu Sans") for f in ("broken.ttf", "DejaVuSans.ttf", "DejaVuSans-ExtraLight.ttf")]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", fonts)
    monkeypatch.setattr(ft2font, "FT2Font", FakeFT2Font)
    families, glyphs = attention_map.label_fonts()
    assert families == ["DejaVu Sans"] and 0x23CE in glyphs
    tok = CharTokenizer("ROMEO:\n")
    assert attention_map.token_labels(tok, tok.encode("ROMEO:\n")) == ["R", "O", "M", "E", "O", ":", "⏎"]
