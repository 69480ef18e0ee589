"""model.hf_llama both ways: tiny random transformers Llama and Qwen3 models saved locally (with a hub-like
byte-level BPE tokenizer.json) load with transformers' logits, and tinygpt's rotary models export to
LlamaForCausalLM / Qwen3ForCausalLM with no missing or unexpected weights and the same logits. Settings no class
expresses are refused in one line naming the setting.

`hub_dir` (a Llama/Qwen3 directory with its tokenizer) is shared with test_export and test_finetune.
"""
from __future__ import annotations

import io
import json
import logging

import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT
from model import hf_llama
from model.generate import Sampling, generate
from model.positions import FORMATS, SCHEMES

transformers = pytest.importorskip("transformers", reason="transformers (test-only dependency) is not installed")
tokenizers = pytest.importorskip("tokenizers")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = "ROMEO:\nWhat light through yonder window breaks? 1234 naïve café <|im_start|>user<|im_end|><|endoftext|>"
PAD = 5  # the model's vocabulary is the tokenizer's plus a few padded rows, as Qwen3-0.6B's is
TOL = 1e-4  # fp32, the bound (measured: 0.0, the same ops in the same order)


def hub_tokenizer(d) -> int:
    """A hub-like byte-level BPE (digits split, specials first, one added non-special token) as tokenizer.json,
    vocab.json and merges.txt in `d` (SmolLM2 and Qwen3 ship all three); its size."""
    tk = tokenizers
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True),
                                                    tk.pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the king and the queen speak of love at night"] * 20 + [TEXT], trainer=trainer)
    tok.add_tokens(["<think>"])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    tok.model.save(str(d))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                         "eos_token": "<|endoftext|>"}))
    return tok.get_vocab_size(with_added_tokens=True)


