"""model.hf both ways: a transformers GPT2LMHeadModel saved locally loads with identical logits (no network),
and write_pretrained's export loads into transformers with no missing or unexpected weights.

`load_hf` (transformers' loader, failing on any load-report warning) is shared with test_export.
"""
import io
import json
import logging
import sys

import pytest
import torch

from model.gpt import GPT
from model.generate import Sampling, generate

transformers = pytest.importorskip("transformers", reason="transformers (test-only dependency) is not installed")

HF_CONFIG = dict(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=100, bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_CONFIG)).eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so a missed mapping or wrong GELU shows
        for name, p in model.named_parameters():
            p.normal_(1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") else 0.0, 0.2)
    return model


def hf_logits(model, idx):
    with torch.no_grad():
        return model(idx).logits


def assert_parity(hf, ours):
    idx = torch.randint(0, HF_CONFIG["vocab_size"], (2, HF_CONFIG["n_positions"]),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = ours(idx)
    assert (logits - hf_logits(hf, idx)).abs().max() <= 1e-5


@pytest.mark.slow  # over ~1 s
def test_safetensors_parity(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    model = GPT.from_pretrained(tmp_path)
    c = model.config
    assert (c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd, c.dropout) == (100, 32, 2, 2, 32, 0.0)
    assert model.lm_head.weight is model.transformer.wte.weight and not model.training
    assert_parity(hf_model, model)


def write_bin_checkpoint(hf_model, path, *, strip_prefix=False, with_mask_buffers=False):
    """A pytorch_model.bin directory (transformers 5 always writes safetensors, so build it by hand)."""
    path.mkdir()
    hf_model.config.to_json_file(path / "config.json")
    sd = {k: v.clone() for k, v in hf_model.state_dict().items()}
    if strip_prefix:  # the original hub files: GPT2Model keys, no lm_head, plus causal-mask buffers
        sd = {k.removeprefix("transformer."): v for k, v in sd.items() if k != "lm_head.weight"}
    if with_mask_buffers:
        for i in range(HF_CONFIG["n_layer"]):
            sd[f"h.{i}.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
            sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(sd, path / "pytorch_model.bin")
    return path


def test_pytorch_model_bin_parity(hf_model, tmp_path):
    assert_parity(hf_model, GPT.from_pretrained(write_bin_checkpoint(hf_model, tmp_path / "bin")))
    original = write_bin_checkpoint(hf_model, tmp_path / "hub", strip_prefix=True, with_mask_buffers=True)
    assert_parity(hf_model, GPT.from_pretrained(original))


def test_untied_head_parity(tmp_path):
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_CONFIG, tie_word_embeddings=False)).eval()
    hf.save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path)
    assert not model.config.tie_weights
    assert_parity(hf, model)


def test_pickled_objects_are_refused(hf_model, tmp_path):
    path = write_bin_checkpoint(hf_model, tmp_path / "evil")
    torch.save({"transformer.wte.weight": torch.zeros(1), "x": object()}, path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="tensor-only"):
        GPT.from_pretrained(path)


def test_missing_and_mismatched_checkpoints(hf_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_pretrained(tmp_path / "nope")
    hf_model.save_pretrained(tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors or pytorch_model.bin"):
        GPT.from_pretrained(tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "config.json").read_text())
    bad = write_bin_checkpoint(hf_model, tmp_path / "bad")
    (bad / "config.json").write_text(json.dumps({**cfg, "n_layer": 3}))
    with pytest.raises(ValueError, match="do not match"):
        GPT.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "activation_function": "relu"}))
    with pytest.raises(ValueError, match="activation_function"):
        GPT.from_pretrained(bad)


def test_safetensors_without_package_gives_clear_error(hf_model, tmp_path, monkeypatch):
    hf_model.save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # makes `import safetensors...` fail
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ValueError, match="pip install safetensors"):
        GPT.from_pretrained(tmp_path)


