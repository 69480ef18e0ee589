"""training/loop.py: short CPU runs through train(cfg, run_dir) with a tiny model on a tiny corpus."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import threading

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.helpers import REPO, find_non_plain
from tests.log_lines import done_fields, eval_lines, resume_with
from checkpoint import file as ck
from checkpoint.file import model_from_checkpoint
from training import edge as edge_mod
from training import loop as loop_mod
from launch.config import register_configs
from launch.run import train
from training.step import TrainingDiverged

register_configs()

TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        "train.batch_size=4", "train.eval_iters=2", "train.log_interval=2", "train.eval_at_start=false",
        "optim.warmup_iters=2"]


TRAIN_PY = shlex.quote(str(REPO / "train.py"))  # as a printed command names it from the test's cwd (a tmp dir)


def make_cfg(corpus, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=[*TINY, "data=text", f"data.path={corpus}", *overrides])


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_short_run_writes_checkpoints_metrics_and_plot(tmp_path, tiny_corpus, caplog, monkeypatch):
    import runtime
    monkeypatch.delattr(runtime, "distributed", raising=False)  # one process: the process-group code is never
    monkeypatch.setitem(sys.modules, "runtime.distributed", None)  # imported (an import would raise ImportError)
    run = tmp_path / "run"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=3"), run)
    logged = [r.message for r in caplog.records]
    assert any(m.startswith("device: cpu (CPU, 1 thread), ") for m in logged)  # tests run with 1 thread
    assert any(m.startswith("preparing text (") for m in logged)  # the data notes reach train.log too
    assert any(m.startswith("prepared ") and " val tokens in " in m for m in logged)
    assert (res.status, res.step, res.exit_code) == ("completed", 6, 0)
    assert {"last.pt", "best.pt", "metrics.jsonl", "loss.png"} <= {p.name for p in run.iterdir()}
    last = ck.load_checkpoint(run / "last.pt")
    assert last["step"] == 6 and last["format"] == "tinygpt" and last["version"] == 1
    assert find_non_plain(last) is None
    assert torch.load(run / "last.pt", weights_only=True)["loader"] == {"step": 6, "micro": 0}
    assert not any(k.startswith("_orig_mod.") for k in last["model"])
    assert last["tokenizer"]["type"] == "char" and last["model_config"]["n_layer"] == 2
    assert last["config"]["train"]["max_iters"] == 6 and last["wandb_run_id"] is None
    assert set(last["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert model_from_checkpoint(last).config.vocab_size == last["model_config"]["vocab_size"]

    recs = records(run)
    evals = [r for r in recs if r["type"] == "eval"]
    trains = [r for r in recs if r["type"] == "train"]
    assert [e["step"] for e in evals] == [3, 6] and [t["step"] for t in trains] == [2, 4, 6]
    assert set(evals[0]) >= {"step", "train_loss", "val_loss", "lr", "tokens", "elapsed_s"}
    assert set(trains[0]) >= {"step", "loss", "grad_norm", "lr", "tokens", "elapsed_s", "tokens_per_s"}
    assert all(t["grad_norm"] > 0 for t in trains)  # logged by default (issue 44), on each step line too
    assert any(re.match(r"step 2/6: loss \d\.\d{4} \| grad_norm \d+\.\d{4} \| lr ", m) for m in logged)
    assert "mfu" not in trains[0]  # no MFU on CPU
    assert evals[1]["tokens"] == 6 * 4 * 16
    summary = recs[-1]
    assert summary["type"] == "summary" and summary["status"] == "completed"
    assert summary["best_val_loss"] == pytest.approx(min(e["val_loss"] for e in evals))
    assert set(summary) >= {"best_val_loss", "tokens", "wall_s", "mean_tokens_per_s"}
    best = ck.load_checkpoint(run / "best.pt")
    assert best["step"] == summary["best_step"] and best["best_val_loss"] == summary["best_val_loss"]


def _tensors(ckpt):
    out = {f"model.{k}": v for k, v in ckpt["model"].items()}
    for pid, st in ckpt["optimizer"]["state"].items():
        for k, v in st.items():
            out[f"opt.{pid}.{k}"] = v
    return out


def test_resume_is_bitwise_exact(tmp_path, tiny_corpus):
    """8 steps straight == 4 steps + resume + 4 steps (dropout on, so RNG state matters)."""
    common = ["model.dropout=0.2", "optim.decay_iters=8", "train.eval_interval=4"]
    straight = tmp_path / "straight"
    train(make_cfg(tiny_corpus, *common, "train.max_iters=8"), straight)
    split = tmp_path / "split"
    train(make_cfg(tiny_corpus, *common, "train.max_iters=4"), split)
    res = train(make_cfg(tiny_corpus, *common, "train.max_iters=8", "train.resume=true"), split)
    assert res.step == 8
    a, b = ck.load_checkpoint(straight / "last.pt"), ck.load_checkpoint(split / "last.pt")
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys() and len(ta) > 10
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert a["best_val_loss"] == b["best_val_loss"]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")}  # noqa: E731
                        for r in rs if r["type"] != "summary"]
    assert strip(records(straight)) == strip(records(split))


@pytest.mark.slow  # over ~1 s
def test_resume_from_path_into_a_new_run_dir(tmp_path, tiny_corpus, caplog):
    """... and its step lines and done line both count the whole run's time (the earlier part: an hour here), the
    done line this session's too (it counted only this session's, below the step lines' figure)."""
    first = tmp_path / "first"
    train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=2", "optim.decay_iters=6"), first)
    hour = ck.load_checkpoint(first / "last.pt")
    ck.save_checkpoint({**hour, "elapsed_s": 3600.0}, tmp_path / "hour.pt")
    second = tmp_path / "second"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=2", "optim.decay_iters=6",
                             f"train.resume={first}"), second)  # a run dir means its last.pt
    assert res.step == 6 and ck.load_checkpoint(second / "last.pt")["step"] == 6
    assert ck.load_checkpoint(first / "last.pt")["step"] == 4  # the source is left alone
    assert [r["step"] for r in records(second) if r["type"] == "eval"] == [2, 4, 6]
    caplog.clear()
    with caplog.at_level("INFO"):
        train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=2", "optim.decay_iters=6",
                       f"train.resume={tmp_path / 'hour.pt'}"), tmp_path / "third")
    step = eval_lines(caplog.messages)[-1]
    done = done_fields(next(m for m in caplog.messages if m.startswith("done: ")))
    assert step["step"] == 6 and re.fullmatch(r"1h00m[0-5][0-9]s", step["elapsed"]), step
    assert (done["steps"], done["tokens"]) == (6, "384"), done
    assert re.fullmatch(r"1h00m[0-5][0-9]s", done["time"]), done
    assert re.fullmatch(r"[0-9]+s", done["session"]), done
    assert records(tmp_path / "third")[-2]["elapsed_s"] >= 3600


