"""Faults, end to end through `python train.py`: kill -9, Ctrl-C then an exact resume, a full disk, NaN.

These are the reliability proofs of issue 7. Most run the real CLI in subprocesses (the in-process
basics of resume exactness, NaN and SIGTERM live in test_training_loop.py / test_train_cli.py and are
not repeated here); the in-process tests at the end pin down the awkward places a stop can land (mid
log window, mid evaluation, a kill right after a checkpoint) deterministically. Models are tiny
(2 layers, 32 wide, context 32) and every child runs with one OpenMP thread, so the tests stay cheap on
a busy 2-core machine.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, find_non_plain
from checkpoint import file as ck
from checkpoint.file import model_from_checkpoint

TINY = ["experiment=cpu", "train.device=cpu", "train.eval_at_start=true", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.eval_iters=2", "optim.warmup_iters=2"]
KILLS = 10


def _env(tmp_path: Path, **extra) -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               WANDB_MODE="disabled", MPLCONFIGDIR=str(tmp_path / "mpl"))
    env.update(extra)
    return env


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _assert_one_error_line(proc_stderr: str, stdout: str = "") -> str:
    assert "Traceback" not in proc_stderr and "Traceback" not in stdout, proc_stderr
    errors = [ln for ln in proc_stderr.splitlines() if ln.startswith("error:")]
    last = _last_line(proc_stderr)
    assert len(errors) == 1 and last == errors[0], proc_stderr
    return last


def _tmp_files(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if ".tmp" in p.name)


# ------------------------------------------------------------------------------------------------ kill -9

@pytest.mark.slow
def test_kill_9_at_random_moments_never_leaves_an_unreadable_checkpoint(tmp_path, tiny_corpus):
    """SIGKILL a run with a checkpoint every 2 steps at random moments, 10 times, resuming in between.

    After every kill last.pt (and best.pt) must load and rebuild the model, and each resumed process
    must have got further than the one before. A final resume runs to completion: exit 0, no temp
    files left, and metrics.jsonl is whole (torn lines from the kills dropped, no step twice).
    """
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    env = _env(tmp_path)
    run = tmp_path / "run"
    last = run / "last.pt"
    def cmd(max_iters: int) -> list[str]:
        return [sys.executable, str(REPO / "train.py"), *TINY, "data=text", f"data.path={tiny_corpus}",
                f"train.max_iters={max_iters}", "optim.decay_iters=1000000", "train.eval_interval=2",
                "train.log_interval=1000", "train.eval_at_start=false", "hydra.run.dir=run"]
    prev_id, prev_step, steps, mid_save = None, 0, [], 0
    for i in range(KILLS):
        log_path = tmp_path / f"proc{i}.log"
        with open(log_path, "w") as log_f:
            proc = subprocess.Popen(cmd(1000000) + (["train.resume=true"] if i else []), cwd=tmp_path, env=env,
                                    stdout=log_f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while True:  # until this process has written a checkpoint of its own
                if last.exists():
                    st = os.stat(last)
                    if (st.st_ino, st.st_mtime_ns) != prev_id:
                        break
                assert proc.poll() is None, f"seed {seed}: process {i} exited early:\n{log_path.read_text()}"
                assert time.monotonic() < deadline, f"seed {seed}: no checkpoint from process {i}"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.05, 1.0))  # a random moment of the save cycle (2 steps, eval, save)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        mid_save += bool(_tmp_files(run))  # the kill landed while a checkpoint was being written
        ckpt = ck.load_checkpoint(last)  # weights_only; raises on a torn file
        model_from_checkpoint(ckpt)
        assert ckpt["step"] > prev_step, f"seed {seed}: kill {i}: step {ckpt['step']} after {prev_step}"
        if (run / "best.pt").exists():
            assert ck.load_checkpoint(run / "best.pt")["step"] <= ckpt["step"]
        st = os.stat(last)
        prev_id, prev_step = (st.st_ino, st.st_mtime_ns), ckpt["step"]
        steps.append(prev_step)
    print(f"kill -9 seed {seed}: steps at the kills {steps}; {mid_save} kills left a temp file (mid-save)")

    final = prev_step + 4
    proc = subprocess.run(cmd(final) + ["train.resume=true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ck.load_checkpoint(last)["step"] == final
    assert _tmp_files(run) == []  # temp files of killed saves were cleaned up
    recs = _records(run)  # every line is valid JSON
    evals = [r["step"] for r in recs if r["type"] == "eval"]
    assert evals == sorted(set(evals)) and evals[-1] == final
    assert evals == list(range(2, final + 1, 2))  # each eval exactly once across 11 processes
    assert recs[-1]["type"] == "summary" and recs[-1]["status"] == "completed"


# --------------------------------------------------------------------------------- Ctrl-C + exact resume

def _tensors(ckpt: dict) -> dict:
    out = {f"model.{k}": v for k, v in ckpt["model"].items()}
    for pid, state in ckpt["optimizer"]["state"].items():
        for k, v in state.items():
            out[f"optimizer.{pid}.{k}"] = v
    out["rng.torch"] = ckpt["rng"]["torch"]
    out["rng.numpy"] = ckpt["rng"]["numpy"]["keys"]
    return out


def _comparable(records: list[dict]) -> list[dict]:
    """Records without wall-clock fields (elapsed time and throughput differ between any two runs)."""
    drop = ("elapsed_s", "tokens_per_s", "wall_s", "train_s", "mean_tokens_per_s")
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


@pytest.mark.slow
def test_ctrl_c_saves_exits_130_and_the_resume_is_bitwise_exact(tmp_path, tiny_corpus):
    """Ctrl-C (SIGINT) at a random step, resume with the command the run prints, compare with a straight run.

    Dropout is on, so the RNG states must be restored exactly. The interrupted run must exit 130 with a
    clean last.pt at the step it stopped; after the resume, weights, optimizer state, RNG and loader state,
    best.pt and every metrics.jsonl record (train and eval losses, lr, tokens; summary) equal the
    uninterrupted run's.
    """
    n = 48
    common = [*TINY, "data=text", f"data.path={tiny_corpus}", "model.dropout=0.1", f"train.max_iters={n}",
              "train.eval_interval=6", "train.log_interval=3"]
    env = _env(tmp_path)
    straight = subprocess.Popen([sys.executable, str(REPO / "train.py"), *common, "hydra.run.dir=straight"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop_after = random.randint(3, 30)  # the signal goes out once the console shows this step
    split = subprocess.Popen([sys.executable, str(REPO / "train.py"), *common, "hydra.run.dir=split"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = []
        for line in split.stdout:
            out.append(line)
            m = re.match(r"step (\d+)/\d+: loss", line)
            if m and int(m.group(1)) >= stop_after:
                split.send_signal(signal.SIGINT)
                break
        rest, err = split.communicate(timeout=300)
        out = "".join(out) + rest
        s_out, s_err = straight.communicate(timeout=300)
    finally:
        for p in (split, straight):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert straight.returncode == 0, s_err
    assert split.returncode == 130, err
    assert "Traceback" not in err + out
    stopped = int(re.search(r"stopped by SIGINT after step (\d+)", out).group(1))
    assert stop_after <= stopped < n
    ckpt = ck.load_checkpoint(tmp_path / "split" / "last.pt")
    assert ckpt["step"] == stopped and find_non_plain(ckpt) is None
    assert _records(tmp_path / "split")[-1]["status"] == "interrupted"

    # resume with exactly the command the interrupted run printed
    cmd = shlex.split(re.search(r"resume with: (.*)$", out, flags=re.M).group(1))
    assert cmd[:2] == ["python", str(REPO / "train.py")] and "train.resume=true" in cmd and "hydra.run.dir=split" in cmd
    cmd = [sys.executable, str(REPO / "train.py"), *cmd[2:]]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from split/last.pt at step {stopped}" in proc.stdout

    for name in ("last.pt", "best.pt"):
        a, b = ck.load_checkpoint(tmp_path / "straight" / name), ck.load_checkpoint(tmp_path / "split" / name)
        assert (a["step"], a["best_val_loss"], a["best_step"]) == (b["step"], b["best_val_loss"], b["best_step"])
        assert a["loader"] == b["loader"] and a["rng"]["python"] == b["rng"]["python"]
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
        ta, tb = _tensors(a), _tensors(b)
        assert ta.keys() == tb.keys() and len(ta) > 20
        for k in ta:
            assert torch.equal(ta[k], tb[k]), f"{name}: {k} differs (stopped at step {stopped})"
    ra, rb = _records(tmp_path / "straight"), _records(tmp_path / "split")
    assert [r["type"] for r in ra].count("eval") == n // 6 + 1  # eval at start + every 6 steps
    assert _comparable(ra) == _comparable(rb), f"metrics differ (stopped at step {stopped})"


# -------------------------------------------------------------------------------------------- disk full

DISK_FULL = r"""
import errno, hashlib, os, runpy, sys
import torch
real_save, calls = torch.save, []

