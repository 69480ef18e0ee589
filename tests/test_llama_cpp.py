"""llama.cpp itself (through llama-cpp-python) runs export.py --gguf's files: for each kind of model
and tokenizer tinygpt trains or imports, llama.cpp tokenizes text into tinygpt's ids, its logits
match tinygpt's (f32: within 1e-3; llama.cpp's gpt2 computes GELU through an fp16 table, so its
bound is LOGITS') and its greedy tokens are sample.py's for 64 tokens. Skipped where
llama-cpp-python is not installed (a source build of ~15 minutes, which .ci/run makes; the README's
test command does not need it)."""
from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
import torch

from data.gguf_vocab import gguf_vocab
from data.tokenizer import CharTokenizer
from model.generate import Sampling, generate
from model.gguf import write_gguf
from tests.helpers import REPO, tiny_model

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (a "
                                "15-minute source build: CMAKE_ARGS=-DGGML_NATIVE=OFF pip install "
                                "llama-cpp-python)")
pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")

CHARS = "\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\\\té你"
CHAR_TEXT = "ROMEO:\nWhat light through yonder  window breaks?\n\n\tsay 'é' \\ 你.\n"
BPE_TEXT = "ROMEO:\nWhat light through yonder window breaks? 1234 naïve café \n\n  end<|endoftext|>"
# texts where pre-tokenizers differ: contractions, digit runs, runs of spaces before a word or at
# the end, \r\n, 4-byte characters, special tokens inside words
TRICKY = ["Don't  stop! I'M here, they'll SEE 1234567 numbers... \r\n\t😀 naïve —  end   ",
          "a<|endoftext|>b  <|endoftext|>\n\n\n   x\u00a0y 你好 ١٢٣ ǅ ﬁ", " ", "\n \n", "''s 's"]
MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu")
SHAPE = dict(block_size=128, n_layer=2, n_head=4, n_embd=64)
# f32 logits, max |llama.cpp - tinygpt|: the 1e-3 (measured: 1e-5); llama.cpp's gpt2
# computes GELU through an fp16 table (measured: 2-3e-3; 5e-4 with its rounding done in tinygpt)
LOGITS = {"gpt2": 5e-3, "llama": 1e-3, "qwen3": 1e-3}
N_NEW = 64


def load(path, n_ctx: int):
    """The file in llama.cpp, its key/value cache in f32 (llama.cpp's default, f16, rounds k and v:
    logits ~1e-2 away at these weights' scale)."""
    f32 = llama_cpp.GGML_TYPE_F32
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True,
                           n_threads=1, type_k=f32, type_v=f32, verbose=False)


def check_runs(path, model, tokenizer, text: str, bound: float, n_new: int = N_NEW):
    """llama.cpp's ids for `text` (and, byte-level BPEs, TRICKY's), its logits and its greedy tokens
    against tinygpt's; the Llama."""
    llm = load(path, model.config.block_size)
    for other in [text] + (TRICKY if tokenizer.eot_id is not None else []):
        expected = tokenizer.encode(other)
        assert llm.tokenize(other.encode(), add_bos=False, special=True) == expected, other
    ids = tokenizer.encode(text)
    assert llm.n_vocab() == tokenizer.vocab_size
    prompt = ids[:model.config.block_size - n_new]
    llm.eval(prompt)
    theirs = np.asarray(llm.scores[:len(prompt)])
    with torch.no_grad():
        ours = model(torch.tensor([prompt]))[0][0, :, :tokenizer.vocab_size].numpy()
    diff = float(np.abs(theirs - ours).max())
    print(f"{path}: f32 logits max |llama.cpp - tinygpt| {diff:.1e} (max |logit| "
          f"{np.abs(ours).max():.1f})")
    assert diff <= bound, diff
    greedy = list(itertools.islice(llm.generate(prompt, temp=0.0, repeat_penalty=1.0), n_new))
    sampling = Sampling(0.0, vocab_limit=tokenizer.vocab_size)
    expected = generate(model, torch.tensor([prompt]), n_new, sampling)[0, len(prompt):]
    assert greedy == expected.tolist()
    return llm