@pytest.mark.slow  # over ~1 s
def test_tokens_count_across_a_resume_with_another_batch(tmp_path, tiny_corpus):
    """4 steps at batch 4, then 2 more at batch 2: 4*4*16 + 2*2*16 tokens, not 6 x the new batch. A checkpoint
    from before the `tokens` field counts its steps at its own config's batch."""
    first = tmp_path / "first"
    train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=4", "optim.decay_iters=6"), first)
    assert ck.load_checkpoint(first / "last.pt")["tokens"] == 4 * 4 * 16
    old = ck.load_checkpoint(first / "last.pt")
    del old["tokens"]
    ck.save_checkpoint(old, tmp_path / "old.pt")
    expected = 4 * 4 * 16 + 2 * 2 * 16
    for src, run in ((first, tmp_path / "second"), (tmp_path / "old.pt", tmp_path / "from_old")):
        train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=2", "optim.decay_iters=6",
                       "train.batch_size=2", f"train.resume={src}"), run)
        recs = records(run)
        tokens = {(r["type"], r["step"]): r["tokens"] for r in recs if r["type"] != "summary"}
        assert tokens[("train", 6)] == tokens[("eval", 6)] == expected
        assert all(n == step * 4 * 16 for (_, step), n in tokens.items() if step <= 4)  # the first run's
        assert recs[-1]["type"] == "summary" and recs[-1]["tokens"] == expected
        assert ck.load_checkpoint(run / "last.pt")["tokens"] == expected


