"""training/metrics.py: metrics.jsonl records, and RunLog's lines and summary from explicit values (no Trainer)."""
from __future__ import annotations

import json
import math
import re
import types

import pytest
import torch

from training import metrics as mt
from training import mfu as mfu_mod
from training.config import Config
from runtime.ranks import Ranks
from training.precision import Precision, setup_precision
from training.state import TrainState
from tests.helpers import REPO
from tests.log_lines import fields


def test_metrics_records_and_plot(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = mt.RunLog(4)
    w.file = mt.open_metrics(path)
    w.write({"type": "train", "step": 1, "loss": 3.0})
    w.write({"type": "eval", "step": 2, "train_loss": 2.5, "val_loss": 2.6})
    w.write({"type": "train", "step": 3, "loss": math.nan})
    w.write({"type": "summary", "best_val_loss": 2.6})
    w.file.close()
    with open(path, "a") as f:
        f.write('{"type": "train", "st')  # a torn line from a killed run
    recs = mt.read_metrics(path)
    assert [r["type"] for r in recs] == ["train", "eval", "train", "summary"]
    assert recs[2]["loss"] == "nan"  # JSON has no NaN: written as a string
    mt.open_metrics(tmp_path / "resumed.jsonl", source=path, step=2).close()  # a resume at step 2 keeps these
    assert [r["step"] for r in mt.read_metrics(tmp_path / "resumed.jsonl")] == [1, 2]
    mt.open_metrics(path).close()  # a new run in a dead run's directory starts the file afresh
    assert mt.read_metrics(path) == []
    from viz.loss_plot import plot_loss
    assert plot_loss(recs, tmp_path / "loss.png").stat().st_size > 1000
    assert plot_loss([], tmp_path / "none.png") is None


def test_run_log_from_explicit_values(tmp_path, caplog):
    c = Config()
    c.train.max_iters = 4
    run_dir, precision = tmp_path / "run", setup_precision(torch.device("cpu"), "float32")
    st = TrainState(batch_tokens=c.train.batch_size * c.train.grad_accum_steps * c.model.block_size)
    tokenizer = types.SimpleNamespace(describe=lambda: "char (65 characters)")
    data = types.SimpleNamespace(tokenizer=tokenizer, dir=tmp_path / "cache",
                                 token_files=lambda: ([0] * 9000, [0] * 900))  # (train, val) tokens
    report = mt.RunLog(c.train.max_iters)
    with caplog.at_level("INFO"):
        model = types.SimpleNamespace(num_params=lambda: 1_234_567, config=c.model.with_vocab(128))
        report.start(c, run_dir, st, data=data, model=model, precision=precision, compiled=False, ranks=Ranks(),
                     source=None, resumed_from=None, config_diff=[])
        report.log_train(2, {"loss": 3.5, "grad_norm": 0.75}, 1e-3, 2 * st.batch_tokens, 1.0, 1000.0)
        report.log_eval(4, {"train": {"loss": 3.0, "bpb": None}, "val": {"loss": 3.25, "bpb": 2.0}}, 1e-3, 1000, 2.0,
                        True)
        st.step, st.tokens, st.best_val_loss, st.best_step = 4, 4 * st.batch_tokens, 3.25, 4
        report.finish("completed", st, wall=3.0, train_s=2.0, session_tokens=st.tokens, compiled=False,
                      early_stopped=False)
    lines = caplog.messages
    assert lines[:2] == [f"run dir: {run_dir}", f"data: {c.data.name}, char (65 characters), 9.00K train / 900 val "
                                                 f"tokens ({tmp_path / 'cache'})"]
    assert lines[2].startswith("model: 1.23M parameters (") and "vocab 128" in lines[2]
    assert lines[3] == f"device: cpu ({report.device_name}), float32, eager (no torch.compile)"
    assert lines[4].startswith(f"global batch: {st.batch_tokens:,} tokens per step (")
    assert "x 1 process); 4 steps to go" in lines[4]
    assert fields(lines[5]) == {"step": 2, "max_iters": 4, "loss": 3.5, "grad_norm": 0.75,
                                "lr": 1e-3, "tok/s": "1.0k"}
    assert fields(lines[6]) == {"step": 4, "max_iters": 4, "train_loss": 3.0, "val_loss": 3.25,
                                "val_bpb": 2.0, "best": True, "tokens": "1.00K", "elapsed": "2s"}
    assert lines[7].startswith("done: 4 steps, ")  # sample.py named by a path that runs from the cwd (a tmp dir)
    assert lines[7].endswith(f"python {REPO / 'sample.py'} --run {run_dir}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records] == ["train", "eval", "summary"] and "mfu" not in records[0]
    assert (records[0]["loss"], records[0]["grad_norm"]) == (3.5, 0.75)
    assert records[2] == {"type": "summary", "status": "completed", "step": 4, "best_step": 4, "best_val_loss": 3.25,
                          "tokens": st.tokens, "wall_s": 3.0, "train_s": 2.0,
                          "mean_tokens_per_s": round(st.tokens / 2.0, 1), "num_params": 1_234_567,
                          "device": report.device_name, "dtype": "float32", "compiled": False, "early_stopped": False}
    assert (run_dir / "loss.png").is_file()


def test_every_evaluation_statistic_is_reported_by_name(tmp_path, caplog):
    """A statistic added to a split's stats (here "ppl") reaches metrics.jsonl (val_ppl), wandb
    (eval/val_ppl) and the line, in the stats' order; None is left out; today's keys stay
    (val_loss, val_bpb, train_loss)."""
    report, tracked = mt.RunLog(10), []
    report.file = mt.open_metrics(tmp_path / "metrics.jsonl")
    report.wandb = types.SimpleNamespace(log=lambda data, step: tracked.append((step, data)))
    stats = {"train": {"loss": 2.0, "bpb": None, "ppl": math.exp(2.0)},
             "val": {"loss": 2.5, "bpb": 3.5, "ppl": math.exp(2.5)}}
    with caplog.at_level("INFO"):
        report.log_eval(5, stats, 1e-3, 640, 65.0, improved=False)
    report.file.close()
    record = mt.read_metrics(tmp_path / "metrics.jsonl")[0]
    names = ["train_loss", "train_ppl", "val_loss", "val_bpb", "val_ppl"]
    assert list(record) == ["type", "step", *names, "lr", "tokens", "elapsed_s"]
    assert record["val_ppl"] == pytest.approx(math.exp(2.5)) and record["val_bpb"] == 3.5
    assert tracked == [(5, {f"eval/{name}": record[name] for name in names})]
    line = fields(caplog.messages[0])
    assert list(line) == ["step", "max_iters", *names, "tokens", "elapsed"]
    assert line["val_ppl"] == pytest.approx(math.exp(2.5), abs=1e-4) and "best" not in line
    assert (line["tokens"], line["elapsed"]) == ("640", "1m05s")


def test_a_slow_first_step_is_told_before_the_first_log_interval(tmp_path, caplog):
    """Issue 43: a GPU-sized run on a CPU printed nothing for minutes: the first step's time, when the first train
    line is half a minute or more away (not for a quick step, a log every step, or the run's only step); rank 0's
    report only (another rank's, never started, says nothing)."""
    report = mt.RunLog(1000)
    with caplog.at_level("INFO"):
        report.first_step(1, 14.2, 10)
        report.file = mt.open_metrics(tmp_path / "metrics.jsonl")
        for step, seconds, every in ((1, 14.2, 10), (1, 3.0, 10), (1, 60.0, 1), (1000, 60.0, 10)):
            report.first_step(step, seconds, every)
    report.file.close()
    # one line: the step, its seconds, the interval and the setting that sets it
    assert len(caplog.messages) == 1, caplog.messages
    told = caplog.messages[0]
    assert told.startswith("step 1/1000: took 14.2 s") and "every 10 steps (train.log_interval)" in told


def test_flops_and_mfu():
    flops_per_token, mfu = mfu_mod.flops_per_token, mfu_mod.mfu
    # nanoGPT's GPT-2 small estimate: 6N + 12*L*H*Q*T
    f = flops_per_token(124_000_000, 12, 12, 64, 1024)
    assert f == 6 * 124e6 + 12 * 12 * 12 * 64 * 1024
    assert mfu(1000.0, f, None) is None
    assert mfu(1e5, f, 312e12) == pytest.approx(1e5 * f / 312e12)


@pytest.mark.parametrize("name, expect", [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA A10", 125e12),
    ("NVIDIA A10G", None),  # not the A10: unknown -> no MFU rather than a wrong one
    ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12),
    ("NVIDIA GeForce RTX 3090", 71e12),
    ("NVIDIA GeForce RTX 3090 Ti", None),
    ("Tesla V100-SXM2-16GB", 125e12),
    ("Some Future GPU", None),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None),  # a slice: the whole GPU's peak would be wrong
])
def test_peak_flops_table(name, expect):
    got = mfu_mod.peak_flops(name)
    assert (got[1] if got else None) == expect


