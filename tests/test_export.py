"""export.py: every kind of model tinygpt trains loads into transformers' GPT2LMHeadModel with no missing or
unexpected weights and the same logits; bad input is one error line and leaves nothing half-written."""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex

import pytest
import torch

import export
import sample
from tests.helpers import REPO, run_cli
from tests.helpers import assert_one_error, save_run, tiny_model
from tests.test_model_hf import load_hf, transformers


CHAR_EXPORT = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture
def char_tok(tiny_corpus):
    from data.tokenizer import CharTokenizer
    return CharTokenizer(tiny_corpus.read_text())


def export_ok(capsys, *args) -> str:
    code = export.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def assert_same_logits(ours, hf, vocab_size: int) -> None:
    idx = torch.randint(0, vocab_size, (2, ours.config.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (ours(idx)[0][..., :vocab_size] - hf(idx).logits).abs().max()
    assert diff <= 1e-5, diff


@pytest.mark.parametrize("kind", ["default", "bias_free", "untied", "fsdp"])
def test_export_char_run(tmp_path, capsys, char_tok, kind):
    kw = {"bias_free": dict(bias=False), "untied": dict(tie_weights=False)}.get(kind, {})
    model = tiny_model(char_tok.vocab_size + 3, **kw)  # 3 padded vocabulary rows (model.pad_vocab_to)
    save_run(tmp_path / "run", model, char_tok, name="last.pt", fsdp=kind == "fsdp")
    out = export_ok(capsys, "--hf", tmp_path / "hf", "--run", tmp_path / "run")
    wrote = f"wrote {tmp_path / 'hf'}: config.json, model.safetensors, tokenizer.json"
    assert wrote in out and "3 padded" in out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == CHAR_EXPORT
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert os.name == "nt" or modes == {0o666 & ~umask}  # model.safetensors was 0600: unreadable when shared
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").get_vocab() == char_tok.stoi
    hf = load_hf(tmp_path / "hf")
    assert hf.config.vocab_size == char_tok.vocab_size and hf.config.n_positions == 16
    assert_same_logits(model, hf, char_tok.vocab_size)
    assert not list(tmp_path.glob(".hf.*"))  # the temp dir became hf


@pytest.mark.slow  # over ~1 s
def test_export_bpe_run_with_padded_vocab(tmp_path, capsys, cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    from model.config import pad_vocab
    tok = GPT2Tokenizer()
    model = tiny_model(pad_vocab(tok.vocab_size, 64), n_embd=8)  # 50304 rows, as the gpt2 preset trains
    path = save_run(tmp_path, model, tok)
    out = export_ok(capsys, "--hf", tmp_path / "hf", "--checkpoint", path)
    assert "47 padded vocabulary rows dropped" in out and "AutoTokenizer" in out
    assert {p.name for p in (tmp_path / "hf").iterdir()} <= export.EXPORT_FILES  # --force recognises them
    hf = load_hf(tmp_path / "hf")
    assert (hf.config.vocab_size, hf.config.eos_token_id) == (50257, 50256)
    assert_same_logits(model, hf, tok.vocab_size)
    text = "ROMEO:\nWhat light through yonder window breaks? 1234 naïve café<|endoftext|>"
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok.encode(text) == tok.encode(text) and hf_tok.model_max_length == 16


MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu", n_head=4, n_kv_head=2, n_embd=32, bias=False)


@pytest.mark.parametrize("qk_norm,cls", [(False, "LlamaForCausalLM"), (True, "Qwen3ForCausalLM")])
def test_export_modern_own_bpe_run(tmp_path, capsys, qk_norm, cls):
    """A rotary run with its own BPE: a Llama / Qwen3 directory, with the tokenizer lm-eval's AutoTokenizer reads."""
    from data.hf_tokenizer import read_hf_tokenizer, read_tokenizer_json
    from tests.test_model_hf_llama import TEXT, hub_tokenizer, load_auto
    hub_tokenizer(tmp_path / "tok")  # any byte-level BPE with <|endoftext|>: as an own BPE stores it
    tok = read_tokenizer_json(tmp_path / "tok" / "tokenizer.json")
    model = tiny_model(tok.vocab_size + 7, qk_norm=qk_norm, tie_weights=not qk_norm, **MODERN)
    save_run(tmp_path / "run", model, tok, name="last.pt")
    out = export_ok(capsys, "--hf", tmp_path / "hf", "--run", tmp_path / "run")
    assert f"AutoModelForCausalLM.from_pretrained(d) (a {cls})" in out and "7 padded" in out
    assert {p.name for p in (tmp_path / "hf").iterdir()} <= export.EXPORT_FILES
    hf = load_auto(tmp_path / "hf")
    assert type(hf).__name__ == cls and hf.config.max_position_embeddings == 16
    assert_same_logits(model, hf, tok.vocab_size)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").encode(TEXT) == tok.encode(TEXT)
    assert read_hf_tokenizer(tmp_path / "hf").to_dict() == tok.to_dict()  # and back: sample.py --init, eval.py --hf


@pytest.mark.parametrize("kw,words", [(dict(mlp="relu2"), "mlp='relu2' is not supported"),
                                      (dict(logit_softcap=15.0), "logit_softcap=15.0 is not supported")])
def test_export_refuses_settings_without_a_class(tmp_path, capsys, char_tok, kw, words):
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size, **{**MODERN, **kw}), char_tok)
    assert export.main(["--hf", str(tmp_path / "hf"), "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after "using <checkpoint>")
    assert err.startswith("error: ") and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "run", "tiny.txt"]


def test_force_replaces_an_earlier_export_and_failures_leave_nothing(tmp_path, capsys, char_tok, monkeypatch):
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size), char_tok)
    out = tmp_path / "hf"
    export_ok(capsys, "--hf", out, "--run", tmp_path / "run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) <= export.EXPORT_FILES  # what write_export writes is what --force recognises
    assert export.main(["--hf", str(out), "--run", str(tmp_path / "run")]) == 2
    assert "is not empty: choose a new directory, or pass --force" in capsys.readouterr().err
    import data.hf_tokenizer

    def broken(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(data.hf_tokenizer, "write_char_tokenizer", broken)
    for target in (out, tmp_path / "new"):  # a failure half-way: the old directory intact, no new one
        assert export.main(["--hf", str(target), "--run", str(tmp_path / "run"), "--force"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == "error: disk full"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "hf", "run", "tiny.txt"]
    monkeypatch.undo()
    (out / "tokenizer.json").unlink()  # a partial earlier export (or an empty one) is replaced too
    export_ok(capsys, "--hf", out, "--run", tmp_path / "run", "--force")
    assert sorted(p.name for p in out.iterdir()) == CHAR_EXPORT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "hf", "run", "tiny.txt"]


@pytest.mark.parametrize("extra", ["run", "notes", "subdir", "no_config"])
def test_force_refuses_a_directory_that_is_not_an_export(tmp_path, capsys, char_tok, extra):
    """Issue 24: --force replaced a directory holding another run's *.pt files and notes, deleting them."""
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size), char_tok)
    out = tmp_path / "hf"
    export_ok(capsys, "--hf", out, "--run", tmp_path / "run")
    if extra == "run":  # another run's files beside an export's: 8 entries
        for name in ("last.pt", "best.pt", "notes.txt", "metrics.jsonl", "train.log"):
            (out / name).write_text(name)
    elif extra == "notes":
        (out / "notes.txt").write_text("mine")
    elif extra == "subdir":
        (out / "vocab.json").mkdir()  # an export's name, but a directory
    else:
        (out / "config.json").unlink()  # tokenizer files alone are not an export
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code = export.main(["--hf", str(out), "--run", str(tmp_path / "run"), "--force"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--hf {out} is not an earlier export, and --force would delete its {len(before)} entries (" in err
    assert "--force replaces only a directory export.py wrote" in err
    first = {"run": "best.pt, last.pt, metrics.jsonl, notes.txt, train.log and 4 more",
             "notes": "(notes.txt, ", "subdir": "(vocab.json/, ",
             "no_config": "(model.safetensors, tokenizer.json, tokenizer_config.json)"}[extra]
    assert first in err  # what is not an export's comes first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing touched
    assert export.main(["--hf", str(tmp_path / "run"), "--run", str(tmp_path / "run"), "--force"]) == 2
    assert "would delete its 1 entries (best.pt)" in capsys.readouterr().err
    assert (tmp_path / "run" / "best.pt").is_file()


def test_unwritable_directory_is_named_not_the_temp_dir(tmp_path, capsys, char_tok, monkeypatch):
    """Issue 24: exporting into a read-only directory named export.py's temp directory in it. (Simulated: the
    tests may run as root, which may write anywhere.)"""
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size), char_tok)
    (tmp_path / "ro").mkdir()
    mkdir = export.Path.mkdir

    def read_only(self, *a, **k):
        if self.parent == tmp_path / "ro":
            raise PermissionError(13, "Permission denied", str(self))
        return mkdir(self, *a, **k)
    monkeypatch.setattr(export.Path, "mkdir", read_only)
    assert export.main(["--hf", str(tmp_path / "ro" / "hf"), "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"error: cannot write into {tmp_path / 'ro'} (permission denied): choose a "
                                    "writable directory for --hf, or fix its permissions")
    assert ".tmp" not in err and list((tmp_path / "ro").iterdir()) == []


@pytest.mark.slow
def test_bad_input_cli(tmp_path):
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [(["--checkpoint", "missing.pt"], "out", ["checkpoint missing.pt does not exist"]),
             (["--checkpoint", "corrupt.pt"], "out", ["corrupt.pt is not a PyTorch checkpoint"]),
             (["--checkpoint", "corrupt.pt"], "full", ["--hf full is not empty", "--force"]),
             (["--checkpoint", "corrupt.pt", "--force"], "file", ["--hf file is a file"]),
             (["--run", "nope"], "out", ["run directory nope does not exist"]),
             ([], "out", ["one of the arguments --run --checkpoint is required"])]
    for args, out, words in cases:
        assert_one_error(run_cli(["export.py", "--hf", out, *args], cwd=tmp_path), *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "corrupt.pt", "file", "full"]
    assert (tmp_path / "file").read_text() == "x" and [p.name for p in (tmp_path / "full").iterdir()] == ["x"]


def test_read_only_filesystem_names_the_target(tmp_path, capsys, char_tok, monkeypatch):
    """A read-only filesystem (EROFS, not a PermissionError) named the temp directory; now the target."""
    import errno
    save_run(tmp_path / "run", tiny_model(char_tok.vocab_size), char_tok)
    (tmp_path / "ro").mkdir()
    mkdir = export.Path.mkdir

    def read_only(self, *a, **k):
        if self.parent == tmp_path / "ro":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return mkdir(self, *a, **k)
    monkeypatch.setattr(export.Path, "mkdir", read_only)
    assert export.main(["--hf", str(tmp_path / "ro" / "hf"), "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"error: cannot write into {tmp_path / 'ro'} (read-only file system): choose a "
                                    "writable directory for --hf, or fix its permissions")
    assert ".tmp" not in err


# ---- docs/export_eval.md's snippets: what they print is what sample.py prints ---------------------------------

SAME_AS = "# = python sample.py "  # a snippet's last comment: the sample.py command that prints the same


def doc_snippets(page: str, mentioning: str) -> list[str]:
    """The python code blocks of docs/`page` that mention `mentioning` (with those after them that
    continue them, up to the next that loads an export), in the section of the first."""
    sections = ("\n" + (REPO / "docs" / page).read_text(encoding="utf-8")).split("\n## ")
    section = next(s for s in sections if mentioning in s)
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    first = next(i for i, b in enumerate(blocks) if mentioning in b)
    return [blocks[first], *itertools.takewhile(lambda b: "from_pretrained" not in b, blocks[first + 1:])]


def run_snippets(capsys, blocks: list[str], page: str) -> list[str]:
    """Run `blocks` in order in one namespace (a later one continues an earlier one); what each printed, each
    checked against its sample.py command."""
    namespace, printed = {}, []
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)
        out = capsys.readouterr().out
        [command] = [line[len(SAME_AS):] for line in block.splitlines() if line.startswith(SAME_AS)]
        code = sample.main(shlex.split(command))
        want, err = capsys.readouterr()
        assert code == 0, err
        assert out in (want, want + "\n"), (command, out, want)  # print() ends with a newline; sample.py adds one
        printed.append(out)  # only when the text does not end with one already
    return printed


QWEN3 = dict(position="rope", norm="rmsnorm", mlp="swiglu", qk_norm=True, n_kv_head=1, tie_weights=False, bias=False)


@pytest.mark.parametrize("settings", [{}, pytest.param(QWEN3, marks=pytest.mark.slow, id="qwen3")])
def test_the_char_snippets_in_the_docs_print_what_sample_py_prints(capsys, char_tok, settings):
    """docs/export_eval.md gave `generate(..., pad_token_id=0)`: on a char export id 0 is a character (\\n), which
    transformers then hides from the model, printing other text than sample.py, silently. Every snippet is run as
    written on a char export with a context of 64: 200 characters slide the window 3 times. Also on the default
    runs' kind of export, Qwen3 (the snippets loaded it with GPT2LMHeadModel: every weight missing, a random model)."""
    save_run("run", tiny_model(char_tok.vocab_size, block_size=64, **settings), char_tok)  # greedy text that varies
    export_ok(capsys, "--hf", "exported/shakespeare", "--run", "run")
    assert char_tok.stoi["\n"] == 0  # the id the old snippet's pad_token_id hid
    blocks = doc_snippets("export_eval.md", '"exported/shakespeare"')
    assert len(blocks) == 2
    printed = run_snippets(capsys, blocks, "export_eval.md")
    assert [len(p.rstrip("\n")) for p in printed] == [len("ROMEO:\n") + 200, len("ROMEO:\n") + 50]
    assert len(set(printed[0][7:])) >= 4  # (a text of one character would hide a wrong window or mask)
    sampled = blocks[0].replace("temperature = 0 ", "temperature = 0.8 ")  # the sampling branch runs too
    assert sampled != blocks[0]
    exec(compile(sampled, "export_eval.md", "exec"), {})
    assert len(capsys.readouterr().out) == len("ROMEO:\n") + 200 + 1


@pytest.mark.slow  # over ~1 s
def test_the_bpe_snippet_in_the_docs_prints_what_sample_py_prints(capsys, cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    save_run("run", tiny_model(50257, n_embd=8, block_size=64), GPT2Tokenizer())
    export_ok(capsys, "--hf", "exported/gpt2-ft", "--run", "run")
    blocks = doc_snippets("export_eval.md", '"exported/gpt2-ft"')
    assert len(blocks) == 1 and "tok.decode" in blocks[0]
    [printed] = run_snippets(capsys, blocks[:1], "export_eval.md")
    assert printed.startswith("ROMEO:") and "<|endoftext|>" not in printed  # (where transformers would stop)