@pytest.mark.slow  # over ~1 s
def test_resume_refusals(tmp_path, tiny_corpus):
    run = tmp_path / "run"
    train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2"), run)
    before = (run / "last.pt").read_bytes()
    with pytest.raises(ValueError, match="already holds last.pt"):
        train(make_cfg(tiny_corpus, "train.max_iters=2"), run)
    with pytest.raises(ValueError, match=r"the model does not match the checkpoint.*n_layer=3.*model.n_layer=2"):
        train(make_cfg(tiny_corpus, "train.max_iters=4", "train.resume=true", "model.n_layer=3"), run)
    other = tmp_path / "other.txt"
    other.write_text("completely different characters 0123456789 XYZ\n" * 200)
    with pytest.raises(ValueError, match="vocabulary .* differs from the checkpoint's"):
        train(make_cfg(other, "train.max_iters=4", f"train.resume={run / 'last.pt'}"), tmp_path / "x")
    with pytest.raises(ValueError, match="has no last.pt"):
        train(make_cfg(tiny_corpus, "train.resume=true"), tmp_path / "empty")
    assert (run / "last.pt").read_bytes() == before


def test_divergence_before_any_checkpoint_does_not_offer_to_resume(tmp_path, tiny_corpus):
    """With no checkpoint written yet the message says so and tells only to start again (it offered to resume)."""
    blowup = ["model=tiny", "optim.lr=1e6", "optim.min_lr=0", "optim.warmup_iters=0", "optim.grad_clip=0"]
    with pytest.raises(TrainingDiverged) as info:
        train(make_cfg(tiny_corpus, "train.max_iters=40", "train.eval_interval=40", *blowup), tmp_path / "run")
    msg = str(info.value)
    assert "no checkpoint had been written yet" in msg and msg.endswith("then start again") and "resume" not in msg


@pytest.mark.slow  # over ~1 s
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, tiny_corpus):
    run = tmp_path / "run"
    gpt2 = "model=tiny"  # GPT-2's decoder blows up at once; the modern one (QK-norm) takes a few more steps
    train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2", gpt2), run)
    good = (run / "last.pt").read_bytes()
    blowup = [gpt2, "optim.lr=1e6", "optim.min_lr=0", "optim.warmup_iters=0", "optim.grad_clip=0"]
    with pytest.raises(TrainingDiverged, match=r"the loss became (nan|inf) at step \d+ .*last good checkpoint "
                                               r".*last.pt \(step 2\) is intact") as info:
        train(make_cfg(tiny_corpus, "train.max_iters=40", "train.eval_interval=4", "train.resume=true", *blowup),
              run)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    assert (run / "last.pt").read_bytes() == good  # never overwritten with a diverged state
    assert records(run)[-1]["status"] == "diverged"
    with pytest.raises(TrainingDiverged, match="no checkpoint had been written yet"):
        train(make_cfg(tiny_corpus, "train.max_iters=40", *blowup), tmp_path / "fresh")


def _after_step(n, *signals):
    """The loop's optimizer_step, sending `signals` to this process once step n (counted from 1) has finished."""
    real, count = loop_mod.optimizer_step, itertools.count(1)

    def step(*args, **kwargs):
        out = real(*args, **kwargs)
        if next(count) == n:
            for s in signals:
                os.kill(os.getpid(), s)
        return out
    return step


def test_sigterm_finishes_the_step_and_saves(tmp_path, tiny_corpus, monkeypatch):
    monkeypatch.setattr(loop_mod, "optimizer_step", _after_step(5, signal.SIGTERM))  # mid-run, after 5 finished steps
    run = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    res = train(make_cfg(tiny_corpus, "train.max_iters=50", "train.eval_interval=100"), run)
    assert (res.status, res.exit_code, res.step) == ("interrupted", 143, 5)
    assert ck.load_checkpoint(run / "last.pt")["step"] == 5
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    assert records(run)[-1]["status"] == "interrupted"


PIPE = "a closed output pipe (the output's reader went away)"


@pytest.fixture
def reader(monkeypatch):
    """runtime.console's "stdout's reader has left" flag, fresh for the test: set() it to close the pipe."""
    from runtime import console
    gone = threading.Event()
    monkeypatch.setattr(console, "_gone", gone)
    return gone


