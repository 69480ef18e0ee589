"""export.py --gguf without llama.cpp: every kind of model tinygpt trains or imports is written,
read back with the gguf package's reader, and its names, shapes, metadata and tokenizer checked; a
forward pass written here from llama.cpp's definitions (gpt2; llama's interleaved rotary, qwen3's
neox one), driven by the file's tensors and metadata alone, gives tinygpt's logits (f32 to float
rounding, f16/bf16/q8_0 within TOLERANCE). llama.cpp itself runs such files in
tests/test_llama_cpp.py."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import export
from data.gguf_vocab import CONTROL, NORMAL, SPLIT_REGEXES, USER_DEFINED, gguf_vocab, pre_tokenizer
from data.tokenizer import CharTokenizer
from model.gguf import write_gguf
from tests.helpers import REPO, save_run, tiny_model

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\\\té你"
MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu")
# name: (settings, llama.cpp architecture)
MODELS = {
    "gpt2": (dict(), "gpt2"),
    "gpt2_nobias_untied_gqa": (dict(bias=False, tie_weights=False, n_kv_head=2, n_head=4), "gpt2"),
    "llama_gqa_headdim_bias": (dict(MODERN, n_head=4, n_kv_head=2, head_dim=16, bias=True,
                                    tie_weights=False), "llama"),
    "llama_mqa": (dict(MODERN, n_head=4, n_kv_head=1, bias=False), "llama"),
    "qwen3": (dict(MODERN, n_head=4, n_kv_head=2, qk_norm=True, bias=False, rope_theta=5000.0),
              "qwen3"),
}
# max |logit difference| / max |logit| of each stored type (tiny random models, weights ~ N(0, 0.2))
TOLERANCE = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 1e-1}


def read_gguf(path) -> tuple[dict, dict, dict]:
    """(metadata, {name: float32 tensor, numpy's (rows, columns) order}, {name: GGML type}) of a
    GGUF file, its tensors dequantized."""
    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        data = np.array(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        tensors[t.name] = torch.from_numpy(data.reshape(*reversed([int(n) for n in t.shape])))
    return meta, tensors, {t.name: t.tensor_type.name for t in reader.tensors}


def rope(x, theta: float, neox: bool):
    """llama.cpp's ggml_rope_ext on x (T, heads, d): the pairs (2i, 2i+1) (llama's "norm" mode) or
    (i, i + d/2) (qwen3's "neox"), pair i turned by pos * theta^(-2i/d)."""
    T, _, d = x.shape
    angle = torch.arange(T)[:, None].float() * theta ** (-torch.arange(0, d, 2).float() / d)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ra, rb], -1) if neox else torch.stack([ra, rb], -1).flatten(-2)


