"""Every kind of export (char, GPT-2 BPE, tinygpt's own BPE, an imported Llama/Qwen3, nanoGPT runs)
loads with `AutoTokenizer.from_pretrained(dir)` and `AutoModelForCausalLM.from_pretrained(dir)` from
the directory alone: the tokenizer encodes a text to tinygpt's ids and decodes them back exactly,
and greedy `generate` gives tinygpt's greedy tokens and sample.py's text."""
from __future__ import annotations

import pytest
import torch

import export
import sample
from tests.helpers import save_run, tiny_model

transformers = pytest.importorskip("transformers", reason="transformers (test-only): not installed")

# transformers' generate has no sliding window: the prompt and the new tokens within the context
CONTEXT, NEW = 32, 20
MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu", n_head=4, n_kv_head=2, n_embd=32,
              bias=False)
BPE_TEXT = ("ROMEO:\nWhat light through  yonder window breaks? 1234 naïve café 你好 😀\r\n\tend "
            "<|endoftext|>x")


def char_run(run, corpus, **settings):
    """A char run on the tiny corpus, its vocabulary padded by 3 rows (model.pad_vocab_to)."""
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(corpus.read_text(encoding="utf-8"))
    save_run(run, tiny_model(tok.vocab_size + 3, block_size=CONTEXT, **settings), tok)
    text = corpus.read_text(encoding="utf-8")
    return tok, text[:8] + "  \n\n " + text[8:300]  # (runs of spaces and newlines too)


def gpt2_run(run, corpus):
    from data.tokenizer import GPT2Tokenizer
    save_run(run, tiny_model(50257 + 47, n_embd=8, block_size=CONTEXT), GPT2Tokenizer())
    return GPT2Tokenizer(), BPE_TEXT


def own_bpe_run(run, corpus):
    from data import bpe
    tok = bpe.train([corpus.read_text(encoding="utf-8")], 300)
    save_run(run, tiny_model(tok.vocab_size, block_size=CONTEXT, **MODERN, tie_weights=False), tok)
    return tok, BPE_TEXT


def imported_run(run, corpus, kind):
    """A Hub-like Llama or Qwen3 directory read by tinygpt (as sample.py --init and fine-tuning read
    it), saved as a run: its tokenizer is the directory's tokenizer.json."""
    from data.hf_tokenizer import read_hf_tokenizer
    from model.gpt import GPT
    from tests.test_model_hf_llama import TEXT, hub_dir
    d, _ = hub_dir(run.parent / "hub", kind, max_position_embeddings=CONTEXT)
    tok = read_hf_tokenizer(d)
    save_run(run, GPT.from_pretrained(d), tok)
    return tok, TEXT


def nanogpt_run(run, corpus, vocab: str):
    """nanoGPT's out_dir: ckpt.pt (exact GELU) with a char meta.pkl, or none (GPT-2 BPE)."""
    from data.tokenizer import GPT2Tokenizer, CharTokenizer
    from tests.test_checkpoint_nanogpt import CHARS, char_meta, write_nanogpt_run
    if vocab == "char":
        write_nanogpt_run(run, block_size=CONTEXT, meta=char_meta())
        return CharTokenizer(CHARS), "ROMEO:\nWhat say you, my lord?  3 $&'-\n\nJULIET: ay!"
    write_nanogpt_run(run, vocab_size=50304, n_embd=4, n_head=1, block_size=CONTEXT,
                      dataset="openwebtext")
    return GPT2Tokenizer(), BPE_TEXT


KINDS = {
    "char": lambda run, corpus: char_run(run, corpus),
    "char-qwen3": lambda run, corpus: char_run(run, corpus, **MODERN, qk_norm=True),
    "gpt2": gpt2_run,
    "own-bpe": own_bpe_run,
    "llama": lambda run, corpus: imported_run(run, corpus, "llama"),
    "qwen3": lambda run, corpus: imported_run(run, corpus, "qwen3"),
    "nanogpt-char": lambda run, corpus: nanogpt_run(run, corpus, "char"),
    "nanogpt-gpt2": lambda run, corpus: nanogpt_run(run, corpus, "gpt2"),
}
GPT2_VOCAB = ("gpt2", "nanogpt-gpt2")  # slow: GPT-2's 50,000 merges are rebuilt


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in GPT2_VOCAB else k
                                  for k in KINDS])
def test_auto_classes_load_every_export(kind, tmp_path, tiny_corpus, capsys, request,
                                        monkeypatch):
    if kind in GPT2_VOCAB:
        request.getfixturevalue("cache_with_gpt2")
    monkeypatch.chdir(tmp_path)  # (nanoGPT's meta.pkl: beside ckpt.pt, then in the working dir)
    run, out = tmp_path / "run", tmp_path / "hf"
    tok, text = KINDS[kind](run, tiny_corpus)
    assert export.main(["--hf", str(out), "--run", str(run)]) == 0
    assert "AutoTokenizer.from_pretrained(d)" in capsys.readouterr().out

    # the tokenizer, from the directory alone: tinygpt's ids, and back to the very text
    auto = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok.encode(text)
    assert auto.encode(text) == ids and auto.decode(ids) == text
    assert len(auto) == tok.vocab_size

    # greedy: transformers' tokens are tinygpt's, and the text is sample.py's
    prompt = text[:8]
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    enc = auto(prompt, return_tensors="pt")
    assert enc.input_ids[0].tolist() == tok.encode(prompt)
    with torch.no_grad():
        got = model.generate(**enc, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0]
    assert sample.main(["--run", str(run), "--prompt", prompt, "--max-new-tokens", str(NEW),
                        "--temperature", "0", "--device", "cpu", "--no-stream"]) == 0
    printed = capsys.readouterr().out
    assert printed in (auto.decode(got), auto.decode(got) + "\n")
    from checkpoint.file import load_model
    from model.generate import Sampling, generate
    ours = load_model(run / ("ckpt.pt" if kind.startswith("nanogpt") else "best.pt"))[0]
    greedy = Sampling(0, vocab_limit=tok.vocab_size)
    want = generate(ours, torch.tensor([tok.encode(prompt)]), NEW, greedy)[0]
    assert got.tolist() == want.tolist()
