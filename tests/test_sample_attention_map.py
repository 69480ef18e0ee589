"""sample.py with BPE models: attention-map labels for tokens that split characters, and `--init` with a
tiny random Hugging Face GPT-2 saved by transformers (end to end: BPE streaming + attention map)."""
from __future__ import annotations

import pytest
import torch

import sample
from tests.test_sample import _one_thread, assert_png, report_of, samples_of  # noqa: F401 (fixture)


@pytest.fixture
def gpt2_tok(cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    return GPT2Tokenizer()


def test_labels_show_whitespace_and_split_characters(gpt2_tok):
    ids = gpt2_tok.encode("Hi 世界\n\tok")
    labels = sample.token_labels(gpt2_tok, ids, glyphs={ord(c) for c in "Hi世界ok·⏎⇥…"})
    assert len(labels) == len(ids)
    assert labels[0] == "Hi" and "⏎" in "".join(labels) and "⇥" in "".join(labels)
    # "世" and "界" are 3 bytes each and GPT-2 splits them over tokens: each piece names its character
    pieces = [lab for lab in labels if "世" in lab or "界" in lab]
    assert pieces and all("…" in lab for lab in pieces)
    assert not any("\\x" in lab or "\ufffd" in lab for lab in labels)
    # characters the label fonts cannot draw are escaped instead of drawn as empty boxes
    assert sample.token_labels(gpt2_tok, gpt2_tok.encode("世"), glyphs=set())[0].startswith("\\u4e16")


@pytest.fixture
def tiny_hf_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    path = tmp_path / "hf-gpt2-tiny"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


@pytest.mark.slow
def test_init_from_hf_dir_end_to_end(tiny_hf_gpt2, cache_with_gpt2, capsys, tmp_path):
    prompt = "Hello 世界 🌍"
    png = tmp_path / "bpe.png"
    code = sample.main(["--init", str(tiny_hf_gpt2), "--prompt", prompt, "--max-new-tokens", "12", "--seed", "0",
                        "--attention-map", str(png), "--num-samples", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert all(s.startswith(prompt) for s in samples_of(out)) and len(samples_of(out)) == 2
    assert report_of(err) == (24, "on")
    assert_png(png)
    greedy = ["--init", str(tiny_hf_gpt2), "--prompt", prompt, "--max-new-tokens", "70", "--temperature", "0"]
    outs = []
    for extra in ([], ["--no-kv-cache"]):  # 70 > n_positions 64: the window slides on both paths
        assert sample.main(greedy + extra) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
