"""Checkpoints written by earlier tinygpt code keep loading: tests/fixtures/run_v1/last.pt is a real run's last.pt
(format 1: 1 layer, 2 heads, 8 wide, context 8, Tiny Shakespeare chars, Muon, 2 steps), saved by train.py before
issue 28 moved the checkpoint and model code. sample.py, eval.py and a resume must read it as they did then."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

import eval as eval_cli
import sample
from checkpoint.manager import CheckpointManager
from data.tokenizer import describe_tokenizer
from runtime.ranks import Ranks

FIXTURE = Path(__file__).parent / "fixtures" / "run_v1" / "last.pt"


def test_sample_reads_the_old_checkpoint_with_the_same_text(capsys):
    assert sample.main(["--checkpoint", str(FIXTURE), "--prompt", "ROMEO:", "--temperature", "0",
                        "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == "ROMEO:$$NNNNNNNNNN\n"  # what the code that wrote it sampled
    assert sample.main(["--run", str(FIXTURE.parent), "--prompt", "ROMEO:", "--seed", "1",
                        "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out == "ROMEO:\nCuw;suqW\n.&\n"


def test_eval_reads_the_old_checkpoint_with_the_same_loss(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    assert eval_cli.main(["--file", str(text), "--checkpoint", str(FIXTURE), "--json", "--stride", "4"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == 60 and abs(r["loss"] - 4.172105979919434) < 1e-5


def test_the_old_checkpoint_resumes(tmp_path):
    from model.config import GPTConfig
    from model.gpt import GPT
    from training.optim import build_optimizer
    run = tmp_path / "run"
    shutil.copytree(FIXTURE.parent, run)
    ckpt = torch.load(FIXTURE, weights_only=True)
    model = GPT(GPTConfig.from_dict(ckpt["model_config"]))
    o = ckpt["config"]["optim"]
    from training.config import OptimConfig
    opt = build_optimizer(model, OptimConfig(**o), "cpu")
    meta = {k: ckpt[k] for k in ("model_config", "tokenizer", "config")}
    manager = CheckpointManager(run, {"model": model, "optimizer": opt}, meta, describe_tokenizer, ranks=Ranks())
    assert manager.resume(True) == 2 and manager.config_diff == []
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt["model"].items())
    assert opt.state_dict()["state"].keys() == ckpt["optimizer"]["state"].keys()
    assert manager.save(3) == run / "last.pt"  # and it saves on
