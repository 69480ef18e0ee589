"""eval.py: the loss equals a direct computation, sliding windows score every token exactly once (checked
against a brute-force per-token computation), bits per byte counts the scored tokens' bytes, and bad input
is one error line."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import eval as eval_cli
from tests.helpers import REPO, run_cli
from tests.helpers import approx_record, assert_one_error, save_run, tiny_model

KEYS = {"loss", "perplexity", "bits_per_byte", "tokens", "bytes", "windows", "softmax_ids",
        "padded_rows_left_out"}


@pytest.fixture
def char_run(tmp_path, tiny_corpus):
    """(checkpoint path, model with 3 padded vocabulary rows, tokenizer); the vocabulary includes 'é'."""
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(set(tiny_corpus.read_text()) | {"é"})
    model = tiny_model(tok.vocab_size + 3)
    return save_run(tmp_path / "run", model, tok), model, tok


def eval_json(capsys, tmp_path, text: str, *args) -> dict:
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    code = eval_cli.main(["--file", str(tmp_path / "text.txt"), "--json", *map(str, args)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert set(result) == KEYS
    return result


def test_windows_score_every_target_once():
    for n in range(1, 30):
        for T in range(1, 7):
            for stride in range(1, T + 1):
                spans = eval_cli.windows(n, T, stride)
                scored = [p for begin, length, first in spans for p in range(begin + first, begin + length)]
                assert scored == list(range(n)), (n, T, stride)
                assert all(length <= T and 0 <= first < length for _, length, first in spans)
                # context of a scored position p (target p + 1): p - begin + 1 tokens, as many as the window gives
                assert all(p - b + 1 >= min(p + 1, T - stride + 1)
                           for b, length, first in spans for p in range(b + first, b + length))


@pytest.mark.slow  # over ~1 s
def test_one_window_equals_direct_loss(tmp_path, capsys, char_run):
    path, model, tok = char_run
    text = "KING:\nGood café"  # 15 tokens: 14 inputs, within the context of 16
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        logits = model(ids[:, :-1])[0][..., :tok.vocab_size]  # padded rows are no tokens
    direct = F.cross_entropy(logits[0], ids[0, 1:]).item()
    assert r["loss"] == pytest.approx(direct, abs=1e-6) and r["perplexity"] == pytest.approx(math.exp(direct))
    assert (r["tokens"], r["bytes"]) == (14, 15)  # the first token "K" is not scored; "é" is 2 bytes
    assert r["bits_per_byte"] == pytest.approx(direct * 14 / math.log(2) / 15)
    unpadded = tiny_model(tok.vocab_size, seed=3)  # no padding: exactly the model's own loss
    r = eval_json(capsys, tmp_path, text, "--checkpoint", save_run(tmp_path / "run2", unpadded, tok))
    with torch.no_grad():
        assert r["loss"] == pytest.approx(unpadded(ids[:, :-1], ids[:, 1:])[1].item(), abs=1e-6)


@pytest.mark.slow  # over ~1 s
def test_a_padded_vocabulary_is_left_out_of_the_softmax_and_said_so(tmp_path, capsys, char_run):
    """Issue 50: eval of a nanoGPT GPT-2-vocabulary run (padded to 50304) differed from nanoGPT's
    forward, with no word of why. eval.py's convention (docs/export_eval.md): the tokenizer's ids
    only, as sampling and the export; it says so, and nanoGPT's loss (over every row) is higher."""
    path, model, tok = char_run
    text = "KING:\nGood café"
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path)
    assert (r["softmax_ids"], r["padded_rows_left_out"]) == (tok.vocab_size, 3)
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        # nanoGPT's forward: the padded rows in the softmax
        nanogpt = model(ids[:, :-1], ids[:, 1:])[1].item()
    assert r["loss"] < nanogpt
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    assert eval_cli.main(["--file", str(tmp_path / "text.txt"), "--checkpoint", str(path)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 3 and f"{tok.vocab_size:,} real ids" in said[2]
    assert "3 padded rows" in said[2]


def brute_force(model, ids, T, stride, vocab):
    """Target t's loss given ids[begin:t], begin = the start of the first HF window that reaches t."""
    out = []
    for t in range(1, len(ids)):
        begin = max(0, math.ceil((t - T) / stride)) * stride
        with torch.no_grad():
            logits = model(torch.tensor([ids[begin:t]]))[0][0, -1, :vocab]
        out.append(F.cross_entropy(logits, torch.tensor(ids[t])).item())
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.slow  # over ~1 s
def test_sliding_windows_match_brute_force(tmp_path, capsys, char_run, tiny_corpus):
    path, _, tok = char_run
    model = tiny_model(tok.vocab_size + 3, seed=1, block_size=8)
    ids = tok.encode(tiny_corpus.read_text()[:41])
    for stride in (1, 3, 8):
        expected = brute_force(model, ids, 8, stride, tok.vocab_size)
        for batch_size in (1, 4):
            got = eval_cli.token_losses(model, ids, stride=stride, batch_size=batch_size, vocab_limit=tok.vocab_size)
            assert got.shape == (40,) and (got - expected).abs().max() <= 1e-5
    # the CLI on a text of many windows: every token counted once, the mean is the per-token mean
    text = tiny_corpus.read_text()[:500]
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path, "--stride", 5, "--batch-size", 16)
    ids = tok.encode(text)
    expected = brute_force(char_run[1], ids, 16, 5, tok.vocab_size)
    assert (r["tokens"], r["bytes"]) == (499, 499) and r["loss"] == pytest.approx(expected.mean().item(), abs=1e-6)


def test_bpe_bytes_and_hf_round_trip(tmp_path, capsys, cache_with_gpt2):
    from data.tokenizer import GPT2Tokenizer
    from model.hf import write_pretrained
    tok = GPT2Tokenizer()
    model = tiny_model(50304, n_embd=8)  # padded like the gpt2 preset
    path = save_run(tmp_path, model, tok)
    text = "Ünïcode first. Then plain text, long enough for two windows of sixteen tokens: " * 2
    ids = tok.encode_ordinary(text)
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path, "--batch-size", 2)
    assert r["tokens"] == len(ids) > 16  # every token: the first after <|endoftext|>, as lm-eval scores it
    assert r["bytes"] == len(text.encode())
    assert r["bits_per_byte"] == pytest.approx(r["loss"] * r["tokens"] / math.log(2) / r["bytes"])
    # the export drops the 47 padded rows: the same loss, and none left out
    write_pretrained(model, tok.vocab_size, tmp_path / "hf")
    assert r["padded_rows_left_out"] == 47
    exported = eval_json(capsys, tmp_path, text, "--hf", tmp_path / "hf")
    assert exported == approx_record({**r, "padded_rows_left_out": 0})


