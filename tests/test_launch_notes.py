"""launch/notes.py: what a run says at its start, before its first step (issue 43): the CPU note names the model and
optimizer the run really has, a GPU-sized run on a CPU is told how long it will take, and every warning is given
once, by launch.run.execute (so a sweep's jobs and in-process runs give theirs too)."""
from __future__ import annotations

import logging

import pytest
import torch

from launch import notes, run
from runtime.ranks import Ranks
from training.config import Config
from training.state import TrainResult

CPU = torch.device("cpu")


def _config(**settings) -> Config:
    from launch.config import to_dataclass
    c = Config()
    for key, value in settings.items():
        group, name = key.split("__")
        setattr(getattr(c, group), name, value)
    return to_dataclass(c)


def test_the_cpu_note_says_what_the_run_trains():
    """Issue 43: "the CPU preset, trained with Muon" was said of a run the user had given AdamW and the baby GPT."""
    cpu_preset = _config(model__n_layer=4, model__n_head=4, model__n_embd=128, model__block_size=64,
                         model__dropout=0.0, optim__name="muon")
    # the preset as it is: the line the docs show
    preset = notes.CPU_NOTE.format(what="nanoGPT's CPU-sized model, trained with Muon")
    assert notes.cpu_note(cpu_preset) == preset
    assert notes.cpu_note(_config()) == (
        "no CUDA GPU found: using the CPU preset experiment=cpu (a 6-layer, 384-wide model with context 256, trained "
        "with AdamW) instead of the GPU preset; pass experiment=gpu to force it (hours on a CPU)")


def test_a_sweep_on_the_cpu_preset_says_what_each_run_trains():
    """Issue 43 (round six, found again): a sweep printed the fixed note, "trained with Muon", whatever it trained."""
    from launch.config import register_configs
    register_configs(sweep=True)  # (as train.py does before it checks a sweep's jobs)
    adamw = ["experiment=cpu", "optim=adamw"]
    preset = notes.CPU_NOTE.format(what="nanoGPT's CPU-sized model, trained with Muon")
    assert notes.sweep_cpu_notes([[*adamw, "optim.lr=1e-3"], [*adamw, "optim.lr=2e-3"]]) == [
        preset.replace("trained with Muon", "trained with AdamW")]  # the same run twice: said once
    assert notes.sweep_cpu_notes([["experiment=cpu"], ["experiment=cpu", "model.n_layer=2"]]) == [
        preset,
        preset.replace("nanoGPT's CPU-sized model", "a 2-layer, 128-wide model with context 64")]
    assert notes.sweep_cpu_notes([]) == [preset]  # (Hydra's own flags: no jobs composed)


