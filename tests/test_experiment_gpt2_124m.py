"""experiment=gpt2_124m: the recipe's numbers, gradient accumulation derived from train.tokens_per_step and the
processes (one line when it does not divide), and a tiny version of it run end to end on CPU with HellaSwag at
each evaluation."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers import REPO
from launch.config import register_configs, to_dataclass
from training.config import grad_accum_for

register_configs()

TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=2",
        "train.tokens_per_step=128", "train.max_iters=2", "train.device=cpu", "train.compile=false",
        "train.eval_iters=1", "train.eval_interval=2", "optim.warmup_iters=1", "data.val_fraction=0.1"]


def recipe(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=["experiment=gpt2_124m", "data.path=corpus.txt", *overrides])


def test_recipe_numbers_and_grad_accum_per_world_size(monkeypatch):
    c = to_dataclass(recipe())
    m, o, t = c.model, c.optim, c.train
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.pad_vocab_to, c.data.tokenizer) == (12, 12, 768, 1024, 64,
                                                                                                  "gpt2")
    assert (o.lr, o.min_lr, o.warmup_iters, o.schedule, o.beta2, t.max_iters) == (6e-4, 6e-5, 700, "cosine", 0.95,
                                                                                  19073)
    assert t.tokens_per_step == 2**19 and t.grad_accum_steps == 8  # one process: 8 x 64 x 1024
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert to_dataclass(recipe()).train.grad_accum_steps == 1
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert to_dataclass(recipe("train.batch_size=32")).train.grad_accum_steps == 1
    with pytest.raises(ValueError) as e:
        to_dataclass(recipe())
    assert str(e.value) == ("train.tokens_per_step=524288 is not a multiple of train.batch_size x model.block_size x "
                            "processes = 64 x 1024 x 16 = 1048576: change train.batch_size (or train.tokens_per_step, "
                            "or null to use train.grad_accum_steps)")


def test_grad_accum_for():
    assert grad_accum_for(2**19, 16, 1024, 4) == 8
    for bad in (0, 1000):
        with pytest.raises(ValueError, match=f"train.tokens_per_step={bad} is not a multiple of"):
            grad_accum_for(bad, 2, 32, 1)


def test_bad_hellaswag_file_fails_before_training(tmp_path):
    (tmp_path / "hs.jsonl").write_text('{"ctx": "a", "endings": ["b"], "label": 0}\n')
    with pytest.raises(ValueError) as e:
        to_dataclass(recipe(f"train.hellaswag={tmp_path / 'hs.jsonl'}"))
    assert str(e.value).startswith(f"train.hellaswag={tmp_path / 'hs.jsonl'} line 1: \"endings\" must be a list of 4")
    with pytest.raises(FileNotFoundError, match="train.hellaswag missing.jsonl does not exist"):
        to_dataclass(recipe("train.hellaswag=missing.jsonl"))


@pytest.mark.slow  # (over a second: GPT-2 BPE data preparation and a 50k-token vocabulary)
def test_tiny_recipe_runs_end_to_end_with_hellaswag(tmp_path, tiny_corpus, cache_with_gpt2, caplog):
    from tests.test_evals_hellaswag import ROWS, write_rows
    from launch.run import train
    hs = write_rows(tmp_path / "hs.jsonl", ROWS)
    cfg = recipe(*TINY, f"data.path={tiny_corpus}", f"train.hellaswag={hs}")
    with caplog.at_level("INFO"):
        res = train(cfg, tmp_path / "run")
    assert (res.status, res.step) == ("completed", 2)
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["type"] == "eval"] == [0, 2]
    scores = [r for r in recs if r["type"] == "hellaswag"]
    assert [r["step"] for r in scores] == [0, 2] and all(r["examples"] == 3 for r in scores)
    assert all(0 <= r[k] <= 1 for r in scores for k in ("acc", "acc_norm", "acc_norm_tokens"))
    assert max(r["tokens"] for r in recs if r["type"] == "eval") == 2 * 128  # 2 steps of tokens_per_step
    assert any("HellaSwag: acc " in r.message for r in caplog.records)
    assert any("2 accumulation" in r.message for r in caplog.records)  # 128 / (2 x 32 x 1 process)