def gguf_forward(meta: dict, w: dict, ids: list[int]) -> torch.Tensor:
    """Logits (T, vocab) as llama.cpp's gpt2, llama and qwen3 graphs compute them, from the file."""
    arch = meta["general.architecture"]

    def a(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    def lin(x, name):
        return x @ w[name + ".weight"].T + w.get(name + ".bias", 0)

    def norm(x, name):
        if arch == "gpt2":
            return F.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"],
                                a("attention.layer_norm_epsilon"))
        eps = a("attention.layer_norm_rms_epsilon")
        return F.rms_norm(x, x.shape[-1:], w[name + ".weight"], eps)

    n_head, n_kv, T = a("attention.head_count"), a("attention.head_count_kv"), len(ids)
    hd = a("attention.key_length", a("embedding_length") // n_head)
    x = w["token_embd.weight"][ids] + (w["position_embd.weight"][:T] if arch == "gpt2" else 0)
    for i in range(a("block_count")):
        p, h = f"blk.{i}.", norm(x, f"blk.{i}.attn_norm")
        if p + "attn_qkv.weight" in w:
            q, k, v = lin(h, p + "attn_qkv").split([n_head * hd, n_kv * hd, n_kv * hd], -1)
        else:
            q, k, v = (lin(h, p + n) for n in ("attn_q", "attn_k", "attn_v"))
        q, k, v = q.view(T, n_head, hd), k.view(T, n_kv, hd), v.view(T, n_kv, hd)
        if arch == "qwen3":
            q, k = norm(q, p + "attn_q_norm"), norm(k, p + "attn_k_norm")
        if arch != "gpt2":
            q, k = (rope(t, a("rope.freq_base"), neox=arch == "qwen3") for t in (q, k))
        k, v = (t.repeat_interleave(n_head // n_kv, dim=1) for t in (k, v))
        att = (q.transpose(0, 1) @ k.permute(1, 2, 0)) / hd ** 0.5
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        x = x + lin((att @ v.transpose(0, 1)).transpose(0, 1).reshape(T, -1), p + "attn_output")
        h = norm(x, p + "ffn_norm")
        if arch == "gpt2":
            h = F.gelu(lin(h, p + "ffn_up"), approximate="tanh")
        else:
            h = F.silu(lin(h, p + "ffn_gate")) * lin(h, p + "ffn_up")
        x = x + lin(h, p + "ffn_down")
    return norm(x, "output_norm") @ w.get("output.weight", w["token_embd.weight"]).T


def ours(model, ids, vocab: int) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0, :, :vocab]


@pytest.fixture
def char_tok():
    return CharTokenizer(CHARS)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("ftype", list(TOLERANCE))
def test_every_architecture_and_type_reads_back_with_tinygpts_logits(tmp_path, char_tok, name,
                                                                      ftype):
    settings, arch = MODELS[name]
    # 3 padded vocabulary rows, which the file leaves out
    model = tiny_model(char_tok.vocab_size + 3, **{"n_embd": 64, **settings})
    vocab = gguf_vocab(char_tok, char_tok.to_dict())
    written = write_gguf(model, vocab, tmp_path / "m.gguf", ftype)
    meta, w, types = read_gguf(tmp_path / "m.gguf")
    c, V = model.config, char_tok.vocab_size
    assert written["arch"] == arch == meta["general.architecture"]
    assert (meta[f"{arch}.context_length"], meta[f"{arch}.block_count"]) == (16, 2)
    assert (meta[f"{arch}.attention.head_count_kv"], meta[f"{arch}.vocab_size"]) == (c.kv_heads, V)
    assert meta[f"{arch}.feed_forward_length"] == c.mlp_size
    assert meta["tokenizer.ggml.model"] == "rwkv"
    assert w["token_embd.weight"].shape == (V, c.n_embd)
    assert ("output.weight" in w) == (not c.tie_weights)
    assert ("position_embd.weight" in w) == (arch == "gpt2")
    assert len([n for n in w if n.startswith("blk.1.")]) == len([n for n in w if "blk.0." in n])
    assert {t for n, t in types.items() if n.endswith(("_norm.weight", ".bias"))} <= {"F32"}
    # 64 wide: Q8_0's blocks of 32 fit every row
    assert types["blk.0.ffn_down.weight"] == ftype.upper()
    ids = char_tok.encode("ROMEO:\nWhat light through yonder window breaks?\\\t")[:c.block_size]
    expected, got = ours(model, ids, V), gguf_forward(meta, w, ids)
    relative = (got - expected).abs().max() / expected.abs().max()
    assert relative <= TOLERANCE[ftype], relative


def test_nanogpts_exact_gelu_exports_as_gpt2_the_tanh_forms_distance_away(tmp_path, char_tok):
    model = tiny_model(char_tok.vocab_size, mlp="gelu_exact", n_embd=64)
    write_gguf(model, gguf_vocab(char_tok, char_tok.to_dict()), tmp_path / "m.gguf")
    meta, w, _ = read_gguf(tmp_path / "m.gguf")
    ids = char_tok.encode("To be, or not to")
    expected = ours(model, ids, char_tok.vocab_size)
    diff = (gguf_forward(meta, w, ids) - expected).abs().max()
    assert 0 < diff <= 1e-2 * expected.abs().max()


def rwkv_tokenize(tokens: list[str], text: str) -> list[int]:
    """llama.cpp's rwkv tokenizer: the tokens unescaped, then the longest one matching the next
    bytes."""
    raw = {t.encode().decode("unicode_escape").encode("latin-1") if "\\" in t else t.encode(): i
           for i, t in enumerate(tokens)}
    data, out, at = text.encode(), [], 0
    while at < len(data):
        n = max(n for n in range(1, len(data) - at + 1) if data[at:at + n] in raw)
        out.append(raw[data[at:at + n]])
        at += n
    return out


def test_a_char_vocabulary_is_llama_cpps_rwkv_one_token_a_character(char_tok):
    vocab = gguf_vocab(char_tok, char_tok.to_dict())
    assert vocab["model"] == "rwkv" and vocab["merges"] is None and vocab["eos"] is None
    assert vocab["tokens"][:3] == ["\\t", "\\n", " "] and "\\\\" in vocab["tokens"]
    text = "ROMEO: say 'é', 你\\\tnow?\n\n"
    assert rwkv_tokenize(vocab["tokens"], text) == char_tok.encode(text)
    with pytest.raises(ValueError, match="without a newline"):
        gguf_vocab(CharTokenizer("abc"), {})


# slow: GPT-2's 50,000 merges recovered from tiktoken's ranks take seconds
@pytest.mark.slow
def test_gpt2_bpe_is_llama_cpps_gpt2_model_with_its_merges(cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    vocab = gguf_vocab(tok, tok.to_dict())
    assert (vocab["model"], vocab["pre"]) == ("gpt2", "gpt-2")
    assert (len(vocab["tokens"]), len(vocab["merges"])) == (50257, 50000)
    assert vocab["tokens"][tok.encode(" the")[0]] == "Ġthe" and vocab["merges"][0] == "Ġ t"
    assert vocab["tokens"][50256] == "<|endoftext|>" and vocab["token_types"][50256] == CONTROL
    assert vocab["bos"] == vocab["eos"] == 50256 and vocab["token_types"].count(NORMAL) == 50256


# slow: two BPE trainings take seconds
@pytest.mark.slow
def test_own_and_imported_bpes_keep_their_merges_specials_and_pre_tokenizer(tmp_path):
    from data.bpe import train
    from data.tokenizer import BPETokenizer
    from tests.test_model_hf_llama import hub_tokenizer
    own = train(["the king and the queen speak of love at night 1234"] * 20, 300)
    vocab = gguf_vocab(own, own.to_dict())
    assert vocab["pre"] == "gpt-2"
    assert len(vocab["merges"]) == len(json.loads(own.json)["model"]["merges"])
    assert vocab["tokens"][own.eot_id] == "<|endoftext|>" and vocab["eos"] == own.eot_id
    hub_tokenizer(tmp_path)
    imported = BPETokenizer((tmp_path / "tokenizer.json").read_text())
    d = {**imported.to_dict(), "chat_template": "{% for m in messages %}<|im_start|>{% endfor %}",
         "eos_token": "<|im_end|>", "eot_token": "<|im_end|>"}
    vocab = gguf_vocab(imported, d)
    types = {t: vocab["token_types"][i] for i, t in enumerate(vocab["tokens"]) if t.startswith("<")}
    assert vocab["pre"] == "smollm" and types["<think>"] == USER_DEFINED
    assert types["<|im_start|>"] == types["<|im_end|>"] == types["<|endoftext|>"] == CONTROL
    assert vocab["tokens"][vocab["eos"]] == vocab["tokens"][vocab["eot"]] == "<|im_end|>"
    write_gguf(tiny_model(imported.vocab_size, **MODERN), vocab, tmp_path / "chat.gguf")
    meta, _, _ = read_gguf(tmp_path / "chat.gguf")
    assert meta["tokenizer.chat_template"] == d["chat_template"]
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert meta["tokenizer.ggml.merges"] == vocab["merges"]
    assert meta["tokenizer.ggml.eos_token_id"] == vocab["eos"]
    assert meta["tokenizer.ggml.add_bos_token"] is False


def test_pre_tokenizers_llama_cpp_knows_and_one_it_does_not():
    regex = next(r for r, name in SPLIT_REGEXES.items() if name == "qwen2")
    qwen = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {"Regex": regex}},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    assert pre_tokenizer(qwen) == "qwen2"
    assert pre_tokenizer({"type": "ByteLevel", "add_prefix_space": False}) == "gpt-2"
    with pytest.raises(ValueError, match="pre_tokenizer=.*Metaspace"):
        pre_tokenizer({"type": "Metaspace", "replacement": "▁"})


@pytest.mark.parametrize("kw,setting", [
    (dict(mlp="relu2"), "mlp='relu2'"), (dict(logit_softcap=15.0), "softcap"),
    (dict(position="rope", norm="layernorm", mlp="swiglu"), "norm='layernorm'"),
    (dict(head_dim=16), "head_dim=16")])
def test_settings_llama_cpp_lacks_are_refused_in_one_line_and_nothing_is_written(
        tmp_path, capsys, char_tok, kw, setting):
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size, **kw), char_tok)
    code = export.main(["--gguf", str(tmp_path / "m.gguf"), "--run", str(tmp_path / "run")])
    assert code == 2
    # (the line before it on stderr: "using <checkpoint>")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: ") and setting in line and "GGUF" in line
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".gguf", ".tmp", ".Modelfile"))]