def test_char_export_round_trip(tmp_path, capsys, char_run, tiny_corpus):
    import export
    path = char_run[0]
    assert export.main(["--hf", str(tmp_path / "hf"), "--checkpoint", str(path)]) == 0
    capsys.readouterr()
    text = tiny_corpus.read_text()[:100]
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path)
    exported = eval_json(capsys, tmp_path, text, "--hf", tmp_path / "hf")
    assert exported == approx_record({**r, "padded_rows_left_out": 0})


def test_bad_options(tmp_path, capsys, char_run):
    (tmp_path / "t.txt").write_text("KING:\nGood night")
    for args, words in ((["--stride", "0"], "--stride 0 is invalid"), (["--batch-size", "0"], "--batch-size 0"),
                        (["--stride", "17"], "--stride 17 is larger than the model's context of 16")):
        assert eval_cli.main(["--file", "t.txt", "--checkpoint", str(char_run[0]), *args]) == 2
        assert capsys.readouterr().err.startswith(f"error: {words}")
    (tmp_path / "t.txt").write_text("K")
    assert eval_cli.main(["--file", "t.txt", "--checkpoint", str(char_run[0])]) == 2
    assert "is a single token: nothing to score" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_input_cli(tmp_path, char_run):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("KING: caf".encode() + "é".encode("latin-1") + b"!")
    (tmp_path / "foreign.txt").write_text("KING: Ωmega €5", encoding="utf-8")
    ckpt = ["--checkpoint", str(char_run[0])]
    cases = [(["--file", "empty.txt", *ckpt], ["--file empty.txt is empty"]),
             (["--file", "latin1.txt", *ckpt], ["latin1.txt is not valid UTF-8: byte 0xe9 at byte offset 9",
                                                "--encoding-errors replace"]),
             (["--file", "missing.txt", *ckpt], ["--file missing.txt does not exist"]),
             (["--file", "foreign.txt", *ckpt], ["cannot score --file foreign.txt: characters not in the "
                                                 "vocabulary: '5', 'Ω', '€'"])]
    for args, words in cases:
        assert_one_error(run_cli(["eval.py", *args], cwd=tmp_path), *words)