def _reader_leaves_after_step(n, gone):
    """The loop's optimizer_step, the output's reader leaving once step n (counted from 1) has finished."""
    real, count = loop_mod.optimizer_step, itertools.count(1)

    def step(*args, **kwargs):
        out = real(*args, **kwargs)
        if next(count) == n:
            gone.set()
        return out
    return step


def test_a_closed_pipe_before_step_1_is_a_stop_with_nothing_to_save(tmp_path, tiny_corpus, reader, caplog):
    """Was a step-0 last.pt ("saved ...; resume with") or, from a stderr write, `error: [Errno 32] Broken pipe` and
    "status": "failed". Now the run is stopped, said in words, and a fresh run has nothing to save."""
    reader.set()
    run = tmp_path / "run"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=5", "train.eval_at_start=true"), run)
    assert (res.status, res.exit_code, res.step) == ("stopped", 141, 0)
    assert caplog.records[-1].message == f"stopped by {PIPE} before step 1: nothing to save and nothing needs resuming"
    assert not (run / "last.pt").exists()
    assert (records(run)[-1]["status"], records(run)[-1]["stopped_by"]) == ("stopped", PIPE)


def test_a_closed_pipe_before_a_resumed_run_s_first_step_saves_nothing_new(tmp_path, tiny_corpus, reader, caplog):
    run = tmp_path / "run"
    train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2"), run)
    before = (run / "last.pt").read_bytes()
    reader.set()
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=2", "train.resume=true"), run)
    assert (res.status, res.exit_code, res.step) == ("stopped", 141, 2) and (run / "last.pt").read_bytes() == before
    assert caplog.records[-1].message.startswith(f"stopped by {PIPE} before step 3: nothing new to save "
                                                 f"({run / 'last.pt'} is from step 2); resume with: python {TRAIN_PY} ")


@pytest.mark.parametrize("after, stopped", [(3, True), (6, False)], ids=["during", "at-the-end"])
def test_a_closed_pipe_during_the_run_stops_it_and_at_the_end_leaves_it_completed(tmp_path, tiny_corpus, reader,
                                                                                 monkeypatch, caplog, after, stopped):
    monkeypatch.setattr(loop_mod, "optimizer_step", _reader_leaves_after_step(after, reader))
    run = tmp_path / "run"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=100"), run)
    summary = records(run)[-1]
    assert ck.load_checkpoint(run / "last.pt")["step"] == res.step == after
    if stopped:
        assert (res.status, res.exit_code, summary["status"], summary["stopped_by"]) == ("stopped", 141, "stopped", PIPE)
        assert caplog.records[-1].message.startswith(f"stopped by {PIPE} after step 3: saved {run / 'last.pt'}; ")
    else:  # (its last lines went to train.log only)
        assert (res.status, res.exit_code, summary["status"]) == ("completed", 0, "completed")
        assert "stopped_by" not in summary and done_fields(caplog.records[-1].message)["steps"] == 6


def test_a_library_s_write_to_the_closed_pipe_mid_step_is_a_stop_too(tmp_path, tiny_corpus, monkeypatch, caplog):
    """A BrokenPipeError past the console (a library printing) ends the step at once, as a second Ctrl-C does:
    stopped, 141, the last good checkpoint named; not `error: [Errno 32] Broken pipe` and "failed"."""
    real, count = loop_mod.optimizer_step, itertools.count(1)

    def step(*args, **kwargs):
        if next(count) == 3:
            raise BrokenPipeError(32, "Broken pipe")
        return real(*args, **kwargs)
    monkeypatch.setattr(loop_mod, "optimizer_step", step)
    run = tmp_path / "run"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=6", "train.eval_interval=2"), run)
    assert (res.status, res.exit_code, res.step) == ("stopped", 141, 2)
    assert caplog.records[-1].message.startswith(f"stopped by {PIPE} mid-step; last.pt is from step 2: resume with: ")
    assert (records(run)[-1]["status"], records(run)[-1]["stopped_by"]) == ("stopped", PIPE)