def test_a_gpu_sized_run_on_a_cpu_is_told_how_long_it_takes(monkeypatch):
    """Issue 43: experiment=gpu forced onto a CPU said nothing of the hours ahead (and printed nothing for minutes).
    The estimate: FLOPs per token x tokens (evaluations a third) against a rough rate per thread."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    gpu_sized = _config(optim__name="muon", optim__warmup_iters=0, train__max_iters=1000)  # experiment=gpu's size
    line = notes.slow_note(gpu_sized, CPU, ["experiment=gpu"])
    assert line.startswith("this run is long for a CPU: about ") and " hours here (a rough estimate for 1,000 steps " \
        "of 16,384 tokens on 2 threads, evaluations included): for a CPU-sized run (under a minute) use " \
        "experiment=cpu, or lower train.max_iters" in line
    assert 2 * 3600 < notes.cpu_seconds(gpu_sized, 2) < 12 * 3600
    assert notes.slow_note(gpu_sized, torch.device("cuda"), []) is None  # a GPU: nothing to say
    cpu_sized = _config(model__n_layer=4, model__n_head=4, model__n_embd=128, model__block_size=64,
                        train__max_iters=180, train__batch_size=24)
    assert notes.slow_note(cpu_sized, CPU, ["experiment=cpu"]) is None
    assert notes.cpu_seconds(cpu_sized, 2) < 60  # experiment=cpu: ~30 s measured (docs/benchmarks.md)
    assert "lower train.max_iters or the model's size" in notes.slow_note(gpu_sized, CPU, ["experiment=cpu"])
    assert [notes.about(s) for s in (1800, 7199, 7200, 3 * 86400)] == ["30 minutes", "120 minutes", "2 hours",
                                                                       "3 days"]


def test_only_the_command_lines_keys_count_as_given():
    assert notes.given_keys(["experiment=cpu", "optim=adamw", "optim.muon_lr=0.05", "+train.seed=3",
                             "~optim.cooldown_frac", "hydra.run.dir=x"]) == {"optim.muon_lr", "train.seed"}


def test_the_run_gives_each_warning_once_as_it_starts(tmp_path, monkeypatch, capsys, caplog):
    """launch.run.execute (train.py, a sweep's job, in-process train()) says each note after on_start (the CPU note,
    a resume accepted), on stderr and in train.log, before the first step."""
    said = []

    def train(config, edge, device, source):
        # nothing yet, then the run's start (a resume accepted), then the loop
        said.append(capsys.readouterr().err)
        edge.on_start()
        said.append(capsys.readouterr().err)
        return TrainResult("completed", 1, 1.0, edge.run_dir)
    monkeypatch.setattr(run.loop, "train", train)
    monkeypatch.setattr(run.Edge, "finish", lambda self, status: None)
    monkeypatch.setattr(run, "to_files", lambda line, level: said.append((line, level)))
    setup = run.Setup(_config(train__max_iters=5, optim__muon_lr=0.05), tmp_path, Ranks(), CPU,
                      ["optim.muon_lr=0.05", "train.max_iters=5"])
    run.execute(setup, on_start=lambda: said.append("on_start"))
    assert said[0] == "" and said[1] == "on_start"
    warnings = said[-1].splitlines()
    assert len(warnings) == 3 and "optim.muon_lr=0.05 does nothing" in warnings[1]
    # the baby GPT's 40 batches per split
    assert warnings[2].startswith("warning: each evaluation is long for a CPU")
    assert warnings[0].startswith("warning: optim.warmup_iters=100 is not shorter than "
                                  "train.max_iters=5")
    assert said[2:5] == [(w, logging.WARNING) for w in warnings]  # train.log: the same lines


def test_a_long_evaluation_on_a_cpu_is_told_at_the_start(monkeypatch):
    """Issue 50: `experiment=null train.max_iters=5` on a CPU sat silent for minutes in its one
    evaluation (2 splits x 40 batches of 64 x 256 tokens of the baby GPT): the start says so, with a
    train.eval_iters that is quick."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    baby = _config(train__max_iters=5)  # experiment=null's evaluation
    line = notes.eval_note(baby, CPU)
    assert line.startswith("each evaluation is long for a CPU: about ")
    assert "train.eval_iters=40 batches of 64 x 256 tokens" in line
    fewer = int(line.rsplit("train.eval_iters=", 1)[1])
    assert 1 <= fewer < 40
    baby.train.eval_iters = fewer  # the suggestion followed: about half a minute, no note
    assert notes.cpu_seconds(baby, 2, evaluation_only=True) <= notes.EVAL_QUICK_S
    assert notes.eval_note(baby, CPU) is None
    assert notes.eval_note(_config(train__max_iters=5), torch.device("cuda")) is None
    cpu_sized = _config(model__n_layer=4, model__n_head=4, model__n_embd=128, model__block_size=64,
                        train__batch_size=24, train__eval_iters=20)  # experiment=cpu's: a second
    assert notes.eval_note(cpu_sized, CPU) is None


def _composed(*args):
    from launch.config import compose, register_configs, to_dataclass
    register_configs()
    return to_dataclass(compose(list(args)))


