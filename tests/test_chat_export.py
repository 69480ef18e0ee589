"""Exports keep the chat template: tokenizer_config.json carries `chat_template`, and transformers'
`apply_chat_template` gives the ids tinygpt's template gives (GPT-2 BPE and the own BPE); reading
the export back gives the chat tokenizer it came from (char too)."""
from __future__ import annotations

import json

import pytest

from data.chat_template import ChatFormat, with_chat
from data.hf_tokenizer import read_hf_tokenizer, write_tokenizer_files
from data.tokenizer import CharTokenizer, tokenizer_from_dict

CONV = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Spell cat, please."},
        {"role": "assistant", "content": "c-a-t"}, {"role": "user", "content": "And dog?"}]


def _bases(tmp_path):
    from data import bpe
    text = "Spell cat, please. And dog? Be brief. c-a-t " * 20
    yield {"type": "gpt2"}
    yield bpe.train([text], 300).to_dict()


@pytest.mark.slow  # transformers' import (~5 s)
def test_apply_chat_template_gives_tinygpt_s_ids(tmp_path, cache_with_gpt2):
    from transformers import AutoTokenizer
    for i, base in enumerate(_bases(tmp_path)):
        tok = tokenizer_from_dict(with_chat(base))
        out = tmp_path / f"export{i}"
        write_tokenizer_files(tok, out, model_max_length=64)
        config = json.loads((out / "tokenizer_config.json").read_text())
        assert config["chat_template"] == tok.chat["template"]
        hf = AutoTokenizer.from_pretrained(out)
        for messages, gen in ((CONV, True), (CONV[:3], False)):
            ours = ChatFormat(tok).encode(messages, add_generation_prompt=gen)[0]
            theirs = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
            theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
            assert list(theirs) == ours, base["type"]
        assert read_hf_tokenizer(out).to_dict() == tok.to_dict()


def test_a_char_export_reads_back_with_its_template(tmp_path):
    tok = tokenizer_from_dict(with_chat(CharTokenizer("abc .").to_dict()))
    write_tokenizer_files(tok, tmp_path, model_max_length=64)
    back = read_hf_tokenizer(tmp_path)
    assert back.to_dict() == tok.to_dict() and ChatFormat(back).stop_ids == ChatFormat(tok).stop_ids


def test_an_imported_template_is_kept_with_its_own_tokens(tmp_path):
    from data import bpe
    base = bpe.train(["hello there " * 50], 300)
    spec = json.loads(base.json)
    n = base.vocab_size
    spec["added_tokens"] += [{"id": n + i, "content": t, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}
                             for i, t in enumerate(["<|im_start|>", "<|im_end|>"])]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    chatml = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
              "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
              "'<|im_start|>assistant\\n' }}{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": chatml,
                                                                "eos_token": "<|im_end|>"}))
    tok = read_hf_tokenizer(tmp_path)
    assert tok.vocab_size == n + 2 and tok.special == []  # no tokens added: the model's own
    fmt = ChatFormat(tok)
    ids, mask = fmt.encode([{"role": "user", "content": "hello"},
                            {"role": "assistant", "content": "there"}])
    assert fmt.stop_ids == [n + 1]
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "there<|im_end|>\n"
    assert with_chat(tok.to_dict()) == tok.to_dict()