def test_ctrl_c_during_a_long_eval_stops_promptly(tmp_path, tiny_corpus, monkeypatch):
    from data.loader import BatchLoader
    real_eval_batch = BatchLoader.eval_batch
    calls = []

    def eval_batch_then_sigint(self, split, i):
        calls.append(i)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real_eval_batch(self, split, i)

    monkeypatch.setattr(BatchLoader, "eval_batch", eval_batch_then_sigint)
    run = tmp_path / "run"
    before = signal.getsignal(signal.SIGINT)
    res = train(make_cfg(tiny_corpus, "train.max_iters=50", "train.eval_interval=3", "train.eval_iters=500"), run)
    assert (res.exit_code, res.step, len(calls)) == (130, 3, 1)  # not 1000 eval batches first
    assert ck.load_checkpoint(run / "last.pt")["step"] == 3
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow  # over ~1 s
def test_compile_failure_falls_back_to_eager(tmp_path, tiny_corpus, monkeypatch, caplog):
    """A compiler that fails on first use: one warning, then the same result as eager."""
    def broken(gm, example_inputs):  # a torch.compile backend that fails, as inductor without a C++ compiler does
        raise RuntimeError("backend compiler failed: no C++ compiler\nmore detail")

    def compile_regions(model):
        for block in model.transformer.h:
            block.compile(backend=broken)
        model.output = torch.compile(model.output, backend=broken)

    monkeypatch.setattr(edge_mod, "compile_regions", compile_regions)
    eager = tmp_path / "eager"
    train(make_cfg(tiny_corpus, "train.max_iters=3", "model.dropout=0.1", "train.eval_interval=3"), eager)
    comp = tmp_path / "comp"
    with caplog.at_level("WARNING"):
        train(make_cfg(tiny_corpus, "train.max_iters=3", "model.dropout=0.1", "train.eval_interval=3",
                       "train.compile=true"), comp)
    assert sum("torch.compile failed" in r.message for r in caplog.records) == 1
    a, b = ck.load_checkpoint(eager / "last.pt"), ck.load_checkpoint(comp / "last.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_out_of_memory_under_compile_is_not_a_compile_failure(tmp_path, tiny_corpus, monkeypatch, caplog):
    """OOM on the first compiled step propagates (train.py turns it into one line); no eager retry."""
    calls = []

    def compile_regions(model):  # the compiled output region runs out of memory at its first call
        def output(*a, **kw):
            calls.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        model.output = output

    monkeypatch.setattr(edge_mod, "compile_regions", compile_regions)
    with caplog.at_level("WARNING"), pytest.raises(torch.OutOfMemoryError):
        train(make_cfg(tiny_corpus, "train.max_iters=3", "train.compile=true"), tmp_path / "run")
    assert len(calls) == 1 and not [r for r in caplog.records if "torch.compile failed" in r.message]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="torch.compile's CPU backend needs a C compiler")
def test_real_compile_trains_like_eager_and_resumes(tmp_path, tiny_corpus, caplog):
    """train.compile=true for real (the CUDA default; inductor's CPU backend here): no fallback, the same
    losses as eager up to kernel rounding, checkpoint keys without the compiled wrapper's prefix, and a
    compiled resume that continues where it stopped."""
    eager, comp = tmp_path / "eager", tmp_path / "comp"
    train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=2"), eager)
    with caplog.at_level("WARNING"):
        train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2", "train.compile=true"), comp)
        res = train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=2", "train.compile=true",
                             "train.resume=true"), comp)
    assert res.step == 4 and not [r for r in caplog.records if "compile" in r.message]
    a, b = ck.load_checkpoint(eager / "last.pt"), ck.load_checkpoint(comp / "last.pt")
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k], rtol=1e-4, atol=1e-5, msg=k)
    ea, eb = [[r for r in records(d) if r["type"] == "eval"] for d in (eager, comp)]
    assert [r["step"] for r in eb] == [2, 4]
    assert [r["val_loss"] for r in eb] == pytest.approx([r["val_loss"] for r in ea], rel=1e-4)


