"""training/probe.py: which text is the probe (and the one-line refusals), which steps are probed, what a snapshot
holds, the series across a resume (the same as a straight run's), that recording changes nothing the run computes, and
its size for the GPU default."""
from __future__ import annotations

import signal

import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from model.lens import logit_lens, top_of_lens, top_tokens
from runtime.ranks import Ranks
from tests.helpers import tiny_model
from training.config import TrainConfig
from training.probe import ProbeRecorder, probe_ids, probe_steps
from viz import probes


class Val:  # a validation split holding 0, 1, 2, ...
    def windows(self, offsets, length):
        return np.arange(length)[None] + np.asarray(offsets)[:, None]


TOK = CharTokenizer("ROMEO:\nThe king is good")


def test_the_probe_is_the_validation_splits_first_tokens_or_the_text_given():
    assert probe_ids(None, TOK, Val(), 256) == list(range(64))
    assert probe_ids(None, TOK, Val(), 16) == list(range(16))  # at most the context
    assert probe_ids("ROMEO", TOK, Val(), 16) == TOK.encode("ROMEO")
    with pytest.raises(ValueError, match=r"^train.probe_text='ROMEO!' cannot be encoded: .*'!'"):
        probe_ids("ROMEO!", TOK, Val(), 16)
    with pytest.raises(ValueError, match=r"^train.probe_text is 20 tokens, over model.block_size=16: shorten it"):
        probe_ids("ROMEO" * 4, TOK, Val(), 16)


def test_probed_steps_are_step_0_and_a_log_scale_up_to_the_end():
    """The CPU preset (180 steps, one evaluation, at the end) records 9 snapshots by default, most of them early,
    where the heads form; a short run every step; 0 only at evaluations."""
    assert TrainConfig().probe_steps == 8
    assert sorted(probe_steps(180, 8)) == [0, 1, 2, 4, 9, 19, 41, 86, 180]
    assert sorted(probe_steps(1000, 8)) == [0, 1, 3, 7, 19, 52, 139, 373, 1000]
    assert sorted(probe_steps(5, 8)) == [0, 1, 2, 3, 4, 5] and sorted(probe_steps(180, 1)) == [0, 180]
    assert probe_steps(180, 0) == frozenset()


def test_a_negative_or_idle_probe_steps_is_one_line():
    from training.config import Config, check
    for probe, steps, match in ((True, -1, r"^train.probe_steps=-1 must be >= 0: .*train.probe_steps=8 \(0: at "),
                                (False, 20, r"^train.probe_steps=20 has no effect with train.probe=false: drop one")):
        c = Config()
        c.train.probe, c.train.probe_steps = probe, steps
        with pytest.raises(ValueError, match=match):
            check(c)
    c = Config()
    c.train.probe = False
    check(c)  # (the default probe_steps: nothing to say)


def test_a_snapshot_is_the_models_attention_and_lens(tmp_path):
    model = tiny_model(TOK.vocab_size + 3, n_layer=3, block_size=32)  # (3 padded ids, never in the lens)
    recorder = ProbeRecorder.start(tmp_path, "The king", TOK, Val(), 32, Ranks(), step=0, resumed=False)
    recorder.record(model, 5, val_loss=2.5)
    snap = probes.read_snapshot(tmp_path, 5)
    assert (snap["text"], snap["ids"], snap["val_loss"], snap["train_loss"]) == ("The king", TOK.encode("The king"),
                                                                                 2.5, None)
    lens, attention = logit_lens(model, torch.tensor([TOK.encode("The king")]), attention=True)
    probs, ids = top_tokens(lens[:, 0], probes.TOP, TOK.vocab_size)
    assert snap["attention"].shape == (3, 2, 8, 8) and snap["lens_ids"].shape == (4, 8, probes.TOP)
    assert (snap["attention"].float() - attention[:, 0]).abs().max() < 1e-3  # half precision
    assert torch.equal(snap["lens_ids"], ids.int()) and (snap["lens_probs"].float() - probs).abs().max() < 1e-3
    ProbeRecorder(tmp_path, "R", [1, 2], TOK.vocab_size, writes=False).record(model, 6, 2.0)  # another rank
    assert probes.steps(tmp_path) == [5]
    recorder.record(model, 7, train_loss=2.75)  # between evaluations: the step's train loss, and which it is
    recorder.record(model, 0)  # step 0 without an evaluation: no loss
    assert [(s["val_loss"], s["train_loss"]) for s in map(lambda s: probes.read_snapshot(tmp_path, s, False), (7, 0))] \
        == [(None, 2.75), (None, None)]


def test_a_diverging_model_is_not_recorded(tmp_path):
    """A NaN loss or NaN weights (the run's next log line stops it) would be a snapshot no page can read."""
    model = tiny_model(TOK.vocab_size, block_size=32)
    recorder = ProbeRecorder(tmp_path, "R", [1, 2], TOK.vocab_size, writes=True)
    recorder.record(model, 1, train_loss=float("nan"))
    with torch.no_grad():
        model.transformer.wte.weight[1] = float("nan")
    recorder.record(model, 2, train_loss=2.0)
    assert probes.steps(tmp_path) == []


