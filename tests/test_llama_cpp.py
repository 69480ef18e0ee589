"""llama.cpp itself (through llama-cpp-python) runs export.py --gguf's files: for each kind of model and tokenizer
tinygpt trains or imports, llama.cpp tokenizes text into tinygpt's ids, its logits match tinygpt's (f32: within
1e-3; llama.cpp's gpt2 computes GELU through an fp16 table, so its bound is wider, see LOGITS) and its greedy tokens
are sample.py's for 64 tokens. Skipped where llama-cpp-python is not installed (a source build of ~15 minutes:
.ci/run installs it; the README's test command does not need it)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from data.gguf_vocab import gguf_vocab
from data.tokenizer import CharTokenizer
from model.generate import Sampling, generate
from model.gguf import write_gguf
from tests.helpers import tiny_model

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (a ~15-minute source build: "
                                "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install llama-cpp-python)")
pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\\\té你"
CHAR_TEXT = "ROMEO:\nWhat light through yonder  window breaks?\n\n\tsay 'é' \\ 你.\n"
BPE_TEXT = "ROMEO:\nWhat light through yonder window breaks? 1234 naïve café  \n\n  end<|endoftext|>x"
MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu")
SHAPE = dict(block_size=128, n_layer=2, n_head=4, n_embd=64)
# f32 logits, max |llama.cpp - tinygpt|: 1e-3 (the issue's bound); gpt2's GELU goes through an fp16 table in ggml
LOGITS = {"gpt2": 2e-2, "llama": 1e-3, "qwen3": 1e-3}
N_NEW = 64


def load(path, n_ctx: int = 128):
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=1,
                           verbose=False)


def check_runs(path, model, tokenizer, text: str, arch: str) -> dict:
    """llama.cpp's ids for `text`, its logits and its 64 greedy tokens against tinygpt's; the logits' max diff."""
    llm = load(path, model.config.block_size)
    ids = tokenizer.encode(text)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    assert llm.n_vocab() == tokenizer.vocab_size
    prompt = ids[:32]
    llm.reset()
    llm.eval(prompt)
    theirs = np.asarray(llm.scores[:len(prompt)])
    with torch.no_grad():
        ours = model(torch.tensor([prompt]))[0][0, :, :tokenizer.vocab_size].numpy()
    diff = float(np.abs(theirs - ours).max())
    assert diff <= LOGITS[arch], diff
    greedy = list(itertools.islice(llm.generate(prompt, temp=0.0, repeat_penalty=1.0), N_NEW))
    expected = generate(model, torch.tensor([prompt]), N_NEW, Sampling(0.0, vocab_limit=tokenizer.vocab_size))
    assert greedy == expected[0, len(prompt):].tolist()
    return {"diff": diff, "llm": llm}


@pytest.fixture(scope="module")
def char_tok():
    return CharTokenizer(CHARS)


@pytest.mark.slow
@pytest.mark.parametrize("settings,arch", [
    (dict(), "gpt2"), (dict(bias=False, tie_weights=False, n_kv_head=2), "gpt2"),
    (dict(MODERN, n_kv_head=2, head_dim=32, bias=True, tie_weights=False), "llama"),
    (dict(MODERN, n_kv_head=1, bias=False), "llama"),
    (dict(MODERN, n_kv_head=2, qk_norm=True, bias=False, rope_theta=5000.0), "qwen3")],
    ids=["gpt2", "gpt2_gqa_nobias_untied", "llama_gqa_headdim_bias", "llama_mqa", "qwen3"])
def test_char_models_of_every_architecture_run_in_llama_cpp(tmp_path, char_tok, settings, arch):
    model = tiny_model(char_tok.vocab_size + 3, **{**SHAPE, **settings})
    write_gguf(model, gguf_vocab(char_tok, char_tok.to_dict()), tmp_path / "m.gguf")
    llm = check_runs(tmp_path / "m.gguf", model, char_tok, CHAR_TEXT, arch)["llm"]
    assert llm.detokenize(char_tok.encode(CHAR_TEXT)).decode() == CHAR_TEXT
    assert llm.token_eos() == -1  # a char vocabulary has no end-of-text token: llama.cpp never stops by itself


@pytest.mark.slow
def test_gpt2_bpe_runs_in_llama_cpp(tmp_path, cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    model = tiny_model(50304, **{**SHAPE, "n_embd": 32, "n_head": 2})  # GPT-2's padded vocabulary
    write_gguf(model, gguf_vocab(tok, tok.to_dict()), tmp_path / "m.gguf")
    llm = check_runs(tmp_path / "m.gguf", model, tok, BPE_TEXT, "gpt2")["llm"]
    assert llm.token_eos() == llm.token_bos() == 50256


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["own_llama", "imported_qwen3"])
def test_byte_level_bpes_run_in_llama_cpp_with_their_specials_and_chat_template(tmp_path, kind):
    from data.bpe import train
    from data.tokenizer import BPETokenizer
    from tests.test_model_hf_llama import hub_tokenizer
    if kind == "own_llama":
        tok, settings, arch = train([BPE_TEXT * 3, "the king and the queen speak of love"] * 10, 400), MODERN, "llama"
        d = tok.to_dict()
    else:
        hub_tokenizer(tmp_path)
        tok, arch = BPETokenizer((tmp_path / "tokenizer.json").read_text()), "qwen3"
        settings = dict(MODERN, qk_norm=True, bias=False, n_kv_head=2)
        d = {**tok.to_dict(), "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                               "<|im_end|>\n{% endfor %}", "eos_token": "<|im_end|>"}
    model = tiny_model(tok.vocab_size, **{**SHAPE, **settings})
    write_gguf(model, gguf_vocab(tok, d), tmp_path / "m.gguf")
    text = BPE_TEXT + ("<|im_start|>user 42<|im_end|><think>" if kind != "own_llama" else "")
    llm = check_runs(tmp_path / "m.gguf", model, tok, text, arch)["llm"]
    if "chat_template" in d:
        assert llm.metadata["tokenizer.chat_template"] == d["chat_template"]
        assert llm.detokenize([llm.token_eos()], special=True) == b"<|im_end|>"


@pytest.mark.slow
def test_a_nanogpt_run_runs_in_llama_cpp(tmp_path, monkeypatch):
    """nanoGPT's exact GELU against llama.cpp's gpt2 (tanh, through an fp16 table): the same greedy tokens."""
    import shutil

    from checkpoint.file import load_model
    from checkpoint.to_gguf import export_gguf
    from tests.helpers import REPO
    shutil.copytree(REPO / "tests/fixtures/nanogpt", tmp_path / "nanoGPT")
    monkeypatch.chdir(tmp_path / "nanoGPT")
    written = export_gguf(tmp_path / "nanoGPT/out-bias/ckpt.pt", tmp_path / "n.gguf")
    assert written["arch"] == "gpt2" and written["gelu_note"]
    model, tok = load_model(tmp_path / "nanoGPT/out-bias/ckpt.pt")
    llm = load(tmp_path / "n.gguf", model.config.block_size)
    text = "ROMEO:\nWhat light?"[:model.config.block_size]
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text)
