"""training/probe.py: which text is the probe (and the one-line refusals), what a snapshot holds, the series across
a resume, that recording changes nothing the run computes, and its size for the baby GPT."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data.tokenizer import CharTokenizer
from model.lens import logit_lens, top_tokens
from runtime.ranks import Ranks
from tests.helpers import tiny_model
from training.probe import ProbeRecorder, probe_ids
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


def test_a_snapshot_is_the_models_attention_and_lens(tmp_path):
    model = tiny_model(TOK.vocab_size + 3, n_layer=3, block_size=32)  # (3 padded ids, never in the lens)
    recorder = ProbeRecorder.start(tmp_path, "The king", TOK, Val(), 32, Ranks(), step=0, resumed=False)
    recorder.record(model, 5, val_loss=2.5)
    snap = probes.read_snapshot(tmp_path, 5)
    assert (snap["text"], snap["ids"], snap["val_loss"]) == ("The king", TOK.encode("The king"), 2.5)
    lens, attention = logit_lens(model, torch.tensor([TOK.encode("The king")]), attention=True)
    probs, ids = top_tokens(lens[:, 0], probes.TOP, TOK.vocab_size)
    assert snap["attention"].shape == (3, 2, 8, 8) and snap["lens_ids"].shape == (4, 8, probes.TOP)
    assert (snap["attention"].float() - attention[:, 0]).abs().max() < 1e-3  # half precision
    assert torch.equal(snap["lens_ids"], ids.int()) and (snap["lens_probs"].float() - probs).abs().max() < 1e-3
    ProbeRecorder(tmp_path, "R", [1, 2], TOK.vocab_size, writes=False).record(model, 6, 2.0)  # another rank
    assert probes.steps(tmp_path) == [5]


def test_a_resumed_run_keeps_its_series_and_refuses_another_text(tmp_path):
    model = tiny_model(TOK.vocab_size, block_size=32)
    recorder = ProbeRecorder.start(tmp_path, "ROMEO", TOK, Val(), 32, Ranks(), step=0, resumed=False)
    for step in (0, 3, 6):
        recorder.record(model, step, 3.0)
    with pytest.raises(ValueError, match=r"^train.probe_text='king' is not the text of this run's probe snapshots "
                                         r"\('ROMEO'\): resume with that train.probe_text, or move "):
        ProbeRecorder.start(tmp_path, "king", TOK, Val(), 32, Ranks(), step=3, resumed=True)
    assert probes.steps(tmp_path) == [0, 3, 6]  # refused before anything changed
    ProbeRecorder.start(tmp_path, "ROMEO", TOK, Val(), 32, Ranks(), step=3, resumed=True)  # from step 3's last.pt
    assert probes.steps(tmp_path) == [0, 3]
    ProbeRecorder.start(tmp_path, "king", TOK, Val(), 32, Ranks(), step=0, resumed=False)  # a new run: a new series
    assert probes.steps(tmp_path) == []


def test_the_gpu_defaults_nine_snapshots_take_under_5_mb(tmp_path):
    """The GPU default (experiment=gpu: conf/model/baby_modern.yaml, 1000 steps, an evaluation every 125, and at
    step 0 with train.eval_at_start): 9 snapshots of 6 layers x 6 heads x 64 x 64 weights and the lens, written from
    a random model of that shape."""
    from omegaconf import OmegaConf

    from model.config import GPTConfig
    from model.gpt import GPT
    from tests.helpers import REPO
    preset = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "baby_modern.yaml"))
    run = OmegaConf.load(REPO / "conf" / "experiment" / "gpu.yaml").train
    model = GPT(GPTConfig(vocab_size=65, **{k: v for k, v in preset.items() if k != "pad_vocab_to"}))
    recorder = ProbeRecorder(tmp_path, "x" * 64, list(range(64)), 65, writes=True)
    for step in range(0, run.max_iters + 1, run.eval_interval):
        recorder.record(model, step, 1.5)
    files = list(probes.probe_dir(tmp_path).iterdir())
    assert len(files) == 9 and sum(f.stat().st_size for f in files) <= 5_000_000


@pytest.mark.slow  # over ~1 s: three short runs
def test_a_run_records_at_each_evaluation_and_a_resume_continues_the_series(tmp_path, tiny_corpus):
    """Step 0 (eval_at_start) and each evaluation; the last snapshot is last.pt's model; recording changes nothing
    the run computes (the same metrics with train.probe=false); a resumed run keeps the earlier snapshots."""
    from checkpoint.file import load_checkpoint, model_from_checkpoint
    from launch.run import train
    from tests.test_training_loop import make_cfg, records
    run, off = tmp_path / "run", tmp_path / "off"
    args = ["train.eval_at_start=true", "train.eval_interval=3", "optim.decay_iters=9"]
    train(make_cfg(tiny_corpus, "train.max_iters=6", *args), run)
    train(make_cfg(tiny_corpus, "train.max_iters=6", *args, "train.probe=false"), off)
    assert probes.steps(run) == [0, 3, 6] and not (off / "probes").exists()
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s", "wall_s")}  # noqa: E731
                        for r in rs if r["type"] != "summary"]
    assert strip(records(run)) == strip(records(off))
    probe = probes.read_snapshot(run, 0)
    assert len(probe["ids"]) == 16 and probe["text"] in tiny_corpus.read_text()  # min(64, block_size) tokens
    assert [probes.read_snapshot(run, s)["val_loss"] for s in (3, 6)] == [r["val_loss"] for r in records(run)
                                                                          if r["type"] == "eval"][1:]
    model = model_from_checkpoint(load_checkpoint(run / "last.pt"))
    _, attention = logit_lens(model, torch.tensor([probe["ids"]]), attention=True)
    assert (probes.read_snapshot(run, 6)["attention"].float() - attention[:, 0]).abs().max() < 1e-3
    train(make_cfg(tiny_corpus, "train.max_iters=9", *args, "train.resume=true"), run)
    assert probes.steps(run) == [0, 3, 6, 9]