def test_a_resumed_run_keeps_its_series_and_refuses_another_text(tmp_path):
    model = tiny_model(TOK.vocab_size, block_size=32)
    recorder = ProbeRecorder.start(tmp_path, "ROMEO", TOK, Val(), 32, Ranks(), step=0, resumed=False)
    for step in (0, 3, 6):
        recorder.record(model, step, 3.0)
    with pytest.raises(ValueError, match=r"^train.probe_text='king' is not the text of this run's probe snapshots "
                                         r"\('ROMEO'\): resume with that train.probe_text, or move "):
        ProbeRecorder.start(tmp_path, "king", TOK, Val(), 32, Ranks(), step=3, resumed=True)
    with pytest.raises(ValueError, match=r"^the default probe text \(the val split's\) is not the text of this run's"):
        ProbeRecorder.start(tmp_path, None, TOK, Val(), 32, Ranks(), step=3, resumed=True)  # (was "=None")
    assert probes.steps(tmp_path) == [0, 3, 6]  # refused before anything changed
    ProbeRecorder.start(tmp_path, "ROMEO", TOK, Val(), 32, Ranks(), step=3, resumed=True)  # from step 3's last.pt
    assert probes.steps(tmp_path) == [0, 3]
    ProbeRecorder.start(tmp_path, "king", TOK, Val(), 32, Ranks(), step=0, resumed=False)  # a new run: a new series
    assert probes.steps(tmp_path) == []


def test_the_gpu_defaults_snapshots_take_under_5_mb(tmp_path):
    """The GPU default (experiment=gpu: conf/model/baby_modern.yaml, 1000 steps, an evaluation every 125) with the
    default train.probe_steps, and with train.eval_at_start: 16 snapshots of 6 layers x 6 heads x 64 x 64 weights and
    the lens, written from a random model of that shape."""
    from omegaconf import OmegaConf

    from launch.config import preset
    from model.config import GPTConfig
    from model.gpt import GPT
    from tests.helpers import REPO
    run = OmegaConf.load(REPO / "conf" / "experiment" / "gpu.yaml").train
    model = GPT(GPTConfig(**preset("model", "baby_modern")).with_vocab(65))  # (a preset lists what it changes)
    probs, ids, attention = top_of_lens(model, list(range(64)), probes.TOP, 65, attention=True)  # (one forward)
    evaluations = set(range(0, run.max_iters + 1, run.eval_interval))
    for step in evaluations | probe_steps(run.max_iters, TrainConfig().probe_steps):
        probes.write_snapshot(tmp_path, step, text="x" * 64, ids=list(range(64)), attention=attention, lens_probs=probs,
                              lens_ids=ids, **({"val_loss": 1.5} if step in evaluations else {"val_loss": None,
                                                                                                "train_loss": 1.625}))
    files = list(probes.probe_dir(tmp_path).iterdir())
    assert len(files) == 16 and sum(f.stat().st_size for f in files) <= 5_000_000


@pytest.mark.slow  # over ~1 s: four short runs
def test_a_run_records_its_steps_and_a_resumed_run_the_same(tmp_path, tiny_corpus, monkeypatch):
    """Step 0, the log-spaced steps with their train loss, each evaluation with its val loss; the last snapshot is
    last.pt's model; recording changes nothing the run computes (the same metrics with train.probe=false); a run
    stopped mid-way and resumed records the same snapshots, number for number, as a straight one."""
    from checkpoint.file import load_checkpoint, model_from_checkpoint
    from launch.run import train
    from training import loop
    from tests.test_training_loop import _after_step, make_cfg, records
    run, off, cut = tmp_path / "run", tmp_path / "off", tmp_path / "cut"
    args = ["train.max_iters=9", "train.eval_interval=3", "train.log_interval=1"]
    train(make_cfg(tiny_corpus, *args), run)
    train(make_cfg(tiny_corpus, *args, "train.probe=false"), off)
    assert probes.steps(run) == [0, 1, 2, 3, 4, 5, 6, 7, 9] and not (off / "probes").exists()  # (8: not probed)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s", "wall_s")}  # noqa: E731
                        for r in rs if r["type"] != "summary"]
    assert strip(records(run)) == strip(records(off))
    snaps = {s: probes.read_snapshot(run, s) for s in probes.steps(run)}
    assert len(snaps[0]["ids"]) == 16 and snaps[0]["text"] in tiny_corpus.read_text()  # min(64, block_size) tokens
    evals = {r["step"]: r["val_loss"] for r in records(run) if r["type"] == "eval"}
    losses = {r["step"]: r["loss"] for r in records(run) if r["type"] == "train"}  # (log_interval 1: each step's)
    assert {s: (x["val_loss"], x["train_loss"]) for s, x in snaps.items()} == {
        0: (None, None), **{s: (evals[s], None) for s in (3, 6, 9)}, **{s: (None, losses[s]) for s in (1, 2, 4, 5, 7)}}
    model = model_from_checkpoint(load_checkpoint(run / "last.pt"))
    _, attention = logit_lens(model, torch.tensor([snaps[9]["ids"]]), attention=True)
    assert (snaps[9]["attention"].float() - attention[:, 0]).abs().max() < 1e-3

    with monkeypatch.context() as mp:
        mp.setattr(loop, "optimizer_step", _after_step(4, signal.SIGTERM))  # stopped after step 4, a probed one
        assert train(make_cfg(tiny_corpus, *args), cut).exit_code == 143 and probes.steps(cut) == [0, 1, 2, 3, 4]
    stale = {k: v for k, v in snaps[5].items() if k != "step"}
    probes.write_snapshot(cut, 5, **{**stale, "val_loss": 9.0})  # a step the stopped run had not reached: redone
    train(make_cfg(tiny_corpus, *args, "train.resume=true"), cut)
    assert probes.steps(cut) == probes.steps(run)
    for step, want in snaps.items():
        got = probes.read_snapshot(cut, step)
        assert all(torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]
                   for k in want), step
