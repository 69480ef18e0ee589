"""evals/hellaswag.py: rows in the official format are read (bad ones: one line naming the line number), each
ending's summed loss equals a direct computation (context cropped on the left like lm-eval), acc / acc_norm /
acc_norm_tokens pick by sum / per character (lm-eval's) / per token (llm.c's), eval.py --hellaswag prints them, and
lm-evaluation-harness on the exported model gives the same log-likelihoods (within 1e-4) and accuracies."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import eval as eval_cli
from evals import hellaswag
from tests.helpers import run_cli
from tests.helpers import save_run, tiny_model

ROWS = [{"ctx": "The man opens the door and", "endings": ["walks in.", "eats a cloud", "sings", "x"], "label": 0},
        {"ctx_a": "A cat sits.", "ctx_b": "It", "endings": ["purrs.", "flies away", "is a dog", "sleeps"],
         "label": "3"},
        {"ctx": "Water is", "endings": ["wet.", "dry.", "blue, mostly", "hot"], "label": 2}]


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_read_official_format():
    ex = hellaswag.read_examples("\n".join(json.dumps(r) for r in ROWS) + "\n\n", "hs.jsonl")
    assert [e.context for e in ex] == ["The man opens the door and", "A cat sits. It", "Water is"]
    assert [e.label for e in ex] == [0, 3, 2] and [e.line for e in ex] == [1, 2, 3] and len(ex[0].endings) == 4


@pytest.mark.parametrize("row, words", [
    ("{not json", "not JSON"), ("[1, 2]", "not a JSON object"),
    ({"endings": ["a", "b", "c", "d"], "label": 0}, 'no context: give a "ctx"'),
    ({"ctx": "c", "endings": ["a", "b", "c"], "label": 0}, '"endings" must be a list of 4'),
    ({"ctx": "c", "endings": ["a", "b", "c", ""], "label": 0}, '"endings" must be a list of 4 non-empty'),
    ({"ctx": "c", "endings": ["a", "b", "c", "d"], "label": 4}, '"label" must be 0 to 3, got 4'),
    ({"ctx": "c", "endings": ["a", "b", "c", "d"]}, '"label" must be 0 to 3, got None')])
def test_bad_row_names_its_line(row, words):
    text = json.dumps(ROWS[0]) + "\n" + (row if isinstance(row, str) else json.dumps(row)) + "\n"
    with pytest.raises(ValueError) as e:
        hellaswag.read_examples(text, "hs.jsonl")
    assert str(e.value).startswith(f"hs.jsonl line 2: {words}") and "\n" not in str(e.value)


def char_setup(block_size=16):
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer(set("".join(json.dumps(r) for r in ROWS)) | {" "})
    return tiny_model(tok.vocab_size + 2, block_size=block_size), tok  # 2 padded rows: no tokens


def direct_sum(model, tok, context: str, ending: str) -> float:
    """Summed loss of " " + ending's tokens after the last tokens of the context that fit the model's context."""
    ctx, tail = tok.encode_ordinary(context), tok.encode_ordinary(" " + ending)
    ids = torch.tensor((ctx + tail)[-(model.config.block_size + 1):])
    with torch.no_grad():
        logits = model(ids[None, :-1])[0][0, :, :tok.vocab_size]
    return F.cross_entropy(logits[-len(tail):], ids[-len(tail):], reduction="sum").item()


def test_scores_equal_direct_computation():
    model, tok = char_setup()  # context 16: the longer contexts are cropped on the left
    examples = hellaswag.read_examples("\n".join(json.dumps(r) for r in ROWS), "hs.jsonl")
    expect = {"acc": 0, "acc_norm": 0, "acc_norm_tokens": 0}
    for ex in examples:
        rows = hellaswag.encode(ex, tok.encode_ordinary, 16)
        total, n = hellaswag.ending_losses(model, rows, tok.vocab_size)
        direct = [direct_sum(model, tok, ex.context, e) for e in ex.endings]
        assert total.tolist() == pytest.approx(direct, abs=1e-4)
        assert n.tolist() == [len(tok.encode_ordinary(" " + e)) for e in ex.endings]
        d = torch.tensor(direct)
        expect["acc"] += int(d.argmin()) == ex.label
        expect["acc_norm_tokens"] += int((d / n).argmin()) == ex.label
        chars = torch.tensor([float(len(e)) for e in ex.endings])
        expect["acc_norm"] += int((d / chars).argmin()) == ex.label
    r = hellaswag.score(model, examples, tok.encode_ordinary, vocab_limit=tok.vocab_size)
    assert r == pytest.approx({**{k: v / 3 for k, v in expect.items()}, "examples": 3})
    model.train()  # the mode is restored after scoring (the training loop's hook scores a training model)
    half = hellaswag.score(model, examples, tok.encode_ordinary, vocab_limit=tok.vocab_size,
                           plan=[(0, True), (1, False)])  # a rank's share: uncounted padding is scored, not counted
    assert half["examples"] == 1 and model.training


def test_eval_cli_hellaswag(tmp_path, capsys):
    model, tok = char_setup()
    ckpt = str(save_run(tmp_path / "run", model, tok))
    path = write_rows(tmp_path / "hs.jsonl", ROWS)
    assert eval_cli.main(["--hellaswag", path, "--checkpoint", ckpt, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r) == {"acc", "acc_norm", "acc_norm_tokens", "examples"} and r["examples"] == 3
    assert eval_cli.main(["--hellaswag", path, "--checkpoint", ckpt]) == 0
    assert capsys.readouterr().out.startswith("HellaSwag: acc ")
    (tmp_path / "bad.jsonl").write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    assert eval_cli.main(["--hellaswag", str(tmp_path / "bad.jsonl"), "--checkpoint", ckpt]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --hellaswag {tmp_path / 'bad.jsonl'} line 2: not JSON") and err.count("\n") == 1
    long = dict(ROWS[0], endings=["a" * 40, "b", "c", "d"])  # an ending longer than the context of 16
    assert eval_cli.main(["--hellaswag", write_rows(tmp_path / "long.jsonl", [long]), "--checkpoint", ckpt]) == 2
    assert "line 1: an ending is 41 tokens, more than the model's context of 16" in capsys.readouterr().err
    assert eval_cli.main(["--hellaswag", path, "--file", path, "--checkpoint", ckpt]) == 2  # one or the other
    assert "not allowed with argument" in capsys.readouterr().err


def peaky(model, factor: float = 60.0):
    """`model` with logits of std ~35 over its 50k vocabulary, where float32 sums drift by 1e-4 nats."""
    with torch.no_grad():
        model.transformer.wte.weight.mul_(factor)
    return model


def test_log_likelihoods_exact_at_50k_vocabulary():
    """log_softmax over the last dimension and gather (lm-eval's computation), summed in float64: within 1e-4
    of a float64 computation (cross-entropy on transposed float32 logits was 2.6e-4 off here)."""
    model, g = peaky(tiny_model(50304, n_embd=8, block_size=24)), torch.Generator().manual_seed(0)
    rows = [(torch.randint(0, 50257, (23,), generator=g).tolist(),
             [-1] * 3 + torch.randint(0, 50257, (20,), generator=g).tolist()) for _ in range(4)]
    x, y = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])
    with torch.no_grad():
        logp = F.log_softmax(model(x)[0][..., :50257].double(), dim=-1)
    exact = -torch.where(y >= 0, logp.gather(-1, y.clamp(min=0)[..., None])[..., 0], 0.0).sum(1)
    total, n = hellaswag.ending_losses(model, rows, 50257)
    assert (total - exact).abs().max() < 1e-4 and n.tolist() == [20] * 4


def test_gzip_bom_and_json_array_files_are_read(tmp_path):
    import gzip
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    (tmp_path / "hs.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "array.json").write_text(json.dumps(ROWS, indent=1))
    want = hellaswag.read_examples(text, "hs")
    for name in ("hs.jsonl.gz", "bom.jsonl", "array.json"):
        got = hellaswag.read_examples(hellaswag.read_text(str(tmp_path / name), "--hellaswag"), name)
        assert [(e.context, e.endings, e.label) for e in got] == [(e.context, e.endings, e.label) for e in want]
    (tmp_path / "bad.gz").write_bytes(gzip.compress(text.encode())[:30])
    with pytest.raises(ValueError, match="bad.gz is gzip-compressed but not UTF-8 jsonl inside"):
        hellaswag.read_text(str(tmp_path / "bad.gz"), "--hellaswag")
    with pytest.raises(ValueError, match=r"^array.json row 2: \"label\" must be 0 to 3, got '²'.* label 0-3$"):
        hellaswag.read_examples(json.dumps([ROWS[0], dict(ROWS[0], label="²")]), "array.json")


def test_label_superscript_digit_names_row_and_values():
    with pytest.raises(ValueError) as e:
        hellaswag.read_examples(json.dumps(dict(ROWS[0], label="²")), "hs.jsonl")
    assert str(e.value).startswith("hs.jsonl line 1: \"label\" must be 0 to 3, got '²'") and "int()" not in str(e.value)


def test_literal_endoftext_is_the_special_token(tmp_path, capsys, cache_with_gpt2, monkeypatch):
    """As in lm-eval (Hugging Face's tokenizer), a literal <|endoftext|> in a HellaSwag row is token 50256."""
    from data.tokenizer import GPT2Tokenizer
    ckpt = str(save_run(tmp_path / "run", tiny_model(50304, n_embd=8, block_size=24), GPT2Tokenizer()))
    seen = []
    real = hellaswag.score
    monkeypatch.setattr(hellaswag, "score", lambda m, ex, enc, **kw: seen.append(enc("<|endoftext|>")) or
                        real(m, ex, enc, **kw))
    path = write_rows(tmp_path / "hs.jsonl", [dict(ROWS[0], ctx="<|endoftext|>The man opens the door and")])
    assert eval_cli.main(["--hellaswag", path, "--checkpoint", ckpt, "--json"]) == 0
    assert seen == [[50256]]


LM_EVAL_TASK = """task: tinygpt_hellaswag
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {path}
validation_split: validation
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{endings}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


# lm-eval as `lm_eval --model hf --model_args pretrained=DIR,dtype=float32 --tasks tinygpt_hellaswag --include_path
# TASKS --device cpu --log_samples` runs it (simple_evaluate, batch size 1), for each model in one process, with its
# task index holding the local task alone: the CLI reads lm-eval's ~14,000 task files first (17 s of CPU)
LM_EVAL = r"""
import json, sys
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
tasks, out, models = sys.argv[1], sys.argv[2], sys.argv[3:]
manager = TaskManager(include_path=tasks, include_defaults=False)
got = {}
for model in models:
    r = simple_evaluate(model="hf", model_args=f"pretrained={model},dtype=float32", tasks=["tinygpt_hellaswag"],
                        device="cpu", batch_size=1, log_samples=True, task_manager=manager)
    got[model] = {"results": r["results"]["tinygpt_hellaswag"], "samples": r["samples"]["tinygpt_hellaswag"]}
with open(out, "w") as f:
    json.dump(got, f, default=str)
"""


@pytest.mark.slow
def test_agrees_with_lm_eval(tmp_path, capsys, cache_with_gpt2, tiny_corpus):
    """The same file through lm-evaluation-harness (a local task) on the export, for GPT-2's tokenizer (a 50k
    vocabulary) and an own BPE: the same per-ending log-likelihoods (within 1e-4 nats; logits 4x larger than at
    init, lm-eval sums in float32), acc and acc_norm."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install lm-eval)")
    pytest.importorskip("accelerate", reason="lm-eval's hf model needs accelerate (pip install accelerate)")
    import random

    import export
    from data import bpe
    from data.tokenizer import GPT2Tokenizer
    from model.gpt import GPT
    lines = [line for line in tiny_corpus.read_text().splitlines() if line.strip()]
    rng, rows = random.Random(0), []
    for i in range(12):
        ends = [lines[(i + 1) % len(lines)]] + rng.sample(lines, 3)
        rng.shuffle(ends)
        rows.append({"ctx": lines[i], "endings": ends, "label": ends.index(lines[(i + 1) % len(lines)])})
    path = write_rows(tmp_path / "hs.jsonl", rows)
    kinds = {}
    for kind in ("gpt2", "bpe"):
        tok = GPT2Tokenizer() if kind == "gpt2" else bpe.train([tiny_corpus.read_text()], 300)  # or an own BPE
        vocab, T = (50304, 24) if kind == "gpt2" else (tok.vocab_size, 64)  # 300 tokens: longer endings
        ckpt = str(save_run(tmp_path / kind, peaky(tiny_model(vocab, n_embd=8, block_size=T), 4.0), tok))
        assert export.main(["--hf", str(tmp_path / kind / "hf"), "--checkpoint", ckpt]) == 0
        assert eval_cli.main(["--hellaswag", path, "--checkpoint", ckpt, "--json"]) == 0
        kinds[kind] = tok, T, json.loads(capsys.readouterr().out.splitlines()[-1])
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "hs.yaml").write_text(LM_EVAL_TASK.format(path=path))
    offline = {k: "1" for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    run_cli(["-c", LM_EVAL, str(tmp_path / "tasks"), str(tmp_path / "lm_eval.json"),
             *(str(tmp_path / kind / "hf") for kind in kinds)], cwd=tmp_path, check=True,
            env={**offline, "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "OMP_NUM_THREADS": "1"})
    got = json.loads((tmp_path / "lm_eval.json").read_text())
    for kind, (tok, T, ours) in kinds.items():
        r, samples = got[str(tmp_path / kind / "hf")]["results"], got[str(tmp_path / kind / "hf")]["samples"]
        assert (r["acc,none"], r["acc_norm,none"]) == pytest.approx((ours["acc"], ours["acc_norm"])), kind
        model = GPT.from_pretrained(str(tmp_path / kind / "hf"))
        assert len(samples) == len(rows)
        for s in samples:
            ex = hellaswag.parse_row(json.dumps(s["doc"]))
            total, _ = hellaswag.ending_losses(model, hellaswag.encode(ex, tok.encode, T), tok.vocab_size)
            assert (-total).tolist() == pytest.approx([float(ll) for ll, _ in s["filtered_resps"]], abs=1e-4), kind
