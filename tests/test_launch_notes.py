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
    assert len(warnings) == 2 and "optim.muon_lr=0.05 does nothing" in warnings[1]
    assert warnings[0].startswith("warning: optim.warmup_iters=100 is not shorter than train.max_iters=5")
    assert said[2:4] == [(w, logging.WARNING) for w in warnings]  # train.log: the same lines