def _fix(line: str) -> list[str]:
    """The overrides a note says to add."""
    return line.rsplit(": add ", 1)[1].split()


@pytest.mark.parametrize("preset", ["experiment=cpu", "experiment=gpu", "~experiment"])
def test_a_fine_tune_at_a_from_scratch_rate_is_told_a_rate_that_works(preset, tmp_path):
    """Issue 50: a fine-tune of a nanoGPT run at the CPU preset's rates (no warm-up) made it worse
    first (val 1.9956 -> 2.3737 in 5 steps), with no hint. The note names the rates and an override
    that passes the config's checks and silences it when added to the command line."""
    args = [preset, f"model.init_from={tmp_path}"]
    c = _composed(*args)
    line = notes.finetune_note(c, notes.given_keys(args))
    assert line.startswith("model.init_from fine-tunes pretrained weights at a from-scratch")
    fix = _fix(line)
    assert f"optim.lr={c.optim.lr / 10:.3g}" in fix
    assert (f"optim.muon_lr={c.optim.muon_lr / 10:.3g}" in fix) == (c.optim.name == "muon")
    followed = _composed(*args, *fix)  # passes training.config.check (min_lr <= lr)
    assert followed.optim.lr == pytest.approx(c.optim.lr / 10)
    given = notes.given_keys([*args, *fix])
    assert notes.finetune_note(followed, given) is None
    # and no new warning
    assert notes.notes(followed, given) == notes.notes(c, notes.given_keys(args))


@pytest.mark.slow  # over ~1 s: five configs composed
def test_the_fine_tune_note_lowers_min_lr_where_the_rate_would_fall_below_it(tmp_path):
    source = f"model.init_from={tmp_path}"
    args = ["~experiment", source, "optim.min_lr=5e-4"]
    fix = _fix(notes.finetune_note(_composed(*args), notes.given_keys(args[:2])))
    assert fix == ["optim.lr=0.0002", "optim.min_lr=5e-05"]
    _composed(*args[:2], *fix)  # passes the checks
    # nanoGPT's fine-tune rate, 3e-5; a run from scratch; the user's own rates: nothing to say
    assert notes.finetune_note(_composed("experiment=finetune_shakespeare", source), set()) is None
    assert notes.finetune_note(_composed("experiment=cpu"), set()) is None
    assert notes.finetune_note(_composed("experiment=cpu", source, "optim.lr=1e-2"),
                               {"optim.lr", "optim.muon_lr"}) is None


@pytest.mark.slow  # two 5-step fine-tunes of the nanoGPT fixture
def test_following_the_fine_tune_note_does_not_make_the_model_worse(tmp_path,
                                                                    cache_with_shakespeare):
    """The note's override, measured: 5 steps at the CPU preset's rates raise the nanoGPT run's val
    loss, 5 steps at the note's rates do not."""
    import json
    import shutil
    from tests.helpers import REPO, run_cli
    fixture = REPO / "tests" / "fixtures" / "nanogpt"
    shutil.copytree(fixture / "out-bias", tmp_path / "out-bias")
    shutil.copytree(fixture / "data", tmp_path / "data")  # its meta.pkl, where nanoGPT finds it
    args = ["experiment=cpu", "model.init_from=out-bias", "train.max_iters=5",
            "train.eval_at_start=true", "train.eval_interval=5", "train.device=cpu"]
    fix = _fix(notes.finetune_note(_composed(*args), notes.given_keys(args)))
    vals = {}
    for name, extra in (("preset", []), ("note", fix)):
        run_dir = tmp_path / name
        proc = run_cli(["train.py", *args, *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert ("from-scratch learning rate" in proc.stderr) == (name == "preset")
        records = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
        vals[name] = [r["val_loss"] for r in records if r["type"] == "eval"]
    assert vals["preset"][1] > vals["preset"][0]  # the preset's rates: worse first
    assert vals["note"][1] <= vals["note"][0]  # the note's: not worse