def randomize(model):
    """Larger weights than an init, norms around 1, so a missed mapping, eps or rotation shows."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    return model.eval()


def hub_dir(path, kind="llama", **overrides):
    """(directory, transformers model) of a tiny random Llama or Qwen3 with a tokenizer: 2 layers, 4 heads."""
    n_tok = hub_tokenizer(path)
    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[kind]
    cfg = dict(vocab_size=n_tok + PAD, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
               rope_theta=5000.0, tie_word_embeddings=False)
    model = randomize(transformers.AutoModelForCausalLM.from_config(cls(**{**cfg, **overrides})))
    model.save_pretrained(path)
    return path, model


def max_diff(ours, hf, vocab=None, T=64) -> float:
    idx = torch.randint(0, vocab or hf.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return (ours(idx)[0][..., :hf.config.vocab_size] - hf(idx).logits).abs().max().item()


CASES = {"llama_gqa_untied": ("llama", {}),
         "llama_bias_tied_mha": ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                                               num_key_value_heads=4)),
         "qwen3_mqa_head_dim_tied": ("qwen3", dict(num_key_value_heads=1, head_dim=24, tie_word_embeddings=True)),
         "qwen3_gqa_untied": ("qwen3", {})}


# ------------------------------------------------------------------------------- Hugging Face -> tinygpt
@pytest.mark.parametrize("case", CASES)
def test_import_parity(tmp_path, case):
    kind, kw = CASES[case]
    d, hf = hub_dir(tmp_path / "hf", kind, **kw)
    ours = GPT.from_pretrained(d)
    c = ours.config
    assert (c.position, c.norm, c.mlp, c.qk_norm, c.norm_eps, c.rope_theta) == (
        "rope", "rmsnorm", "swiglu", kind == "qwen3", 1e-5, 5000.0)
    assert (c.kv_heads, c.head_size, c.mlp_size, c.block_size) == (
        hf.config.num_key_value_heads, hf.config.head_dim, 96, 64)
    assert c.tie_weights == (ours.lm_head.weight is ours.transformer.wte.weight) == hf.config.tie_word_embeddings
    assert max_diff(ours, hf) <= TOL
    from model.hf import write_pretrained
    write_pretrained(ours, ours.config.vocab_size, tmp_path / "out")  # and back: every tensor as it was
    back, original = load_auto(tmp_path / "out").state_dict(), hf.state_dict()
    assert back.keys() == original.keys() and all(torch.equal(v, original[k]) for k, v in back.items())


def test_sharded_safetensors_and_greedy_decode(tmp_path):
    d, hf = hub_dir(tmp_path / "hf", "qwen3")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = GPT.from_pretrained(tmp_path / "sharded")
    assert max_diff(ours, hf) <= TOL
    seq = idx = torch.tensor([[1, 2, 3]])
    for _ in range(20):  # past nothing: the cache's rotary offsets, step by step, against transformers' full pass
        with torch.no_grad():
            seq = torch.cat([seq, hf(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generate(ours, idx, 20, Sampling(temperature=0)), seq)


BASE = dict(model_type="llama", vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4)


@pytest.mark.parametrize("change,words", [
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling="),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "rope_parameters.rope_type='yarn'"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (dict(model_type="qwen3", use_sliding_window=True, sliding_window=16), "use_sliding_window=True"),
    (dict(model_type="qwen3", layer_types=["full_attention", "sliding_attention"]), "use_sliding_window"),
    (dict(model_type="qwen3", attention_bias=True), "attention_bias=True is not supported: with mlp_bias=False"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(model_type="mistral"), "model_type='mistral' is not supported"),
])
def test_unsupported_configs_are_refused_in_one_line(change, words):
    from model.hf import config_from_hf
    with pytest.raises(ValueError) as e:
        config_from_hf({**BASE, **change})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_old_style_config_keys(tmp_path):
    """Hub configs written by transformers 4 (rope_theta at the top, rope_scaling null, no head_dim)."""
    from model.hf import config_from_hf
    c = config_from_hf({**BASE, "rope_theta": 100000.0, "rope_scaling": None, "tie_word_embeddings": True,
                        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192})
    assert (c.rope_theta, c.tie_weights, c.kv_heads, c.head_size, c.norm_eps, c.block_size) == (
        1e5, True, 2, 16, 1e-6, 8192)
    assert config_from_hf({**BASE, "model_type": "qwen3"}).block_size == 32768  # transformers' default


def test_tokenizer_json_is_the_models_tokenizer(tmp_path):
    from data.hf_tokenizer import read_hf_tokenizer
    from data.tokenizer import BPETokenizer, tokenizer_from_dict
    d, _ = hub_dir(tmp_path / "hf")
    tok = read_hf_tokenizer(d)  # merges.txt beside it too: still tokenizer.json, not GPT-2's BPE
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == len(json.loads((d / "vocab.json").read_text())) + 1
    auto = transformers.AutoTokenizer.from_pretrained(d)
    ids = tok.encode(TEXT)
    assert ids == auto.encode(TEXT) and tok.decode(ids) == TEXT == auto.decode(ids)
    assert tok.eot_id == 0 and tokenizer_from_dict(tok.to_dict()).encode(TEXT) == ids
    (d / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": []}}))
    with pytest.raises(ValueError, match="is not a byte-level BPE with <|endoftext|>"):
        read_hf_tokenizer(d)


def test_sample_and_eval_read_the_directory(tmp_path, capsys):
    """sample.py --init and eval.py --hf: the model's tokenizer, and eval's loss is transformers' loss."""
    import eval as eval_cli
    import sample
    d, hf = hub_dir(tmp_path / "hf", "qwen3", tie_word_embeddings=True)
    assert sample.main(["--init", str(d), "--prompt", "the king", "--max-new-tokens", "8", "--temperature", "0",
                        "--device", "cpu", "--no-stream"]) == 0
    assert capsys.readouterr().out.startswith("the king")
    text = "the queen speaks of love at night, 42 times"
    (tmp_path / "t.txt").write_text(text)
    assert eval_cli.main(["--file", str(tmp_path / "t.txt"), "--hf", str(d), "--json", "--device", "cpu"]) == 0
    loss = json.loads(capsys.readouterr().out)["loss"]
    ids = torch.tensor([[0] + transformers.AutoTokenizer.from_pretrained(d).encode(text)])  # after <|endoftext|>
    with torch.no_grad():
        logits = hf(ids).logits[0, :-1, :hf.config.vocab_size - PAD]  # eval scores the real vocabulary only
    want = torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item()
    assert abs(loss - want) <= TOL


# ------------------------------------------------------------------------------- tinygpt -> Hugging Face
def load_auto(path):
    """AutoModelForCausalLM.from_pretrained(path), asserting nothing was missing, unexpected or mismatched."""
    log, handler = logging.getLogger("transformers"), logging.StreamHandler(buf := io.StringIO())
    log.addHandler(handler)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    finally:
        log.removeHandler(handler)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert not any(w in buf.getvalue().lower() for w in ("missing", "unexpected", "mismatch")), buf.getvalue()
    return model.eval()


MODERN = dict(vocab_size=72, block_size=32, n_layer=2, n_head=4, n_embd=64, position="rope", norm="rmsnorm",
              mlp="swiglu", rope_theta=500.0, norm_eps=1e-6)


