"""checkpoint.locate: which checkpoint a path, a run directory, the newest run or train.resume means, reading it,
and loading it for inference.

`save_run` (a tinygpt checkpoint in the real format, as train.py writes it), `tiny_model` and
`assert_one_error` (a CLI's one-line error) are shared with test_export and test_eval.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from checkpoint import sharded as S
from checkpoint.file import CheckpointError, save_checkpoint
from checkpoint.file import (check_vocab, checkpoint_in_run, find_newest_checkpoint, load_for_inference,
                             model_from_checkpoint, read_checkpoint, resolve_checkpoint)
from checkpoint.manager import overwrite_refusal, resume_checkpoint
from tests.helpers import tiny_model_and_opt, train_steps


def randomize(model, seed: int = 0):
    """Weights far from GPT-2's init (std 0.2, LayerNorm gains ~1), so a wrong mapping or GELU shows in logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            mean = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
            p.copy_(mean + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_model(vocab_size: int, seed: int = 0, **kw):
    from model.config import GPTConfig
    from model.gpt import GPT
    cfg = dict(vocab_size=vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16)
    return randomize(GPT(GPTConfig(**{**cfg, **kw})), seed)


def save_run(run_dir, model, tokenizer, *, name: str = "best.pt", fsdp: bool = False) -> Path:
    """A checkpoint as train.py writes it; fsdp: the weights-only export beside last_dcp/ (optimizer None)."""
    run_dir = Path(run_dir)
    ckpt = {"format": "tinygpt", "version": 1, "model": model.state_dict(), "model_config": model.config.to_dict(),
            "tokenizer": tokenizer.to_dict(), "optimizer": None if fsdp else {}, "scaler": None, "step": 10,
            "best_val_loss": 2.0, "config": {}, "rng": {}, "loader": {}, "wandb_run_id": None}
    if fsdp:
        ckpt["sharded"] = True
        (run_dir / "last_dcp").mkdir(parents=True, exist_ok=True)
    return save_checkpoint(ckpt, run_dir / name)


def assert_one_error(proc, *words) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))


def test_checkpoint_in_run_prefers_best(tmp_path):
    _touch(tmp_path / "run" / "last.pt", time.time())
    assert checkpoint_in_run(tmp_path / "run") == tmp_path / "run" / "last.pt"
    _touch(tmp_path / "run" / "best.pt", time.time() - 100)
    assert checkpoint_in_run(tmp_path / "run") == tmp_path / "run" / "best.pt"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no best.pt or last.pt: has its training saved a checkpoint yet"):
        checkpoint_in_run(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="run directory .*nope does not exist"):
        checkpoint_in_run(tmp_path / "nope")


def test_find_newest_checkpoint_prefers_newest_run_then_best(tmp_path):
    t = time.time()
    _touch(tmp_path / "outputs/2026-01-01/10-00-00/best.pt", t - 500)
    _touch(tmp_path / "outputs/2026-01-02/10-00-00/best.pt", t - 300)
    _touch(tmp_path / "outputs/2026-01-02/10-00-00/last.pt", t - 100)  # newer, but best.pt is preferred
    _touch(tmp_path / "multirun/2026-01-01/09-00-00/0/last.pt", t - 200)
    assert find_newest_checkpoint() == Path("outputs/2026-01-02/10-00-00/best.pt")
    _touch(tmp_path / "multirun/2026-01-01/09-00-00/1/last.pt", t - 10)
    assert find_newest_checkpoint() == Path("multirun/2026-01-01/09-00-00/1/last.pt")
    assert find_newest_checkpoint(roots=("nowhere",)) is None


def test_resolve_checkpoint(tmp_path, capsys):
    assert resolve_checkpoint(checkpoint="x.pt") == Path("x.pt")
    with pytest.raises(FileNotFoundError, match=r"no trained model found under \./outputs or \./multirun .* --hf DIR"):
        resolve_checkpoint(other="--hf DIR")
    _touch(tmp_path / "outputs/a/last.pt", time.time())
    assert resolve_checkpoint() == Path("outputs/a/last.pt")
    assert resolve_checkpoint(run="outputs/a") == Path("outputs/a/last.pt")
    assert capsys.readouterr().err.splitlines() == ["using outputs/a/last.pt (newest run)", "using outputs/a/last.pt"]


@pytest.mark.parametrize("fsdp", [False, True])
def test_load_for_inference(tmp_path, fsdp):
    from data.tokenizer import CharTokenizer
    tok = CharTokenizer("abcdefgh")
    model = tiny_model(10, bias=False, tie_weights=False)
    path = save_run(tmp_path, model, tok, name="last.pt", fsdp=fsdp)
    loaded, tok_dict, ckpt = load_for_inference(path, "cpu")
    assert tok_dict == tok.to_dict() and ckpt["step"] == 10 and not loaded.training
    assert next(loaded.parameters()).dtype == torch.float32
    idx = torch.tensor([[1, 2, 3, 9]])
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    check_vocab(8, loaded)
    with pytest.raises(ValueError, match="the tokenizer has 11 tokens but the model only 10"):
        check_vocab(11, loaded)


