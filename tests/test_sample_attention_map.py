"""sample.py `--init` with a tiny random Hugging Face GPT-2 saved by transformers, end to end: BPE streaming
and an attention map of a prompt whose characters GPT-2 splits over tokens (the labels: test_viz_attention_map)."""
from __future__ import annotations

import pytest
import torch

import sample
from tests.test_sample import _one_thread, assert_png, report_of, samples_of  # noqa: F401 (fixture)


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