def test_mfu_only_for_a_gpu_in_the_table_in_16_bit(monkeypatch):
    monkeypatch.setattr(mfu_mod, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    gpu = torch.device("cuda", 0)  # a device object only: nothing is allocated on it
    assert mfu_mod.mfu_peak(Precision(gpu, torch.bfloat16), gpus=2) == 2 * 989e12
    assert mfu_mod.mfu_peak(Precision(gpu, torch.float32)) is None  # float32: no datasheet figure, no MFU
    for device in ("cpu", "mps"):
        assert mfu_mod.mfu_peak(Precision(torch.device(device), torch.bfloat16)) is None


def test_a_resume_past_max_iters_prints_no_negative_counts(tmp_path, caplog):
    """Issue 50: resuming a step-400 checkpoint with train.max_iters=5 printed "-395 steps to go =
    -606.72K tokens" before "nothing to train". No count or duration a run prints is negative."""
    c = Config()
    c.train.max_iters = 5
    st = TrainState(batch_tokens=1536, step=400)
    tokenizer = types.SimpleNamespace(describe=lambda: "char")
    data = types.SimpleNamespace(tokenizer=tokenizer, dir=tmp_path,
                                 token_files=lambda: ([0] * 90, [0] * 9))
    model = types.SimpleNamespace(num_params=lambda: 1000, config=c.model.with_vocab(65))
    with caplog.at_level("INFO"):
        mt.RunLog(5).start(c, tmp_path / "run", st, data=data, model=model, ranks=Ranks(),
                           precision=setup_precision(torch.device("cpu"), "float32"),
                           compiled=False, source=None, resumed_from=None, config_diff=[])
    batch = next(m for m in caplog.messages if m.startswith("global batch: "))
    assert "no steps to go (step 400 of train.max_iters=5)" in batch
    assert re.search(r"-\d", batch) is None  # no negative number anywhere in it
    durations = [mt.format_duration(s) for s in (-5.0, 0.4, 61, 3723)]
    assert durations == ["0s", "0s", "1m01s", "1h02m03s"]