@pytest.mark.slow  # over ~1 s
def test_grad_accumulation_matches_a_bigger_batch(tmp_path, tiny_corpus):
    """batch 2 x accum 2 sees the same windows as batch 4 x accum 1: same loss, near-same weights."""
    a = train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2", "train.batch_size=4"),
              tmp_path / "a")
    b = train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2", "train.batch_size=2",
                       "train.grad_accum_steps=2"), tmp_path / "b")
    ra, rb = records(a.run_dir), records(b.run_dir)
    assert ra[0]["loss"] == pytest.approx(rb[0]["loss"], abs=1e-5)
    ca, cb = ck.load_checkpoint(a.run_dir / "last.pt"), ck.load_checkpoint(b.run_dir / "last.pt")
    for k in ca["model"]:
        assert torch.allclose(ca["model"][k], cb["model"][k], atol=1e-5), k


@pytest.mark.slow  # over ~1 s
def test_wandb_online_without_key_is_one_line(tmp_path, tiny_corpus, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    with pytest.raises(ValueError, match="logger.mode=offline") as info:
        train(make_cfg(tiny_corpus, "train.max_iters=2", "logger=wandb", "logger.mode=online"), tmp_path / "run")
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_wandb_offline_run_keeps_its_id_across_resume(tmp_path, tiny_corpus, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    run = tmp_path / "run"
    wb = ["logger=wandb", "logger.mode=offline", "train.eval_interval=2", "optim.decay_iters=4"]
    train(make_cfg(tiny_corpus, "train.max_iters=2", *wb), run)
    run_id = ck.load_checkpoint(run / "last.pt")["wandb_run_id"]
    assert run_id and list((run / "wandb").glob(f"offline-run-*-{run_id}"))
    train(make_cfg(tiny_corpus, "train.max_iters=4", "train.resume=true", *wb), run)
    assert ck.load_checkpoint(run / "last.pt")["wandb_run_id"] == run_id


@pytest.mark.slow
def test_loss_decreases_on_tiny_shakespeare(tmp_path, cache_with_shakespeare):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[
            "experiment=cpu", "train.device=cpu", "optim=adamw", "train.eval_at_start=true", "model.n_layer=2", "model.n_head=2",
            "model.n_embd=64", "model.block_size=32", "train.batch_size=16", "train.max_iters=150", "train.eval_interval=150", "train.eval_iters=10",
            "train.log_interval=50", "optim.lr=3e-3", "optim.warmup_iters=10", "optim.min_lr=3e-4"])
    res = train(cfg, tmp_path / "run")
    evals = [r for r in records(tmp_path / "run") if r["type"] == "eval"]
    assert evals[0]["step"] == 0 and evals[0]["val_loss"] == pytest.approx(math.log(65), abs=0.15)
    assert res.best_val_loss < 2.75 < evals[0]["val_loss"] - 1.2


def test_eval_records_and_lines_carry_bits_per_byte(tmp_path, tiny_corpus, caplog):
    """ASCII text, one byte per character: bits per byte = nats / ln 2, for both splits."""
    with caplog.at_level("INFO"):
        train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2"), tmp_path / "run")
    ev = [r for r in records(tmp_path / "run") if r["type"] == "eval"][-1]
    assert ev["val_bpb"] == pytest.approx(ev["val_loss"] / math.log(2), rel=1e-6)
    assert ev["train_bpb"] == pytest.approx(ev["train_loss"] / math.log(2), rel=1e-6)
    line = eval_lines(caplog.messages)[-1]
    assert line["step"] == 2 and line["best"]
    for name in ("train_loss", "train_bpb", "val_loss", "val_bpb"):
        assert line[name] == pytest.approx(ev[name], abs=5e-5), name


def _scripted_val_losses(monkeypatch, losses):
    """Evaluations whose val losses are `losses`, in order (train losses: 9.0)."""
    it = iter(losses)
    real = loop_mod.evaluate

    def scripted(run, hooks):
        stats = real(run, hooks)
        stats["val"] = {"loss": next(it), "bpb": None}
        return {**stats, "train": {"loss": 9.0, "bpb": None}}
    monkeypatch.setattr(loop_mod, "evaluate", scripted)
    monkeypatch.setattr(edge_mod, "evaluate", scripted)


@pytest.mark.slow  # over ~1 s
def test_patience_stops_early_and_ends_normally(tmp_path, tiny_corpus, monkeypatch, caplog):
    """train.patience=2: best at step 4, no better at 6 and 8 -> stop after step 8's evaluation, exit 0."""
    _scripted_val_losses(monkeypatch, [3.0, 2.0, 2.5, 2.1, 1.0])
    run = tmp_path / "run"
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=20", "train.eval_interval=2", "train.patience=2"), run)
    assert (res.status, res.exit_code, res.step, res.early_stopped, res.best_val_loss) == ("completed", 0, 8, True, 2.0)
    assert ck.load_checkpoint(run / "last.pt")["step"] == 8 and ck.load_checkpoint(run / "best.pt")["step"] == 4
    logged = [r.message for r in caplog.records]
    early = next(m for m in logged if m.startswith("early stop at step 8: "))
    assert "train.patience=2" in early and "2.0000 at step 4" in early, early
    assert (done_fields(logged[-1])["steps"], done_fields(logged[-1])["best_step"]) == (8, 4)
    summary = records(run)[-1]
    assert (summary["status"], summary["early_stopped"], summary["best_step"]) == ("completed", True, 4)
    caplog.clear()
    with caplog.at_level("INFO"):  # resumed with the same patience: nothing to do
        res = train(make_cfg(tiny_corpus, "train.max_iters=20", "train.eval_interval=2", "train.patience=2",
                             "train.resume=true"), run)
    assert res.step == 8 and any("nothing to train (raise train.patience to continue)" in r.message
                                 for r in caplog.records)
    _scripted_val_losses(monkeypatch, [1.5])  # more patience: it goes on (and improves at step 10)
    res = train(make_cfg(tiny_corpus, "train.max_iters=10", "train.eval_interval=2", "train.patience=3",
                         "train.resume=true"), run)
    assert (res.step, res.early_stopped, res.best_val_loss) == (10, False, 1.5)


def test_a_second_ctrl_c_aborts_with_one_closing_line(tmp_path, tiny_corpus, monkeypatch, caplog):
    # step 5: a clean stop, asked for, and a second Ctrl-C: abort at once
    monkeypatch.setattr(loop_mod, "optimizer_step", _after_step(5, signal.SIGINT, signal.SIGINT))
    run, before = tmp_path / "run", signal.getsignal(signal.SIGINT)
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=50", "train.eval_interval=2"), run,
                    cli_overrides=["train.max_iters=50"])
    assert (res.status, res.exit_code, res.step) == ("interrupted", 130, 4)  # step 5 never finished
    closing = caplog.records[-1].message
    assert closing.startswith("interrupted; last.pt is from step 4: "), closing
    assert resume_with(closing) == ["python", str(REPO / "train.py"), "train.max_iters=50",
                                    f"hydra.run.dir={run}", "train.resume=true"]
    assert not any(r.message.startswith("stopped by") for r in caplog.records)
    assert ck.load_checkpoint(run / "last.pt")["step"] == 4 and records(run)[-1]["status"] == "interrupted"
    assert signal.getsignal(signal.SIGINT) is before
    monkeypatch.setattr(loop_mod, "optimizer_step", _after_step(1, signal.SIGINT, signal.SIGINT))  # no checkpoint yet
    caplog.clear()
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=50", "train.eval_interval=2"), tmp_path / "fresh")
    assert res.exit_code == 130 and caplog.records[-1].message == "interrupted; no checkpoint was written yet"