class _Tty:
    """A stderr that says it is a terminal, recording what is written to it."""
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass


def test_progress_bar_only_on_a_terminal(tmp_path, capsys, char_run, tiny_corpus, monkeypatch):
    """Issue 24: a redirected stderr got thousands of \\r bar updates."""
    text = tiny_corpus.read_text()[:300]  # 37 windows, one per batch
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    args = ["--file", str(tmp_path / "text.txt"), "--checkpoint", str(char_run[0]), "--batch-size", "1"]
    assert eval_cli.main(args) == 0
    assert "\r" not in capsys.readouterr().err  # stderr redirected: no bar
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    assert eval_cli.main(args) == 0
    assert "\r" in tty.text and "window" in tty.text  # on a terminal: the bar


def test_eval_reads_what_export_wrote_and_hints_at_swapped_options(tmp_path, capsys, char_run):
    """Issue 24: --hf RUN_DIR and --run EXPORT_DIR said only what was missing, not to swap the options."""
    import export
    run_dir = char_run[0].parent
    assert export.main(["--hf", str(tmp_path / "hf"), "--run", str(run_dir)]) == 0
    (tmp_path / "t.txt").write_text("KING:\nGood night")
    capsys.readouterr()
    for args, line in (
            (["--hf", str(run_dir)], f"error: --hf {run_dir} is a tinygpt training run, not a Hugging Face "
                                     f"directory: use --run {run_dir}"),
            (["--hf", str(char_run[0])], f"error: --hf {char_run[0]} is a file, not a Hugging Face directory: a "
                                         f"tinygpt checkpoint goes with --checkpoint {char_run[0]}"),
            (["--run", str(tmp_path / "hf")], f"error: run directory {tmp_path / 'hf'} is a Hugging Face directory "
                                              f"(config.json, no best.pt or last.pt), not a training run: use --hf "
                                              f"{tmp_path / 'hf'}")):
        assert eval_cli.main(["--file", str(tmp_path / "t.txt"), *args]) == 2
        assert capsys.readouterr().err == line + "\n"