def test_load_for_inference_errors(tmp_path):
    from data.tokenizer import CharTokenizer
    model = tiny_model(8)
    path = save_run(tmp_path, model, CharTokenizer("abcdefgh"))
    ckpt = torch.load(path, weights_only=True)
    for change, message in ((dict(tokenizer=None), "has no tokenizer: it was not written by train.py"),
                            (dict(model=None), "holds no model weights"),
                            (dict(model_config={**ckpt["model_config"], "n_layer": 3}), "do not match the model")):
        bad = {**ckpt, **change}
        if change.get("tokenizer", 0) is None:
            del bad["tokenizer"]
        save_checkpoint(bad, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match=message):
            load_for_inference(tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="does not exist"):
        load_for_inference(tmp_path / "missing.pt")


def test_model_from_checkpoint_fits_or_says_why_in_one_line():
    model = tiny_model(8)
    ckpt = {"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()},  # torch.compile's prefixes
            "model_config": model.config.to_dict()}
    rebuilt = model_from_checkpoint(ckpt)
    assert not rebuilt.training and torch.equal(rebuilt.lm_head.weight, model.lm_head.weight)
    ckpt["model_config"]["n_embd"] = 32
    with pytest.raises(ValueError, match="the weights in the checkpoint do not match the model") as info:
        model_from_checkpoint(ckpt)
    assert "\n" not in str(info.value)


def test_read_checkpoint_run_dir_rule_and_model(tmp_path):
    from data.tokenizer import CharTokenizer
    model, tok = tiny_model(8), CharTokenizer("abcdefgh")
    last = save_run(tmp_path, model, tok, name="last.pt")
    assert read_checkpoint(tmp_path, run_dir=True, model=True)[0] == last
    best = save_run(tmp_path, model, tok, name="best.pt")
    assert read_checkpoint(tmp_path, run_dir=True, model=True)[0] == best
    with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file"):
        read_checkpoint(tmp_path, model=True)
    (tmp_path / "sub").mkdir()
    with pytest.raises(FileNotFoundError, match="has no best.pt or last.pt"):
        read_checkpoint(tmp_path / "sub", run_dir=True, model=True)


def test_resume_checkpoint_picks_the_freshest_resumable_one(tmp_path):
    """true: last.pt with optimizer state vs last_dcp/, by step (an FSDP export, no optimizer, loses)."""
    m, opt = tiny_model_and_opt()
    train_steps(m, opt, 2, seed=1)
    meta = {"format": "tinygpt", "version": 1, "model": None, "optimizer": None, "step": 2,
            "model_config": m.config.to_dict(), "config": {}, "sharded": True}
    run = tmp_path / "run"
    S.save_sharded(run / S.LAST_DCP, m, opt, meta)
    assert resume_checkpoint(True, run) == (run / S.LAST_DCP, meta)
    save_checkpoint({**meta, "model": m.state_dict(), "optimizer": None}, run / "last.pt")
    assert resume_checkpoint(True, run)[0] == run / S.LAST_DCP
    with pytest.raises(ValueError, match=r"last.pt is the weights-only export of an FSDP run: resume from its "
                                         r"sharded checkpoint with train.resume=.*last_dcp$"):
        resume_checkpoint(str(run / "last.pt"), tmp_path)
    (run / "last.pt").write_bytes(b"torn")  # unreadable: the sharded one is the way on
    assert resume_checkpoint(True, run)[0] == run / S.LAST_DCP
    save_checkpoint({**meta, "model": m.state_dict(), "optimizer": opt.state_dict(), "step": 4}, run / "last.pt")
    assert resume_checkpoint(True, run)[0] == run / "last.pt"  # a later, complete single file wins
    assert resume_checkpoint(str(run), tmp_path)[0] == run / "last.pt"
    assert resume_checkpoint(str(run / S.LAST_DCP), tmp_path)[0] == run / S.LAST_DCP
    assert resume_checkpoint(False, run) is None and resume_checkpoint(None, run) is None
    with pytest.raises(ValueError, match=r"train.resume=true but .*empty has no last.pt"):
        resume_checkpoint(True, tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is a directory without last.pt or last_dcp/"):
        resume_checkpoint(str(tmp_path / "empty"), run)


def test_overwrite_refusal(tmp_path):
    assert overwrite_refusal(tmp_path) is None
    (tmp_path / "last.pt").write_bytes(b"x")
    assert overwrite_refusal(tmp_path) == (f"{tmp_path} already holds last.pt from an earlier run: continue it with "
                                           f"train.resume=true, or choose another hydra.run.dir (nothing was "
                                           f"overwritten)")