@pytest.mark.parametrize("kw,cls", [
    (dict(n_kv_head=2, tie_weights=False, bias=False), "LlamaForCausalLM"),
    (dict(bias=True, mlp_hidden=80), "LlamaForCausalLM"),
    (dict(qk_norm=True, n_kv_head=1, head_dim=24, tie_weights=False, bias=False), "Qwen3ForCausalLM"),
    (dict(qk_norm=True, n_kv_head=2, bias=False), "Qwen3ForCausalLM"),
])
def test_export_parity(tmp_path, kw, cls):
    from model.hf import write_pretrained
    torch.manual_seed(0)
    ours = randomize(GPT(GPTConfig(**MODERN, **kw)))
    write_pretrained(ours, 70, tmp_path)  # 2 padded vocabulary rows dropped
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == [cls] and cfg["tie_word_embeddings"] == ours.config.tie_weights
    assert (cfg["rms_norm_eps"], cfg["rope_theta"], cfg["max_position_embeddings"], cfg["vocab_size"]) == (
        1e-6, 500.0, 32, 70)
    hf = load_auto(tmp_path)
    assert type(hf).__name__ == cls and hf.config.rope_parameters["rope_theta"] == 500.0
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == ours.config.tie_weights
    assert max_diff(ours, hf, 70, 32) <= TOL
    back = GPT.from_pretrained(tmp_path)  # and back: the same settings (the vocabulary is the real one)
    same = dict(vocab_size=72, mlp_hidden=ours.config.mlp_size)  # the width is written out: intermediate_size
    assert {**back.config.to_dict(), **same} == {**ours.config.to_dict(), **same}


@pytest.mark.parametrize("kw,words", [
    (dict(mlp="relu2"), "mlp='relu2' is not supported"),
    (dict(logit_softcap=30.0), "logit_softcap=30.0 is not supported"),
    (dict(norm="layernorm"), "norm='layernorm' is not supported: position=rope exports as Llama/Qwen3"),
    (dict(mlp="gelu"), "mlp='gelu' is not supported: position=rope"),
    (dict(qk_norm=True, bias=True), "bias=True is not supported: with qk_norm=true"),
    (dict(position="learned"), "norm='rmsnorm' is not supported: position=learned exports as "
                               "GPT-2"),
    (dict(position="learned", norm="layernorm", mlp="gelu", n_kv_head=2), "n_kv_head=2 is not supported"),
    (dict(position="learned", norm="layernorm", mlp="gelu", qk_norm=True), "qk_norm=True is not supported"),
])
def test_export_refuses_what_no_class_expresses(tmp_path, kw, words):
    from model.hf import write_pretrained
    ours = GPT(GPTConfig(**{**MODERN, **kw}))
    with pytest.raises(ValueError) as e:
        write_pretrained(ours, 72, tmp_path / "out")
    assert words in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_gpt2_export_writes_eps_and_mlp_width(tmp_path):
    from model.hf import write_pretrained
    from tests.test_model_hf import load_hf
    ours = randomize(GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, norm_eps=1e-6,
                                   mlp_hidden=48)))
    write_pretrained(ours, 64, tmp_path)
    hf = load_hf(tmp_path)
    assert (hf.config.layer_norm_epsilon, hf.config.n_inner) == (1e-6, 48)
    assert max_diff(ours, hf, 64, 16) <= 1e-5
    assert GPT.from_pretrained(tmp_path).config == ours.config


@pytest.mark.parametrize("position", list(SCHEMES))
def test_every_position_scheme_exports_as_its_family_or_is_refused_in_one_line(tmp_path, position):
    """The table says how each export format writes a scheme (model/positions.py), and the Hugging
    Face writer follows it: the family's class, or one line before anything is written."""
    from model.hf import write_pretrained
    scheme = SCHEMES[position]
    assert set(scheme.exports) <= set(FORMATS), scheme.exports
    family = scheme.exports.get("hf")
    gpt2 = dict(norm="layernorm", mlp="gelu") if family == "gpt2" else {}
    ours = GPT(GPTConfig(**{**MODERN, "position": position, **gpt2}))
    if family is None:
        with pytest.raises(ValueError, match=f"^model.position={position} cannot be exported to "
                                             f"Hugging Face: ") as e:
            write_pretrained(ours, 72, tmp_path / "out")
        assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
    else:
        write_pretrained(ours, 72, tmp_path / "out")
        assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == family
