"""`python train.py ...` as a user runs it: overrides, run directories, one-line errors, signals, sweeps."""
from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import REPO, run_cli
from tests.log_lines import eval_lines
from checkpoint import file as ck

TINY = ["train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16", "train.batch_size=4",
        "train.eval_iters=2", "train.log_interval=2", "optim.warmup_iters=2"]


def _no_traceback(proc):
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


@pytest.mark.slow
def test_run_with_overrides(tmp_path, tiny_corpus):
    proc = run_cli(["train.py", *TINY, "data=text", f"data.path={tiny_corpus}", "train.max_iters=4",
                    "train.eval_interval=2", "hydra.run.dir=run", "optim=adamw", "optim.muon_momentum=0.9"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _no_traceback(proc)
    run = tmp_path / "run"
    assert {"last.pt", "best.pt", "metrics.jsonl", "loss.png", "train.log", ".hydra"} <= {p.name for p in run.iterdir()}
    assert ck.load_checkpoint(run / "last.pt")["step"] == 4
    assert "model: " in proc.stdout and "global batch: 64 tokens per step" in proc.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # each evaluation's line says its record's values; train.log holds what the console said
    evals, shown = [r for r in records if r["type"] == "eval"], eval_lines(proc.stdout.splitlines())
    assert [f["step"] for f in shown] == [r["step"] for r in evals] == [2, 4]
    for line, record in zip(shown, evals):
        assert line["val_loss"] == pytest.approx(record["val_loss"], abs=5e-5)
    assert proc.stdout.splitlines()[-1] in (run / "train.log").read_text()
    summary = records[-1]
    assert summary["type"] == "summary" and summary["status"] == "completed"
    if not torch.cuda.is_available():  # the automatic CPU preset said so, in one line, and was applied
        line = [ln for ln in proc.stderr.splitlines() if "no CUDA GPU found" in ln]
        assert len(line) == 1 and "experiment=cpu (a 2-layer, 32-wide model with context 16, trained with AdamW)" \
            in line[0]  # issue 43: what the run trains, not the preset's model and Muon
        assert line[0] in (run / "train.log").read_text()  # the log holds what the console said
        assert ck.load_checkpoint(run / "last.pt")["config"]["train"]["batch_size"] == 4
    # issue 43: a setting the run does not read is one warning, once, on stderr and in train.log, before step 1
    warning = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: ")]
    assert warning == ["warning: optim.muon_momentum=0.9 does nothing with optim.name=adamw: only "
                       "optim.name=muon reads it: add optim.name=muon to train with Muon, or drop "
                       "it"]
    log = (run / "train.log").read_text()
    assert log.count(warning[0]) == 1 and log.index(warning[0]) < log.index("step 2/4")


@pytest.mark.slow
@pytest.mark.parametrize("args, expect", [
    (["train.max_iter=5"], "unknown config key 'train.max_iter' (did you mean train.max_iters?)"),
    (["train.max_iters=abc"], "cannot set train.max_iters=abc"),
    (["model=huge"], "model=huge is not a preset: available model presets are baby, baby_modern, gpt2, modern, tiny"),
    (["model.n_embd=130"], "model.n_embd=130 is not divisible by model.n_head=4"),
    (["optim.lr=-0.1"], "optim.lr=-0.1 must be a positive number"),
    (["data=text"], "data=text needs your text"),
    (["-m", "optim.lr=1e-3,-1"], "optim.lr=-1.0 must be a positive number"),  # every sweep job, up front
    (["train.hellaswag=nope.jsonl"], "train.hellaswag nope.jsonl does not exist: check the path"),
])
def test_config_mistakes_are_one_line_before_any_run_dir(tmp_path, args, expect):
    proc = run_cli(["train.py", "experiment=cpu", *args], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    _no_traceback(proc)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and expect in errors[0], proc.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()  # before any run dir
    assert "Warning" not in proc.stderr, proc.stderr  # no UserWarning from Hydra either


@pytest.mark.slow
def test_the_fine_tune_preset_without_a_source_is_one_line_before_any_run_dir(tmp_path):
    proc = run_cli(["train.py", "experiment=finetune_shakespeare", "train.device=cpu"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    _no_traceback(proc)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == ["error: model.init_from must be given: add model.init_from=PATH, a local Hugging Face GPT-2 "
                      "directory (e.g. hf download openai-community/gpt2 config.json model.safetensors --local-dir "
                      "gpt2) or a tinygpt run directory"]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, want", [
    ([], ["experiment=cpu"]),
    (["--info"], ["experiment=cpu", "--info"]),  # --info takes an optional value: the override goes first
    (["model=baby", "--cfg", "job"], ["experiment=cpu", "model=baby", "--cfg", "job"]),
    (["--cfg", "job", "model=baby", "-m"], ["--cfg", "job", "experiment=cpu", "model=baby", "-m"]),
])
def test_added_override_sits_with_the_users(args, want):
    from launch.config import with_override
    assert with_override(args, "experiment=cpu") == want


def test_no_experiment_in_any_spelling_trains_the_config_s_own_defaults():
    """Issue 43: `experiment=null` (the docs' spelling) stopped with Hydra's "Config group override must be a string
    or a list"; `~experiment` was "not an override"; bash turns an unquoted `experiment=~` into the home directory."""
    import train
    from launch.config import compose, register_configs, to_dataclass
    for given in ("experiment=null", "experiment=NULL", "~experiment", "~experiment=null", "experiment=~",
                  "experiment='~'", f"experiment={os.path.expanduser('~')}"):
        args, auto_cpu = train.as_composed([given, "train.max_iters=5"], cuda=False)
        assert args[0] in ("~experiment", "~experiment=null") and args[1:] == ["train.max_iters=5"], given
        assert not auto_cpu
    register_configs()
    c = to_dataclass(compose(args))
    assert (c.optim.name, c.model.position, c.model.n_layer, c.train.max_iters) == ("adamw", "learned", 6, 5)


@pytest.mark.slow
def test_hydra_flags_after_overrides_work_and_a_mistake_is_one_line(tmp_path):
    """The automatic CPU preset must not break `--cfg job` after an override, nor add a line to an error."""
    proc = run_cli(["train.py", "model.n_layer=3", "--cfg", "job"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "n_layer: 3" in proc.stdout
    proc = run_cli(["train.py", "train.max_iter=5"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: unknown config key 'train.max_iter' (did you mean train.max_iters?): check the spelling; "
        f"python {REPO / 'train.py'} --cfg job prints every key"]  # (train.py by a path that runs from tmp_path)


@pytest.mark.slow
def test_runtime_mistake_is_one_line(tmp_path, tiny_corpus):
    proc = run_cli(["train.py", *TINY, "data=text", f"data.path={tiny_corpus}", "train.resume=missing.pt"],
                   cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    _no_traceback(proc)
    assert proc.stderr.strip().splitlines()[-1] == "error: checkpoint missing.pt does not exist: check the path " \
                                                   "(a run directory holds last.pt and best.pt)"


@pytest.mark.slow
def test_out_of_memory_is_one_line_that_says_what_to_lower(tmp_path, tiny_corpus):
    """A GPU OOM (simulated: the first backward raises torch.OutOfMemoryError) ends with one line, exit 2."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import torch\n"
        "def _oom(*a, **k):\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        "torch.Tensor.backward = _oom\n")
    proc = run_cli(["train.py", *TINY, "data=text", f"data.path={tiny_corpus}", "train.max_iters=4",
                    "hydra.run.dir=run"], cwd=tmp_path, timeout=120,
                   env={"PYTHONPATH": f"{hook}{os.pathsep}{REPO}"})
    assert proc.returncode == 2, proc.stderr
    _no_traceback(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: out of memory on the GPU with train.batch_size=4") and "grad_accum_steps" in last
    assert not (tmp_path / "run" / "last.pt").exists()  # nothing half-written


def _sigterm_once_training(args: list[str], cwd, env: dict):
    """Start train.py, SIGTERM it once a training step has logged (not the step-0 eval): (proc, stdout, stderr)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        for line in proc.stdout:  # wait until training is under way
            if (line.startswith("step ") and ": loss " in line) or time.time() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, out, err


@pytest.mark.slow
def test_sigterm_saves_last_pt_and_exits_143(tmp_path, tiny_corpus):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    args = [sys.executable, str(REPO / "train.py"), *TINY, "data=text", f"data.path={tiny_corpus}",
            "train.max_iters=100000", "train.eval_interval=100000", "train.log_interval=1", "hydra.run.dir=run"]
    proc, out, err = _sigterm_once_training(args, tmp_path, env)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in out and "train.resume=true" in out
    ckpt = ck.load_checkpoint(tmp_path / "run" / "last.pt")
    assert 1 <= ckpt["step"] < 100000
    summary = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["status"] == "interrupted" and summary["step"] == ckpt["step"]


@pytest.mark.slow
def test_sweep_gets_one_run_dir_per_job(tmp_path, tiny_corpus):
    proc = run_cli(["train.py", "-m", "experiment=cpu", *TINY, "data=text", f"data.path={tiny_corpus}",
                    "train.max_iters=2", "train.eval_interval=2", "optim.lr=1e-3,3e-3", "hydra.sweep.dir=sweep",
                    "optim.cooldown_frac=0.3"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0", "1"]
    lrs = [ck.load_checkpoint(p / "last.pt")["config"]["optim"]["lr"] for p in runs]
    assert lrs == [1e-3, 3e-3]
    # issue 43: each job gives its warnings (a setting it does not read), on stderr and in its train.log
    assert proc.stderr.count("warning: optim.cooldown_frac=0.3 does nothing with optim.schedule=linear") == 2
    assert all("warning: optim.cooldown_frac=0.3 does nothing" in (p / "train.log").read_text() for p in runs)


@pytest.mark.slow
def test_threads_are_configured_before_torch_is_imported():
    """train.py sets OMP_WAIT_POLICY (common/platform.py) before anything imports torch; the user's value wins.
    The machine is made to look busy (busy_cores patched) so the policy is PASSIVE whatever the real load."""
    spy = ("import os, sys\nseen = []\n"
           "import common.platform\ncommon.platform.busy_cores = lambda: 1.0\n"
           "class Spy:\n"
           "    def find_spec(self, name, path=None, target=None):\n"
           "        if name == 'torch' and not seen:\n"
           "            seen.append(os.environ.get('OMP_WAIT_POLICY', 'unset'))\n"
           "sys.meta_path.insert(0, Spy())\n"
           "import train\nprint(seen)\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for given, want in ((None, "['PASSIVE']"), ("ACTIVE", "['ACTIVE']")):
        proc = subprocess.run([sys.executable, "-c", spy], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env=dict(env, **({"OMP_WAIT_POLICY": given} if given else {})))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == want


@pytest.mark.slow
@pytest.mark.parametrize("given, shown", [("", "''"), (".", ".")])
def test_run_dir_that_is_the_current_directory_is_refused(tmp_path, given, shown):
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = run_cli(["train.py", "experiment=cpu", f"hydra.run.dir={given}"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    _no_traceback(proc)
    assert proc.stderr.strip().splitlines() == [
        f"error: hydra.run.dir={shown} is the current directory, where the run's files (last.pt, train.log, "
        f".hydra/) would mix with yours: give the run a directory of its own, e.g. hydra.run.dir=runs/demo, or "
        f"leave hydra.run.dir out for a new dated one"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def _wait_for(proc, text: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    for line in proc.stdout:
        if text in line or time.time() > deadline:
            return
    raise AssertionError(f"exit {proc.wait()}: {proc.stderr.read()}")


@pytest.mark.slow
def test_a_running_run_owns_its_directory(tmp_path, tiny_corpus, monkeypatch, capsys, environ_restored):
    """A second run into a live run's directory (resuming or not) is refused naming the live one; once that
    one is killed (SIGKILL: the kernel drops its lock) a new run takes over and resumes, and sample.py still
    finds the run (the .lock file is in nobody's way). The live run reads data.path='~/corpus.txt' (quoted ~).
    The refusals and sample.py run in this process (train.main, sample.main: what the scripts run), the live run
    and the one that takes over in their own."""
    import sample
    import train
    (tmp_path / "corpus.txt").write_bytes(tiny_corpus.read_bytes())
    args = [*TINY, "data=text", "data.path='~/corpus.txt'", "train.eval_interval=2", "hydra.run.dir=outputs/run"]
    monkeypatch.setenv("HOME", str(tmp_path))
    first = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args, "train.max_iters=100000"], cwd=tmp_path,
                             env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(first, "step 4/")  # under way, last.pt written at step 2
        log = (tmp_path / "outputs/run/train.log").read_text()
        capsys.readouterr()
        for extra in ([], ["train.resume=true"]):
            assert train.main([*args, "train.max_iters=4", *extra]) == 2
            out, err = capsys.readouterr()
            assert "Traceback" not in out + err, err
            error = [ln for ln in err.splitlines() if ln.startswith("error:")]
            assert error == [ln for ln in err.splitlines() if ln.strip()][-1:], err
            assert error[0].startswith("error: hydra.run.dir=outputs/run is in use by another training run (pid "
                                       f"{first.pid} on host ") and "choose another hydra.run.dir" in error[0]
        assert (tmp_path / "outputs/run/train.log").read_text().startswith(log)  # the refusals wrote nothing
    finally:
        first.kill()
        first.wait()
    step = ck.load_checkpoint(tmp_path / "outputs/run/last.pt")["step"]
    proc = run_cli(["train.py", *args, "train.resume=true", f"train.max_iters={step + 2}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ck.load_checkpoint(tmp_path / "outputs/run/last.pt")["step"] == step + 2
    assert f'"pid": {first.pid},' not in (tmp_path / "outputs/run/.lock").read_text()
    capsys.readouterr()
    assert sample.main(["--max-new-tokens", "5"]) == 0
    err = capsys.readouterr().err
    assert f"using {os.path.join('outputs', 'run', 'last.pt')}" in err or "outputs/run" in err


@pytest.mark.slow
def test_a_sweep_owns_its_sweep_directory(tmp_path):
    """A sweep, or a single run into one of its job directories, is refused while another sweep holds it."""
    from common import run_lock
    run_lock.acquire(tmp_path / "sweep")
    try:
        proc = run_cli(["train.py", "-m", "experiment=cpu", "optim.lr=1e-3,3e-3", "hydra.sweep.dir=sweep"],
                       cwd=tmp_path, timeout=120)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1].startswith(
            f"error: hydra.sweep.dir=sweep is in use by another training run (pid {os.getpid()} on host ")
        proc = run_cli(["train.py", "experiment=cpu", "hydra.run.dir=sweep/0"], cwd=tmp_path, timeout=120)
        assert proc.returncode == 2
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: hydra.run.dir=sweep/0 is inside {tmp_path.resolve() / 'sweep'}, which "
                               f"another training run is using (pid {os.getpid()} on host "), last
        assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [".lock"]  # nothing written
    finally:
        run_lock.release(tmp_path / "sweep")


@pytest.mark.slow
def test_torchrun_ranks_share_rank_0s_lock_and_its_refusal(tmp_path):
    """Rank 0 alone claims the run directory; when it is in use, every rank says so and nothing is written."""
    from common import run_lock
    run_lock.acquire(tmp_path / "run")
    try:
        proc = run_cli(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
                        *TINY, "experiment=cpu", "hydra.run.dir=run", "train.resume=true"], cwd=tmp_path, timeout=240,
                       env={"OMP_NUM_THREADS": "1"})
        assert proc.returncode != 0
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        refusal = f"hydra.run.dir=run is in use by another training run (pid {os.getpid()} on host "
        assert len(errors) == 2, proc.stderr
        assert sum(e.startswith(f"error: {refusal}") for e in errors) == 1, errors
        assert sum(e.startswith(f"error: [rank 1] {refusal}") for e in errors) == 1, errors
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock"]
    finally:
        run_lock.release(tmp_path / "run")


def _files(d):
    """Every file under `d` (the run lock aside: it names its holder by design) with its bytes and mtime."""
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.mark.slow
def test_a_refused_resume_leaves_every_file_of_the_run_dir_as_it_was(tmp_path, tiny_corpus):
    """Issue 24: Hydra wrote .hydra/ (and train.log) before the checkpoint was read; now put back byte for byte."""
    args = ["train.py", "experiment=cpu", *TINY, "data=text", f"data.path={tiny_corpus}", "train.max_iters=2",
            "train.eval_interval=2", "hydra.run.dir=run"]
    assert run_cli(args, cwd=tmp_path).returncode == 0
    before = _files(tmp_path / "run")
    for refused in (["model.n_layer=3"], ["optim=adamw"]):  # another shape; AdamW on experiment=cpu's Muon
        proc = run_cli([*args, "train.resume=true", "train.max_iters=4", *refused], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: "), proc.stderr
        assert _files(tmp_path / "run") == before, refused


@pytest.mark.slow
def test_the_printed_resume_command_works_for_a_run_dir_with_a_space_and_non_ascii(tmp_path, tiny_corpus):
    """SIGTERM a run in `my runs/é a`, then paste the command it printed (shlex.split, as a shell would) where the
    run was started: a directory other than the repo's, so train.py is named by its path (issue 43), and so is
    sample.py in the closing line."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    args = [sys.executable, str(REPO / "train.py"), "experiment=cpu", *TINY, "data=text", f"data.path={tiny_corpus}",
            "train.max_iters=100000", "train.eval_interval=100000", "train.log_interval=1",
            "hydra.run.dir='my runs/é a'"]
    proc, out, err = _sigterm_once_training(args, tmp_path, env)
    assert proc.returncode == 143, err
    command = shlex.split(out.split("resume with: ")[1].splitlines()[0])
    assert command[:2] == ["python", str(REPO / "train.py")]
    step = ck.load_checkpoint(tmp_path / "my runs" / "é a" / "last.pt")["step"]
    resumed = subprocess.run([sys.executable, *command[1:], f"train.max_iters={step + 2}"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # as printed, from where it was started
    assert resumed.returncode == 0, resumed.stderr
    assert ck.load_checkpoint(tmp_path / "my runs" / "é a" / "last.pt")["step"] == step + 2
    sample = shlex.split(resumed.stdout.split("sample with: ")[1].splitlines()[0])
    assert sample == ["python", str(REPO / "sample.py"), "--run", "my runs/é a"]


@pytest.mark.slow
def test_a_closed_stdout_stops_the_run_quietly_with_a_checkpoint(tmp_path, tiny_corpus):
    """`python train.py | head`, closed after step 2's line: no `--- Logging error ---`, exit 141, last.pt saved,
    outputs/latest set, the run recorded as stopped (not failed) and why, in words."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    args = [sys.executable, str(REPO / "train.py"), "experiment=cpu", *TINY, "data=text", f"data.path={tiny_corpus}",
            "train.max_iters=100000", "train.eval_interval=100000", "train.log_interval=1", "hydra.run.dir=outputs/r"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        head = []
        for line in proc.stdout:
            head.append(line)
            if line.startswith(b"step 2/"):
                break
        proc.stdout.close()  # as head does
        err = proc.stderr.read().decode()
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert head[-1].startswith(b"step 2/") and proc.returncode == 141, err
    assert "Logging error" not in err and "Traceback" not in err, err
    assert ck.load_checkpoint(tmp_path / "outputs" / "r" / "last.pt")["step"] >= 2
    assert "stopped by a closed output pipe (the output's reader went away) after step " in \
        (tmp_path / "outputs" / "r" / "train.log").read_text()
    summary = json.loads((tmp_path / "outputs" / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert (summary["status"], summary["stopped_by"]) == ("stopped", "a closed output pipe (the output's reader "
                                                                      "went away)")
    assert (tmp_path / "outputs" / "latest").resolve() == (tmp_path / "outputs" / "r").resolve()


@pytest.mark.slow
def test_a_closed_output_before_step_1_is_a_stop_not_a_failure(tmp_path, tiny_corpus):
    """`python train.py 2>&1 | head -2`: the auto-CPU note on stderr raised BrokenPipeError, so train.log said
    `error: [Errno 32] Broken pipe`, metrics.jsonl "failed", exit 1. Now: both streams' reader gone before step 1
    is a stop, said in words, with nothing to save (no step-0 last.pt to block rerunning the command)."""
    r, w = os.pipe()
    os.close(r)  # the reader has gone before the run starts
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, str(REPO / "train.py"), *TINY, "data=text", f"data.path={tiny_corpus}",
            "train.max_iters=5", "hydra.run.dir=outputs/r"]  # no experiment=: the auto-CPU note on stderr
    try:
        code = subprocess.run(args, cwd=tmp_path, env=env, stdout=w, stderr=w, timeout=180).returncode
    finally:
        os.close(w)
    run = tmp_path / "outputs" / "r"
    log = (run / "train.log").read_text()
    assert code == 141 and "error" not in log, log
    assert log.splitlines()[-1].endswith("] stopped by a closed output pipe (the output's reader went away) before "
                                         "step 1: nothing to save and nothing needs resuming")
    summary = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert (summary["status"], summary["step"]) == ("stopped", 0)
    assert not (run / "last.pt").exists() and not (tmp_path / "outputs" / "latest").exists()


@functools.lru_cache(maxsize=1)
def _python_start() -> float:
    """Seconds the interpreter takes to start (site-packages' .pth files: no project code can run before them)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t


def _signal_at(args: list[str], cwd, when, signum=signal.SIGINT):
    """Start `python args...`, send `signum` `when` seconds after the interpreter started, or (a callable) as soon
    as when() is true: (returncode, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    start = _python_start() if not callable(when) else 0.0
    proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        if callable(when):
            while not when() and proc.poll() is None:
                time.sleep(0.001)
        else:
            time.sleep(start + when)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)  # a lost signal would train on: the timeout fails it
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("when", ["imports", "set-up"])
def test_sigterm_before_step_1_says_nothing_was_saved(tmp_path, tiny_corpus, when):
    """While Python imports (0.5 s in), and once the run directory is claimed (its lock), before the model and data
    are ready (a fixed delay there would land after step 1 on a faster machine)."""
    args = [str(REPO / "train.py"), *TINY, "data=text", f"data.path={tiny_corpus}", "hydra.run.dir=run"]
    code, out, err = _signal_at(args, tmp_path, 0.5 if when == "imports" else (tmp_path / "run" / ".lock").exists,
                                signal.SIGTERM)
    last = err.strip().splitlines()[-1]
    assert code == 143 and "nothing was saved" in last and "nothing needs resuming" in last, err
    assert not (tmp_path / "run" / "last.pt").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the note is for machines without CUDA")
def test_no_cuda_note_is_not_printed_ahead_of_a_mistake(tmp_path):
    """Issue 29: "no CUDA GPU found" came before almost every error; now only when the run starts on the CPU preset."""
    (tmp_path / "empty.txt").write_text("")
    proc = run_cli(["train.py", "data=text", "data.path=empty.txt", "hydra.run.dir=run"], cwd=tmp_path, timeout=180)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no CUDA GPU found" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_a_sweep_over_tokenizers_is_told_a_command_that_works(tmp_path, tiny_corpus):
    """Issue 29: `-m data.tokenizer=char,bpe` advised data.vocab_size=4096, which the char job then refused."""
    args = ["-m", *TINY, "data=text", f"data.path={tiny_corpus}", "data.tokenizer=char,bpe", "train.max_iters=1",
            "train.eval_interval=1", "hydra.sweep.dir=sw"]
    proc = run_cli(["train.py", *args], cwd=tmp_path, timeout=180)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    advice = proc.stderr.split(f"on its own: python {REPO / 'train.py'} ")[1].split(" with the setting above")[0]
    ok = run_cli(["train.py", *shlex.split(advice), "data.vocab_size=300"], cwd=tmp_path)
    assert ok.returncode == 0 and "1 of 1 jobs completed" in ok.stdout, ok.stderr


RUNS_IN_ONE_PROCESS = r"""
import json, runpy, sys
train_py, runs = sys.argv[1], json.loads(sys.argv[2])
for args in runs:  # python train.py ARGS, one after another (each must exit 0)
    sys.argv = [train_py, *args]
    try:
        runpy.run_path(train_py, run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
"""


@pytest.mark.slow  # four short runs, in one process
def test_a_run_that_does_not_compile_imports_no_compiler_and_no_fsdp(tmp_path, tiny_corpus):
    """Issue 37: neither optimizer (Muon with AdamW, or AdamW) imports torch._dynamo, sympy or FSDP in a run, its
    resume (load_state_dict) included: seconds before the first step on a GPU machine, ~65 MiB on a CPU. The four
    runs share one process (one start-up): `-X importtime` lists every module the first time any of them imports
    it, so a module none of them may import is absent from the list exactly when no run imported it."""
    base = ["experiment=cpu", *TINY, "data=text", f"data.path={tiny_corpus}", "train.eval_interval=2",
            "hydra.run.dir=outputs/r"]
    runs = [[*base, *extra] for extra in (
        ["train.max_iters=2"], ["train.max_iters=4", "train.resume=true"],
        ["optim=adamw", "train.max_iters=2", "hydra.run.dir=outputs/a"],
        ["optim=adamw", "train.max_iters=4", "hydra.run.dir=outputs/a", "train.resume=true"])]
    proc = run_cli(["-X", "importtime", "-c", RUNS_IN_ONE_PROCESS, str(REPO / "train.py"), json.dumps(runs)],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("resumed from") == 2, proc.stdout
    imported = {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "torch" in imported and not {"torch._dynamo", "sympy", "torch.distributed.fsdp"} & imported
    assert ck.load_checkpoint(tmp_path / "outputs" / "r" / "last.pt")["step"] == 4
    assert ck.load_checkpoint(tmp_path / "outputs" / "a" / "last.pt")["step"] == 4


def test_help_names_the_preset_a_plain_run_trains_here(monkeypatch):
    """Issue 50: --help showed conf/config.yaml's defaults (6 layers, 384 wide) while a plain run
    trains experiment=cpu on a CPU, and never said so: its header names this machine's preset and
    the command that shows it."""
    import torch
    from launch.config import plain_run_help
    for cuda, name in ((False, "cpu"), (True, "gpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        line = plain_run_help()
        assert f"trains experiment={name};" in line
        assert line.endswith(f"experiment={name} --cfg job")


@pytest.mark.slow
def test_help_says_which_preset_a_plain_run_trains_and_its_command_shows_it(tmp_path):
    import shlex
    import torch
    name = "gpu" if torch.cuda.is_available() else "cpu"
    proc = run_cli(["train.py", "--help"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = next(line for line in proc.stdout.splitlines() if line.startswith("its settings: "))
    assert f"trains experiment={name};" in proc.stdout
    assert said.endswith(f"experiment={name} --cfg job")
    command = shlex.split(said.removeprefix("its settings: "))  # followed as printed, from tmp_path
    assert command[:2] == ["python", str(REPO / "train.py")]
    proc = run_cli(command[1:], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the preset's settings, not config.yaml's
    assert "position: rope" in proc.stdout and "name: muon" in proc.stdout