def test_the_cli_writes_the_file_and_an_ollama_modelfile(tmp_path, capsys, char_tok):
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size + 2, **MODERN), char_tok)
    out, run = tmp_path / "out" / "shakespeare.gguf", str(tmp_path / "run")
    assert export.main(["--gguf", str(out), "--run", run, "--gguf-type", "q8_0"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "llama" in printed and "shakespeare.Modelfile" in printed
    modelfile = (tmp_path / "out" / "shakespeare.Modelfile").read_text()
    assert "FROM ./shakespeare.gguf\n" in modelfile and 'TEMPLATE """{{ .Prompt }}"""' in modelfile
    assert "PARAMETER num_ctx 16" in modelfile and "PARAMETER temperature 1\n" in modelfile
    # a char vocabulary has no end token: nothing to stop at
    assert "PARAMETER repeat_penalty 1" in modelfile and "stop" not in modelfile
    meta, _, _ = read_gguf(out)
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert meta["general.sampling.temp"] == 1.0
    assert sorted(p.name for p in out.parent.iterdir()) == ["shakespeare.Modelfile",
                                                            "shakespeare.gguf"]
    assert export.main(["--gguf", str(out), "--run", run]) == 2
    assert "--force" in capsys.readouterr().err
    assert export.main(["--gguf", str(out), "--run", run, "--force"]) == 0
    (tmp_path / "notes.txt").write_text("mine")
    assert export.main(["--gguf", str(tmp_path / "notes.txt"), "--run", run, "--force"]) == 2
    assert "not a GGUF file" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_chatml_run_gets_ollamas_chatml_template_and_its_stop_tokens():
    import sample
    from checkpoint.to_gguf import MAX_NEW_TOKENS, modelfile, sampling_defaults
    assert sample.parse_args([]).max_new_tokens == MAX_NEW_TOKENS
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}")
    vocab = {"tokens": ["a", "<|im_end|>", "<|endoftext|>"], "eos": 2, "eot": 1,
             "chat_template": chatml}
    text = modelfile("chat.gguf", vocab, 2048, sampling_defaults())
    assert "<|im_start|>{{ .Role }}" in text and 'PARAMETER stop "<|im_end|>"' in text
    assert 'PARAMETER stop "<|endoftext|>"' in text and "PARAMETER num_predict 500" in text
    other = modelfile("x.gguf", {**vocab, "chat_template": "[INST] {{ m }}"}, 64,
                      sampling_defaults())
    assert "\nTEMPLATE" not in other and "# TEMPLATE" in other


def test_a_nanogpt_run_exports_as_gpt2_with_a_note(tmp_path, capsys, monkeypatch):
    shutil.copytree(REPO / "tests/fixtures/nanogpt", tmp_path / "nanoGPT",
                    ignore=shutil.ignore_patterns("*.json", "*.md", "*.sh", "*.py"))
    # nanoGPT's meta.pkl is found from the working directory: data/shakespeare_char/
    monkeypatch.chdir(tmp_path / "nanoGPT")
    run = tmp_path / "nanoGPT" / "out-bias"
    assert export.main(["--gguf", str(tmp_path / "n.gguf"), "--run", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "gpt2" in printed and "tanh" in printed
    meta, _, _ = read_gguf(tmp_path / "n.gguf")
    assert meta["general.architecture"] == "gpt2" and len(meta["tokenizer.ggml.tokens"]) == 65


def test_without_the_gguf_package_one_line_names_the_pip_command(tmp_path, capsys, char_tok,
                                                                 monkeypatch):
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size), char_tok)
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert export.main(["--gguf", str(tmp_path / "m.gguf"), "--run", str(tmp_path / "run")]) == 2
    assert "pip install gguf" in capsys.readouterr().err


def test_a_position_scheme_the_table_cannot_write_to_gguf_is_refused_in_one_line():
    """model/positions.py decides: ALiBi has no GGUF family, so it is refused before any tensor."""
    from model.config import GPTConfig
    from model.gguf import gguf_arch
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=32,
                       position="alibi", norm="rmsnorm", mlp="swiglu", bias=False)
    with pytest.raises(ValueError, match=r"^model\.position=alibi cannot be exported to GGUF: ") as e:
        gguf_arch(config)
    assert "\n" not in str(e.value)