def test_without_a_model_option_the_newest_run_is_scored_as_sample_py_does(tmp_path, capsys, char_run, monkeypatch):
    """Issue 43: eval.py needed --run/--checkpoint/--hf where sample.py and explore.py take the newest run (and say
    which, on stderr); `--hf gpt2` said "check the path" where sample.py --init gpt2 gave the download command; and
    nanoGPT's --out_dir got no hint. One function answers each (checkpoint.file, common.cli)."""
    monkeypatch.chdir(tmp_path)
    newest = tmp_path / "outputs" / "2026-01-02" / "00-00-00"
    newest.mkdir(parents=True)
    (newest / "best.pt").write_bytes(char_run[0].read_bytes())
    (tmp_path / "t.txt").write_text("KING:\nGood night")
    assert eval_cli.main(["--file", "t.txt", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == "using outputs/2026-01-02/00-00-00/best.pt (newest run)" and json.loads(out)["tokens"]
    for args, line in ((["--hf", "gpt2"], "error: --hf gpt2 is not a local directory, and tinygpt never downloads "
                                          "models: get it with `hf download openai-community/gpt2 config.json "
                                          "model.safetensors --local-dir gpt2`, then use --hf gpt2"),
                       (["--out_dir=out"], "error: eval.py takes --run out, not --out_dir=out (see python {} "
                                           "--help)"),
                       (["--text_key", "body"], "error: eval.py takes --text-key body, not --text_key body (see "
                                                "python {} --help)"),
                       (["--init", "gpt2"], "error: eval.py takes --hf gpt2, not --init gpt2 (see python {} --help)")):
        assert eval_cli.main(["--file", "t.txt", *args]) == 2
        assert capsys.readouterr().err == line.format(REPO / "eval.py") + "\n"  # (run from another directory)
    monkeypatch.chdir(REPO)  # the hint comes before argparse's own complaint (--file or --hellaswag missing)
    assert eval_cli.main(["--out_dir", "outputs"]) == 2
    assert capsys.readouterr().err == "error: eval.py takes --run outputs, not --out_dir outputs (see python eval.py " \
                                      "--help)\n"


def test_bpe_first_token_is_scored_after_endoftext(tmp_path, capsys, cache_with_gpt2):
    """lm-eval's loglikelihood_rolling definition: [<|endoftext|>] + text, every text token scored, all bytes."""
    from data.tokenizer import GPT2Tokenizer
    tok = GPT2Tokenizer()
    model = tiny_model(50304, n_embd=8)
    text = "To be, or not to be"
    r = eval_json(capsys, tmp_path, text, "--checkpoint", save_run(tmp_path, model, tok))
    ids = torch.tensor([[tok.eot_id] + tok.encode_ordinary(text)])
    with torch.no_grad():
        logits = model(ids[:, :-1])[0][0, :, :tok.vocab_size]
    nats = F.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
    assert (r["tokens"], r["bytes"]) == (ids.shape[1] - 1, len(text))
    assert r["bits_per_byte"] == pytest.approx(nats / math.log(2) / len(text), rel=1e-6)
    (tmp_path / "one.txt").write_text("To")  # one token is enough: it has <|endoftext|> as context
    assert eval_cli.main(["--file", str(tmp_path / "one.txt"), "--checkpoint", str(tmp_path / "best.pt")]) == 0


def test_default_windows_are_lm_evals_rolling_windows():
    """No --stride: lm-eval's loglikelihood_rolling windows (disjoint, the last one with a full context); each
    target is predicted from the same inputs as lm-eval's (get_rolling_token_windows + make_disjoint_window)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    for n in range(1, 40):
        for T in range(1, 9):
            tokens, theirs = list(range(1, n + 1)), {}  # ids = [0 (<|endoftext|>)] + tokens
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(tokens, 0, T, 1)):
                inputs = (ctx + cont)[:-1]
                for k, t in enumerate(cont):
                    theirs[t] = tuple(inputs[:len(inputs) - len(cont) + k + 1][-T:])
            ids, ours = [0] + tokens, {}
            for begin, length, first in eval_cli.windows(n, T):
                for p in range(begin + first, begin + length):
                    ours[ids[p + 1]] = tuple(ids[begin:p + 1])
            assert ours == theirs, (n, T)


def test_bits_per_byte_agrees_with_lm_eval_rolling(tmp_path, capsys, cache_with_gpt2):
    """The default bits per byte equals lm-eval's rolling rule computed directly (within 0.05%); --stride keeps the
    overlapping windows, and the JSON says which rule ran."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from data.tokenizer import GPT2Tokenizer
    tok, model = GPT2Tokenizer(), tiny_model(50304, n_embd=8, seed=2)
    path = save_run(tmp_path, model, tok)
    text = "Ünïcode first. Then plain text, long enough for several windows of sixteen tokens each. " * 3
    tokens, total = tok.encode_ordinary(text), 0.0
    for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(tokens, tok.eot_id, 16, 1)):
        inputs = torch.tensor([(ctx + cont)[:-1]])
        with torch.no_grad():
            logp = F.log_softmax(model(inputs)[0][0, -len(cont):, :tok.vocab_size].double(), dim=-1)
        total -= logp.gather(-1, torch.tensor(cont)[:, None]).sum().item()
    lm_eval_bpb = total / math.log(2) / len(text.encode())
    r = eval_json(capsys, tmp_path, text, "--checkpoint", path)
    assert r["windows"] == "rolling" and r["bits_per_byte"] == pytest.approx(lm_eval_bpb, rel=5e-4)
    assert eval_json(capsys, tmp_path, text, "--checkpoint", path, "--stride", 8)["windows"] == "stride 8"


def test_file_is_read_as_train_py_reads_it(tmp_path, capsys, char_run):
    """.jsonl and parquet: documents by their text field (--text-key), not the JSON syntax; a char model's
    documents joined as train.py joins them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = char_run[0]
    docs = ["KING:\nGood night", "QUEEN:\nGood day"]
    plain = eval_json(capsys, tmp_path, "".join(docs), "--checkpoint", path)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    pq.write_table(pa.table({"body": docs}), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.parquet"):
        assert eval_cli.main(["--file", str(tmp_path / name), "--text-key", "body", "--checkpoint", str(path),
                              "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == approx_record(plain)
    assert eval_cli.main(["--file", str(tmp_path / "d.jsonl"), "--checkpoint", str(path)]) == 2
    assert "has no text under 'text' (it has: body): set --text-key <the field" in capsys.readouterr().err


def test_docs_have_no_empty_code_blocks():
    import re
    from pathlib import Path
    for page in ("export_eval.md", "sampling.md"):
        text = (Path(__file__).parent.parent / "docs" / page).read_text(encoding="utf-8")
        assert not re.search(r"^```\w*\n```$", text, re.M), f"docs/{page} has an empty code block"