def save_then_disk_full(obj, f, *args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
        return real_save(obj, f, *args, **kwargs)
    last = os.path.join(os.path.dirname(f.name), "last.pt")
    with open(last, "rb") as prev, open(os.environ["SHA_OUT"], "w") as out:
        out.write(hashlib.sha256(prev.read()).hexdigest())
    f.write(b"PK\x03\x04 the first bytes of a checkpoint")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

torch.save = save_then_disk_full
train_py = os.path.join(os.environ["PYTHONPATH"], "train.py")
sys.argv = [train_py, *sys.argv[1:]]
runpy.run_path(train_py, run_name="__main__")
"""


@pytest.mark.slow
def test_disk_full_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, tiny_corpus):
    """`python train.py` whose second checkpoint write hits ENOSPC (torch.save patched in the child)."""
    sha_out = tmp_path / "sha_of_last_pt_when_the_disk_filled"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, *TINY, "data=text", f"data.path={tiny_corpus}",
                           "train.max_iters=50", "train.eval_interval=2", "hydra.run.dir=run"],
                          cwd=tmp_path, env=_env(tmp_path, SHA_OUT=str(sha_out)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = _assert_one_error_line(proc.stderr, proc.stdout)
    assert line.startswith("error: could not write checkpoint run/last.pt: no space left on device")
    assert "previous last.pt, if any, is intact" in line and "free some disk space" in line and "resume" in line
    run = tmp_path / "run"
    assert _sha(run / "last.pt") == sha_out.read_text()  # the step-2 checkpoint, byte for byte
    assert ck.load_checkpoint(run / "last.pt")["step"] == 2
    assert _tmp_files(run) == []  # the half-written temp file was removed
    assert line in (run / "train.log").read_text()
    assert _records(run)[-1] == {**_records(run)[-1], "type": "summary", "status": "failed", "step": 4}


# --------------------------------------------------------------------------------------------------- NaN

@pytest.mark.slow
def test_nan_loss_through_the_cli_names_the_step_and_keeps_the_good_checkpoint(tmp_path, tiny_corpus):
    from hydra import compose, initialize_config_dir

    from launch.config import register_configs
    from launch.run import train

    register_configs()
    # GPT-2's decoder blows up at once; the modern one (QK-norm) survives a few more steps
    good = [*TINY, "model=tiny", "data=text", f"data.path={tiny_corpus}", "train.eval_interval=2"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[*good, "train.max_iters=2"])
    run = tmp_path / "run"
    train(cfg, run)  # a healthy checkpoint at step 2 (in-process: saves a subprocess)
    before = _sha(run / "last.pt")

    blowup = ["optim.lr=1e6", "optim.min_lr=0", "optim.warmup_iters=0", "optim.grad_clip=0"]
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *good, *blowup, "train.max_iters=40",
                           "hydra.run.dir=run", "train.resume=true"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = _assert_one_error_line(proc.stderr, proc.stdout)
    m = re.match(r"error: the loss became (nan|inf|-inf) at step (\d+) \(lr [^)]+\): training stopped and the "
                 r"last good checkpoint run/last\.pt \(step 2\) is intact: lower optim\.lr \(now 1e\+06\)", line)
    assert m, line
    assert 2 < int(m.group(2)) <= 40
    assert _sha(run / "last.pt") == before
    ckpt = ck.load_checkpoint(run / "last.pt")
    assert ckpt["step"] == 2
    assert all(torch.isfinite(t).all() for t in _tensors(ckpt).values() if t.is_floating_point())
    assert _records(run)[-1]["status"] == "diverged"


# ------------------------------------------------------------- exact resume wherever the stop lands

class _Killed(BaseException):
    """Stands in for kill -9 right after a checkpoint was written (in-process, deterministic)."""


def _in_process_cfg(corpus, *overrides):
    from hydra import compose, initialize_config_dir

    from launch.config import register_configs
    register_configs()
    # log_interval=4 does not divide eval_interval=6: checkpoints fall in the middle of a loss window
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=[*TINY, "data=text", f"data.path={corpus}", "model.dropout=0.1",
                                            "train.max_iters=18", "train.eval_interval=6", "train.log_interval=4",
                                            *overrides])


@pytest.fixture
def straight_run(tmp_path, tiny_corpus):
    from launch.run import train
    train(_in_process_cfg(tiny_corpus), tmp_path / "straight")
    return tmp_path / "straight"


def _assert_same_run(a: Path, b: Path, what: str) -> None:
    for name in ("last.pt", "best.pt"):
        ca, cb = ck.load_checkpoint(a / name), ck.load_checkpoint(b / name)
        assert (ca["step"], ca["best_val_loss"]) == (cb["step"], cb["best_val_loss"]), f"{what}: {name}"
        ta, tb = _tensors(ca), _tensors(cb)
        assert all(torch.equal(ta[k], tb[k]) for k in ta), f"{what}: {name} tensors differ"
    assert _comparable(_records(a)) == _comparable(_records(b)), f"{what}: metrics.jsonl differs"


@pytest.mark.slow  # over ~1 s
@pytest.mark.parametrize("where", ["signal-mid-log-window", "signal-during-eval", "kill-after-checkpoint"])
def test_resume_is_exact_wherever_the_stop_lands(tmp_path, tiny_corpus, straight_run, monkeypatch, where):
    """SIGTERM between two log lines, SIGTERM in the middle of an evaluation, and a kill right after a
    checkpoint whose loss window is half full: each resumed run equals the straight one, metrics included."""
    from data.loader import BatchLoader
    from training import edge as edge_mod
    from training import loop as loop_mod
    from launch.run import train

    run = tmp_path / "split"
    with monkeypatch.context() as mp:
        if where == "signal-mid-log-window":
            real_step, steps = loop_mod.optimizer_step, []

            def step(*args, **kwargs):
                out = real_step(*args, **kwargs)
                steps.append(1)
                if len(steps) == 10:  # after step 10; log lines at 4, 8, 12
                    os.kill(os.getpid(), signal.SIGTERM)
                return out
            mp.setattr(loop_mod, "optimizer_step", step)
        elif where == "signal-during-eval":
            real_eval = BatchLoader.eval_batch

            def eval_batch(self, split, i):
                if self.step == 12 and split == "train" and i == 0:  # the evaluation at step 12
                    os.kill(os.getpid(), signal.SIGTERM)
                return real_eval(self, split, i)
            mp.setattr(BatchLoader, "eval_batch", eval_batch)
        else:
            real_save = edge_mod.Edge._save

            def save(self, s, best=False):
                real_save(self, s, best)
                if s == 6:
                    raise _Killed
            mp.setattr(edge_mod.Edge, "_save", save)
        try:
            res = train(_in_process_cfg(tiny_corpus), run)
            assert res.exit_code == 143
        except _Killed:
            assert where == "kill-after-checkpoint"
    train(_in_process_cfg(tiny_corpus, "train.resume=true"), run)
    _assert_same_run(straight_run, run, where)


DOUBLE_CTRL_C = r"""
import os, runpy, signal, sys
from training import loop

real_step, steps = loop.optimizer_step, []

def step(*args, **kwargs):
    out = real_step(*args, **kwargs)
    steps.append(1)
    if len(steps) == 5:  # step 5: the first Ctrl-C asks for a clean stop, the second one (a moment later) aborts
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
    return out

loop.optimizer_step = step
train_py = os.path.join(os.environ["PYTHONPATH"], "train.py")
sys.argv = [train_py, *sys.argv[1:]]
runpy.run_path(train_py, run_name="__main__")
"""


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once_and_leaves_the_files_intact(tmp_path, tiny_corpus):
    """Exit 130 with one closing line (issue 15): which step last.pt is from, and how to resume; no error line."""
    proc = subprocess.run([sys.executable, "-c", DOUBLE_CTRL_C, *TINY, "data=text", f"data.path={tiny_corpus}",
                           "train.max_iters=50", "train.eval_interval=2", "hydra.run.dir=run"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and "error:" not in proc.stderr, proc.stderr
    line = _last_line(proc.stdout)
    train_py = shlex.quote(str(REPO / "train.py"))  # (run from tmp_path: named by its path)
    assert line.startswith(f"interrupted; last.pt is from step 4: resume with: python {train_py} experiment=cpu ")
    assert line.endswith(" hydra.run.dir=run train.resume=true") and "stopped by" not in proc.stdout
    assert line in (tmp_path / "run" / "train.log").read_text()
    run = tmp_path / "run"
    assert ck.load_checkpoint(run / "last.pt")["step"] == 4  # the last evaluation's checkpoint
    assert _tmp_files(run) == []
    assert _records(run)[-1]["status"] == "interrupted"


def test_outputs_latest_points_at_the_newest_run_with_a_checkpoint(tmp_path, monkeypatch):
    """Issue 24: a symlink (relative) in ./outputs, set by a run's first save; a text file holding the path where
    symlinks are not allowed; runs outside ./outputs and ./multirun leave it alone."""
    from checkpoint.manager import link_latest
    monkeypatch.chdir(tmp_path)
    for run in ("outputs/2026-01-01/10-00-00", "multirun/2026-01-01/11-00-00/0"):
        (tmp_path / run).mkdir(parents=True)
        link_latest(run)
        assert os.readlink("outputs/latest") == os.path.relpath(run, "outputs")
    link_latest(tmp_path / "elsewhere")
    assert Path("outputs/latest").resolve() == (tmp_path / "multirun/2026-01-01/11-00-00/0").resolve()
    monkeypatch.setattr(Path, "symlink_to", lambda *a, **k: (_ for _ in ()).throw(OSError("no symlinks here")))
    link_latest("outputs/2026-01-01/10-00-00")
    assert not os.path.islink("outputs/latest")
    assert Path("outputs/latest").read_text().strip() == str(tmp_path / "outputs/2026-01-01/10-00-00")