@pytest.fixture
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
    llm = check_runs(tmp_path / "m.gguf", model, char_tok, CHAR_TEXT, LOGITS[arch])
    assert llm.detokenize(char_tok.encode(CHAR_TEXT)).decode() == CHAR_TEXT
    # a char vocabulary has no end-of-text token: llama.cpp never stops by itself
    assert llm.token_eos() == -1


@pytest.mark.slow
def test_gpt2_bpe_runs_in_llama_cpp(tmp_path, cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    # GPT-2's vocabulary padded to 50304 rows, as train.py pads it
    model = tiny_model(50304, **{**SHAPE, "n_embd": 32, "n_head": 2})
    write_gguf(model, gguf_vocab(tok, tok.to_dict()), tmp_path / "m.gguf")
    llm = check_runs(tmp_path / "m.gguf", model, tok, BPE_TEXT, LOGITS["gpt2"])
    assert llm.token_eos() == llm.token_bos() == 50256


def qwen_tokenizer(path):
    """A tokenizer.json cut as Qwen2/3's is (their Split regex, NFC), trained on a few texts."""
    import tokenizers as tk

    from data.gguf_vocab import SPLIT_REGEXES
    from data.tokenizer import BPETokenizer
    regex = next(r for r, name in SPLIT_REGEXES.items() if name == "qwen2")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(regex), behavior="isolated"),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train_from_iterator([BPE_TEXT, *TRICKY, "the king and the queen speak of love"] * 10,
                            trainer=trainer)
    return BPETokenizer(tok.to_str())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["own_llama", "imported_qwen3_chat", "qwen_pre"])
def test_byte_level_bpes_run_in_llama_cpp_with_their_specials_and_template(tmp_path, kind):
    from data.bpe import train
    from data.tokenizer import BPETokenizer
    from tests.test_model_hf_llama import hub_tokenizer
    text, d = BPE_TEXT, None
    if kind == "own_llama":
        tok, settings = train([BPE_TEXT * 3, "the king and the queen speak of love"] * 10, 400), \
            MODERN
    elif kind == "qwen_pre":
        tok, settings = qwen_tokenizer(tmp_path), MODERN
    else:
        hub_tokenizer(tmp_path)
        tok = BPETokenizer((tmp_path / "tokenizer.json").read_text())
        settings = dict(MODERN, qk_norm=True, bias=False, n_kv_head=2)
        template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                    "{% endfor %}")
        d = {**tok.to_dict(), "chat_template": template, "eos_token": "<|im_end|>"}
        text += "<|im_start|>user 42<|im_end|><think>"
    model = tiny_model(tok.vocab_size, **{**SHAPE, **settings})
    write_gguf(model, gguf_vocab(tok, d or tok.to_dict()), tmp_path / "m.gguf")
    llm = check_runs(tmp_path / "m.gguf", model, tok, text, LOGITS["llama"])
    if d is not None:
        assert llm.metadata["tokenizer.chat_template"] == d["chat_template"]
        assert llm.detokenize([llm.token_eos()], special=True) == b"<|im_end|>"


@pytest.mark.slow
def test_a_nanogpt_run_runs_in_llama_cpp(tmp_path, monkeypatch):
    """nanoGPT's exact GELU in llama.cpp's gpt2 (tanh, through an fp16 table): close logits, and
    the same greedy tokens."""
    from checkpoint.file import load_model
    from checkpoint.to_gguf import export_gguf
    shutil.copytree(REPO / "tests/fixtures/nanogpt", tmp_path / "nanoGPT")
    monkeypatch.chdir(tmp_path / "nanoGPT")
    ckpt = tmp_path / "nanoGPT/out-bias/ckpt.pt"
    assert export_gguf(ckpt, tmp_path / "n.gguf")["gelu_note"]
    model, tok = load_model(ckpt)
    check_runs(tmp_path / "n.gguf", model, tok, "ROMEO:\nWhat light?", LOGITS["gpt2"], n_new=16)