def chat_char_tokenizer():
    """A character vocabulary with tinygpt's own chat template (data/chat_template.py)."""
    from data.chat_template import with_chat
    from data.tokenizer import tokenizer_from_dict
    return tokenizer_from_dict(with_chat(CharTokenizer(CHARS).to_dict()))


def test_a_chat_run_writes_its_template_special_tokens_and_end_of_turn(tmp_path):
    """A run fine-tuned on conversations: its four chat tokens after the characters, control
    tokens; the template; <|end|> as the end of turn; the Modelfile's template and stop."""
    from checkpoint.to_gguf import export_gguf
    from data.chat_template import SPECIAL, TEMPLATE
    tok = chat_char_tokenizer()
    save_run(tmp_path / "run", tiny_model(tok.vocab_size), tok)
    export_gguf(tmp_path / "run" / "best.pt", tmp_path / "m.gguf", "f32")
    meta, _, _ = read_gguf(tmp_path / "m.gguf")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == tok.vocab_size and tokens[-4:] == list(SPECIAL)
    assert all(t == CONTROL for t in types[-4:]) and meta["tokenizer.chat_template"] == TEMPLATE
    assert tokens[meta["tokenizer.ggml.eot_token_id"]] == "<|end|>"
    modelfile = (tmp_path / "m.Modelfile").read_text()
    assert "<|{{ .Role }}|>{{ .Content }}<|end|>" in modelfile
    assert 'PARAMETER stop "<|end|>"' in modelfile