def test_loaded_model_generates_like_hf_greedy(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path)
    idx = torch.tensor([[1, 2, 3]])
    ours = generate(model, idx, 10, Sampling(temperature=0))
    seq = idx
    for _ in range(10):  # HF greedy by hand (no generate() config surprises)
        seq = torch.cat([seq, hf_logits(hf_model, seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(ours, seq)


# ------------------------------------------------------------------------------- tinygpt -> Hugging Face
def load_hf(path):
    """GPT2LMHeadModel.from_pretrained(path), asserting that nothing was missing, unexpected or mismatched
    (both in its loading info and in what transformers logs)."""
    log, handler = logging.getLogger("transformers"), logging.StreamHandler(buf := io.StringIO())
    log.addHandler(handler)
    try:
        model, info = transformers.GPT2LMHeadModel.from_pretrained(path, output_loading_info=True)
    finally:
        log.removeHandler(handler)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert not any(w in buf.getvalue().lower() for w in ("missing", "unexpected", "mismatch")), buf.getvalue()
    return model.eval()


def test_hf_round_trip(hf_model, tmp_path):
    from model.hf import write_pretrained
    hf_model.save_pretrained(tmp_path / "in")
    ours = GPT.from_pretrained(tmp_path / "in")
    write_pretrained(ours, ours.config.vocab_size, tmp_path / "out")
    back = load_hf(tmp_path / "out")
    assert_parity(back, ours)
    original = hf_model.state_dict()
    assert all(torch.equal(v, original[k]) for k, v in back.state_dict().items())


@pytest.mark.parametrize("bias,tie,mlp", [(False, True, "gelu"), (True, False, "gelu"), (False, False, "gelu"),
                                          (False, True, "gelu_exact")])
def test_export_bias_free_padded_untied(tmp_path, bias, tie, mlp):
    """... and the exact GELU (nanoGPT's runs) as activation_function "gelu", read back as mlp=gelu_exact."""
    from model.config import GPTConfig
    from model.hf import read_config, write_pretrained
    torch.manual_seed(2)
    ours = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=bias, tie_weights=tie,
                         mlp=mlp))
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.2 * torch.randn_like(p))
    names = [p.name for p in write_pretrained(ours.eval(), 60, tmp_path)]  # 4 padded vocabulary rows
    assert names == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["n_positions"], cfg["activation_function"], cfg["tie_word_embeddings"]) == (
        60, 16, {"gelu": "gelu_new", "gelu_exact": "gelu"}[mlp], tie)
    assert read_config(tmp_path).mlp == mlp
    hf = load_hf(tmp_path)
    assert hf.config.vocab_size == 60 and (hf.lm_head.weight is hf.transformer.wte.weight) == tie
    if not bias:
        assert not hf.transformer.h[1].mlp.c_fc.bias.any() and not hf.transformer.ln_f.bias.any()
    idx = torch.randint(0, 60, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(idx)[0][..., :60] - hf(idx).logits).abs().max() <= 1e-5


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_write_pretrained_files_follow_the_umask(tmp_path):
    """model.safetensors was 0600 (safetensors' own temp file) beside a 0644 config.json: a shared export must be
    readable as the rest; an earlier export's file, replaced in place, keeps its bits."""
    import os
    import stat

    from model.config import GPTConfig
    from model.hf import write_pretrained
    ours = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()
    old = os.umask(0o027)
    try:
        names = write_pretrained(ours, 16, tmp_path / "a")
        assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in names} == {
            "config.json": "0o640", "model.safetensors": "0o640"}
        os.chmod(tmp_path / "a" / "model.safetensors", 0o604)
        write_pretrained(ours, 16, tmp_path / "a")
        assert stat.S_IMODE((tmp_path / "a" / "model.safetensors").stat().st_mode) == 0o604
    finally:
        os.umask(old)


@pytest.mark.slow  # over ~1 s: a 50257-token model written and read back
def test_the_snippet_in_model_md_runs_as_written(capsys):
    """docs/model.md's from_pretrained snippet (the one that makes a demo directory with transformers), run as
    written: it prints the shape its comment says (export_eval.md's snippets: tests/test_export.py)."""
    import re
    from pathlib import Path
    doc = (Path(__file__).parents[1] / "docs" / "model.md").read_text(encoding="utf-8")
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "from transformers" in b]
    exec(compile(snippet, "model.md", "exec"), {})
    out = capsys.readouterr().out
    assert "GPTConfig(" in out and out.endswith("torch.Size([1, 11])\n") and "# torch.Size([1, 11])" in snippet