def test_a_ctrl_c_while_finishing_a_stopped_run_keeps_one_true_closing_line(tmp_path, tiny_corpus, monkeypatch,
                                                                           caplog):
    """The first Ctrl-C stopped the run cleanly (last.pt at step 3); the second lands while loss.png is drawn."""
    from training.metrics import RunLog
    def finish(self, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(loop_mod, "optimizer_step", _after_step(3, signal.SIGINT))
    monkeypatch.setattr(RunLog, "finish", finish)
    with caplog.at_level("INFO"):
        res = train(make_cfg(tiny_corpus, "train.max_iters=50", "train.eval_interval=2"), tmp_path / "run")
    assert (res.exit_code, res.step) == (130, 3) and ck.load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 3
    assert caplog.records[-1].message.startswith("interrupted; last.pt is from step 3: resume with: ")


def _hellaswag(path, *rows):
    row = {"ctx": "the king", "endings": ["is good", "is fair", "speak", "go away"], "label": 0}
    path.write_text("".join(json.dumps({**row, **r}) + "\n" for r in (row, *rows)))
    return path


@pytest.mark.parametrize("row, why", [
    ({"ctx": "the king \u20ac"}, "characters not in the vocabulary: '\u20ac'"),
    ({"endings": ["the king is good and fair", "go", "go", "go"]}, "an ending is 26 tokens, more than the model's "
                                                                     "context of 16: drop that example"),
])
def test_an_unscorable_hellaswag_file_is_refused_before_step_1(tmp_path, tiny_corpus, monkeypatch, row, why):
    """Issue 29: a row the model cannot score is one line naming the file and row, before any step or file."""
    hs = _hellaswag(tmp_path / "hs.jsonl", row)
    monkeypatch.setattr(loop_mod, "forward_backward", lambda *a, **k: pytest.fail("trained a step"))
    with pytest.raises(ValueError) as e:
        train(make_cfg(tiny_corpus, "train.max_iters=2", f"train.hellaswag={hs}"), tmp_path / "run")
    assert str(e.value).startswith(f"train.hellaswag={hs} line 2: {why}") and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # over ~1 s
def test_a_failing_evaluation_keeps_the_checkpoint_and_no_best_without_its_file(tmp_path, tiny_corpus, monkeypatch):
    """Issue 29: the step's checkpoint is written before HellaSwag scores; a save that fails records no best."""
    from training import eval_hellaswag

    def fails(*args, **kwargs):
        raise ValueError("scoring failed")
    monkeypatch.setattr(eval_hellaswag, "at_eval", fails)
    run, hs = tmp_path / "run", _hellaswag(tmp_path / "hs.jsonl")
    with pytest.raises(ValueError, match="scoring failed"):
        train(make_cfg(tiny_corpus, "train.max_iters=4", "train.eval_interval=2", f"train.hellaswag={hs}"), run)
    summary = records(run)[-1]
    assert summary["status"] == "failed" and summary["best_step"] == 2
    assert ck.load_checkpoint(run / "last.pt")["step"] == ck.load_checkpoint(run / "best.pt")["step"] == 2

    def disk_full(self, step, best=False):
        raise OSError("could not write checkpoint: no space left on device")
    monkeypatch.setattr(edge_mod.CheckpointManager, "save", disk_full)
    with pytest.raises(OSError, match="no space left"):
        train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2"), tmp_path / "full")
    summary = records(tmp_path / "full")[-1]
    assert (summary["status"], summary["best_step"], summary["best_val_loss"]) == ("failed", None, None)


def test_resuming_a_muon_run_with_adamw_names_optim_muon(tmp_path, tiny_corpus):
    """Issue 29: experiment=cpu trains with Muon; resuming it with optim=adamw says which optimizer to pass."""
    run = tmp_path / "run"
    train(make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2"), run)
    with pytest.raises(ValueError) as e:
        train(make_cfg(tiny_corpus, "train.max_iters=4", "train.resume=true", "optim=adamw"), run)
    assert str(e.value) == (f"the optimizer state in {run / 'last.pt'} does not fit this model (trained with "
                            f"optim=muon, this run has optim=adamw): resume with the settings it was trained with: "
                            f"optim=muon")


def test_a_long_evaluation_shows_its_progress_without_a_terminal(tmp_path, tiny_corpus, monkeypatch,
                                                                  caplog):
    """Issue 50: `experiment=null train.max_iters=5` on a CPU sat silent through a 5-minute
    evaluation. Without a terminal (no bar) a long evaluation says how far it is in plain lines
    (here: after every batch, the waits made 0)."""
    from runtime.console import Progress
    monkeypatch.setattr(Progress, "PLAIN_AFTER_S", 0.0)
    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    cfg = make_cfg(tiny_corpus, "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=3")
    with caplog.at_level("INFO"):
        train(cfg, tmp_path / "run")
    said = [r.message.split(" batches")[0] for r in caplog.records
            if r.message.startswith("evaluating the ")]
    # (3/3: the evaluation's own line follows)
    assert said == [f"evaluating the {s} split: {i}/3" for s in ("train", "val") for i in (1, 2)]