@pytest.mark.slow
def test_the_docs_llama_cpp_python_snippet_prints_what_sample_py_prints(tmp_path, capsys,
                                                                        monkeypatch, char_tok):
    """docs/export_eval.md's llama-cpp-python lines, run as written on a char run's export (the CPU
    preset's context, 64), print sample.py's greedy text."""
    import re
    import shlex

    import export
    import sample
    from tests.helpers import save_run
    monkeypatch.chdir(tmp_path)
    save_run("run", tiny_model(char_tok.vocab_size, block_size=64, n_embd=64), char_tok)
    assert export.main(["--gguf", "exported/shakespeare.gguf", "--run", "run"]) == 0
    page = (REPO / "docs" / "export_eval.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "llama_cpp" in b]
    capsys.readouterr()
    exec(compile(block, "export_eval.md", "exec"), {})
    printed = capsys.readouterr().out
    same = "# = python sample.py "
    [command] = [line.split(same)[1] for line in block.splitlines() if line.startswith(same)]
    args = shlex.split(command)
    args[args.index("--run") + 1] = "run"
    assert sample.main(args) == 0
    assert printed == capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_an_imported_hugging_face_model_runs_in_llama_cpp_with_its_chat_template(tmp_path, kind):
    """A Llama or Qwen3 from Hugging Face (random, transformers' own), read by tinygpt and saved as
    a checkpoint whose tokenizer carries a chat template, exported as export.py does: llama.cpp's
    ids, logits and greedy tokens are tinygpt's; the template and end of turn are in the file."""
    from checkpoint.file import load_model
    from checkpoint.to_gguf import export_gguf
    from data.hf_tokenizer import read_hf_tokenizer
    from model.gpt import GPT
    from tests.helpers import save_run
    from tests.test_model_hf_llama import hub_dir
    hub_dir(tmp_path / "hub", kind, max_position_embeddings=128)
    model, tok = GPT.from_pretrained(tmp_path / "hub"), read_hf_tokenizer(tmp_path / "hub")
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}")

    class ChatTokenizer:
        def to_dict(self):
            return {**tok.to_dict(), "chat_template": template, "eos_token": "<|im_end|>"}
    save_run(tmp_path / "run", model, ChatTokenizer())
    written = export_gguf(tmp_path / "run" / "best.pt", tmp_path / "m.gguf", "f32")
    assert written["arch"] == kind
    model, tok = load_model(tmp_path / "run" / "best.pt")
    llm = check_runs(tmp_path / "m.gguf", model, tok, BPE_TEXT + "<|im_start|>user<|im_end|>",
                     LOGITS[kind])
    assert llm.metadata["tokenizer.chat_template"] == template
    assert llm.detokenize([llm.token_eos()], special=True) == b"<|im_end|>"
    assert 'PARAMETER stop "<|im_end|>"' in (tmp_path / "m.Modelfile").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("settings,arch", [(dict(), "gpt2"), (dict(MODERN, bias=False), "llama")])
def test_a_chat_run_runs_in_llama_cpp_with_its_template_and_end_of_turn(tmp_path, settings, arch):
    """A run fine-tuned on conversations (tinygpt's own template over characters): llama.cpp reads
    a rendered conversation, special tokens and all, as tinygpt's ids, computes its logits and
    greedy tokens, and stops at <|end|>."""
    from checkpoint.to_gguf import export_gguf
    from checkpoint.file import load_model
    from data.chat_template import ChatFormat
    from tests.helpers import save_run
    from tests.test_export_gguf import chat_char_tokenizer
    tok = chat_char_tokenizer()
    save_run(tmp_path / "run", tiny_model(tok.vocab_size, **{**SHAPE, **settings}), tok)
    assert export_gguf(tmp_path / "run" / "best.pt", tmp_path / "m.gguf", "f32")["arch"] == arch
    model, tok = load_model(tmp_path / "run" / "best.pt")
    conversation = [{"role": "system", "content": "Be terse."},
                    {"role": "user", "content": "ROMEO: say 'hi'"}]
    text = ChatFormat(tok).render(conversation, add_generation_prompt=True)
    llm = check_runs(tmp_path / "m.gguf", model, tok, text, LOGITS[arch])
    end = tok.special_ids["<|end|>"]
    assert int(llm.metadata["tokenizer.ggml.eot_token_id"]) == end
    assert llm.metadata["tokenizer.chat_template"] == tok.chat["template"]
