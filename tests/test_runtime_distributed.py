"""runtime/distributed.py and the loop under torchrun: CPU, gloo, 2 processes.

Fast tests check the helpers in-process (a one-rank gloo group where a process group is needed). The slow
ones launch `python -m torch.distributed.run --standalone --nproc_per_node=2 train.py ...` (the user's
path) a few times from one module fixture and compare against single-process runs with the same global
batch (batch 4 x 2 processes == batch 4 x grad_accum_steps 2), dropout 0:

  ref4 / ref8   1 process, accum 2, 4 and 8 steps (in-process train())
  ddp           torchrun 2 x DDP, 4 steps             -> losses, eval and weights == ref4    (a)
  ddp->1        1 process resumes ddp's last.pt to 8  -> losses and weights == ref8         (d)
  fsdp          torchrun 2 x FSDP2, 4 steps           -> losses == ddp, weights == ref4     (b)
  fsdp->2       torchrun 2 x FSDP2 resumes last_dcp/ with batch 2 x accum 2 (FSDP2's no-sync micro-steps)
                                                      -> losses and weights == ref8         (c)
  fsdp->1       1 process resumes last_dcp/ (DCP resharding 2 -> 1) -> == ref8
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, find_non_plain, run_cli, tiny_model_and_opt, train_steps
from checkpoint import file as ck
from checkpoint import file as L
from checkpoint import sharded as S
from runtime import distributed as D
from runtime import ranks as R
from training import state as TS
from runtime.signals import StopRequest

TINY = ["experiment=cpu", "train.device=cpu", "optim=adamw", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16",
        "model.dropout=0.0", "train.device=cpu", "train.batch_size=4", "train.eval_iters=3",
        "train.log_interval=1", "train.eval_interval=4", "train.eval_at_start=false", "optim.warmup_iters=2",
        "optim.decay_iters=8", "data=text"]
TOL = 1e-5


# ------------------------------------------------------------------------------------------- helpers

def _corpus(path: Path) -> Path:
    rng = random.Random(99)
    words = ["the", "king", "queen", "sword", "love", "night", "day", "speak", "thou", "art", "my", "lord"]
    lines = []
    while sum(len(x) + 1 for x in lines) < 20_000:
        lines.append(f"{rng.choice(['ROMEO', 'JULIET'])}:\n"
                     f"{' '.join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize()}.\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from launch.config import register_configs
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _records(run, "train")}


def _evals(run: Path) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in _records(run, "eval")}


def _assert_close_losses(a: dict, b: dict, steps):
    for s in steps:
        assert abs(a[s] - b[s]) <= TOL, f"step {s}: {a[s]} vs {b[s]}"


def _assert_same_probes(a: Path, b: Path, steps: list[int]):
    """The probe snapshots of two runs (viz/probes.py): the same steps, text and (half precision) numbers."""
    from viz import probes
    assert probes.steps(a) == probes.steps(b) == steps
    for step in steps:
        x, y = probes.read_snapshot(a, step), probes.read_snapshot(b, step)
        assert x["ids"] == y["ids"]
        for loss in ("val_loss", "train_loss"):  # (the step's train loss: averaged over the ranks)
            assert (x[loss] is None) == (y[loss] is None) and (x[loss] is None or abs(x[loss] - y[loss]) <= TOL)
        assert (x["attention"].float() - y["attention"].float()).abs().max() <= 2e-3


def _assert_close_weights(sd_a: dict, sd_b: dict):
    assert sd_a.keys() == sd_b.keys()
    worst = max((sd_a[k].float() - sd_b[k].float()).abs().max().item() for k in sd_a)
    assert worst <= TOL, f"max weight difference {worst}"


def _torchrun(args: list[str], cwd: Path, env: dict, nproc: int = 2, timeout: float = 240):
    proc = run_cli(["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    str(REPO / "train.py"), *args], cwd=cwd, env=env, timeout=timeout)
    return proc


# ------------------------------------------------------------------------------------------- fast tests

def test_resolve_parallel():
    assert D.resolve_parallel("none", 1, False) == "none"
    assert D.resolve_parallel("none", 2, True) == "ddp"  # auto DDP under torchrun
    assert D.resolve_parallel("none", 1, True) == "none"
    assert D.resolve_parallel("ddp", 1, False) == "none"  # plain python: nothing to parallelise
    assert D.resolve_parallel("ddp", 1, True) == "ddp"
    assert D.resolve_parallel("fsdp", 4, True) == "fsdp"
    with pytest.raises(ValueError, match="train.parallel=fsdp needs a torchrun launch"):
        D.resolve_parallel("fsdp", 1, False)
    with pytest.raises(AssertionError):  # training.config.check told the user
        D.resolve_parallel("zero", 1, False)
    with pytest.raises(ValueError, match="launch with torchrun"):
        D.resolve_parallel("none", 2, False)


def test_single_process_needs_no_process_group(monkeypatch):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    info = D.join("cpu", "ddp")
    assert type(info) is R.Ranks
    assert (info.rank, info.world_size, info.parallel, info.distributed) == (0, 1, "none", False)
    assert not torch.distributed.is_initialized()
    t = torch.tensor([3.0])
    assert info.all_reduce_mean(t).item() == 3.0 and "rng_ranks" not in TS.RNGState(info, 1).state_dict()
    stop = StopRequest(info)
    assert not stop.agreed()
    stop.signum = 15
    assert stop.agreed() and stop.signum == 15  # single process: immediate, no collective
    m = torch.nn.Linear(2, 2)
    assert info.wrap_model(m, torch.device("cpu")) is m
    with info.grad_sync(m, last=False):
        pass
    info.destroy()


def test_eval_plan_covers_every_batch_once():
    ddp = [R.Ranks(rank=r, world_size=2, parallel="ddp").eval_plan(5) for r in range(2)]
    assert ddp == [[(0, True), (2, True), (4, True)], [(1, True), (3, True)]]
    fsdp = [R.Ranks(rank=r, world_size=2, parallel="fsdp").eval_plan(5) for r in range(2)]
    assert [len(p) for p in fsdp] == [3, 3]  # same number of forwards: each is a collective under FSDP
    assert sorted(i for p in fsdp for i, counted in p if counted) == [0, 1, 2, 3, 4]
    assert R.Ranks().eval_plan(3) == [(0, True), (1, True), (2, True)]


@pytest.fixture
def one_rank_group(tmp_path):
    """A real (one-process) gloo group in this process, for the FSDP2 code paths."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield D.ProcessGroup(parallel="fsdp", backend="gloo")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # over ~1 s
def test_fsdp_one_rank_loads_single_file_and_sharded_state(tmp_path, one_rank_group):
    import copy
    info = one_rank_group
    m, opt = tiny_model_and_opt()
    train_steps(m, opt, 2, seed=1)
    sd, osd = copy.deepcopy(m.state_dict()), copy.deepcopy(opt.state_dict())
    expected = train_steps(m, opt, 2, seed=2)

    from training.config import OptimConfig
    from training.optim import build_optimizer
    f, _ = tiny_model_and_opt(seed=3)
    f.load_state_dict(sd)  # single-file weights load before sharding ...
    info.wrap_model(f, torch.device("cpu"))
    fopt = build_optimizer(f, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")
    S.load_full_optimizer_state(f, fopt, osd)  # ... the optimizer state after
    assert fopt.param_groups[0]["foreach"] is True
    meta = {"format": ck.FORMAT, "version": ck.VERSION, "model": None, "model_config": m.config.to_dict(),
            "step": 2}
    S.save_sharded(tmp_path / "s", f, fopt, meta, ranks=info)
    assert train_steps(f, fopt, 2, seed=2) == expected
    assert info.weights_finite(list(f.parameters()))
    full = S.full_model_state_dict(f)
    _assert_close_weights(full, m.state_dict())

    g, _ = tiny_model_and_opt(seed=4)
    info.wrap_model(g, torch.device("cpu"))
    gopt = build_optimizer(g, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")
    S.load_sharded(tmp_path / "s", g, gopt)
    assert train_steps(g, gopt, 2, seed=2) == expected

    stop = StopRequest(info)
    assert not stop.agreed()
    stop.signum = 15
    assert not stop.agreed()  # agreed one boundary later ...
    stop.signum = None
    assert stop.agreed() and stop.signum == 15  # ... and another rank's signal becomes this one's
    stop.finish()
    assert len(TS.RNGState(info, 1).state_dict()["rng_ranks"]) == 1


# ------------------------------------------------------------------------------------------- torchrun

@pytest.fixture(scope="module")
def dist_runs(tmp_path_factory):
    """Run every configuration once (see the module docstring); tests below compare them."""
    base = tmp_path_factory.mktemp("dist")
    corpus = _corpus(base / "corpus.txt")
    env = {"TINYGPT_CACHE": str(base / "cache"), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "HYDRA_FULL_ERROR": "0"}
    common = [*TINY, f"data.path={corpus}"]
    out = {"base": base, "procs": {}}
    from launch.run import train
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.chdir(base)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for name, extra in (("ref4", ["train.max_iters=4"]), ("ref8", ["train.max_iters=8"])):
                train(_compose(*common, "train.grad_accum_steps=2", *extra), base / name)

            # no hydra.run.dir: the ranks must agree on rank 0's timestamped directory (train.py)
            (base / "ddp_cwd").mkdir()
            out["procs"]["ddp"] = _torchrun([*common, "train.max_iters=4"], base / "ddp_cwd", env)
            out["ddp_dirs"] = sorted(d for d in (base / "ddp_cwd" / "outputs").glob("*/*")
                                     if d.parent.name != "latest")  # outputs/latest: a link to the run
            if len(out["ddp_dirs"]) == 1:
                shutil.move(out["ddp_dirs"][0], base / "ddp")
            out["procs"]["fsdp"] = _torchrun([*common, "train.max_iters=4", "train.parallel=fsdp",
                                              f"hydra.run.dir={base / 'fsdp'}"], base, env)
            out["procs"]["fsdp2"] = _torchrun([*common, "train.max_iters=8", "train.parallel=fsdp",
                                               "train.batch_size=2", "train.grad_accum_steps=2",
                                               f"train.resume={base / 'fsdp'}", f"hydra.run.dir={base / 'fsdp2'}"],
                                              base, env)
            if out["procs"]["ddp"].returncode == 0:
                train(_compose(*common, "train.grad_accum_steps=2", "train.max_iters=8",
                               f"train.resume={base / 'ddp'}"), base / "ddp1")
            if out["procs"]["fsdp"].returncode == 0:
                train(_compose(*common, "train.grad_accum_steps=2", "train.max_iters=8",
                               f"train.resume={base / 'fsdp' / S.LAST_DCP}"), base / "fsdp1")
        finally:
            torch.set_num_threads(threads)
    return out


def _ok(runs, name):
    proc = runs["procs"][name]
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n" \
                                 f"stderr:\n{proc.stderr[-5000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    return proc


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_accumulation(dist_runs):
    proc = _ok(dist_runs, "ddp")
    base = dist_runs["base"]
    # rank 0 alone talks: one start banner, the global batch in tokens, nothing from rank 1
    assert proc.stdout.count("global batch: 128 tokens per step (4 sequences x 16 tokens x 1 accumulation x "
                             "2 processes)") == 1, proc.stdout
    assert "DDP over 2 processes (gloo)" in proc.stdout
    assert proc.stderr.count("no CUDA GPU found") == 0  # train.device=cpu given: no preset note
    ref, ddp = base / "ref4", base / "ddp"
    _assert_close_losses(_losses(ref), _losses(ddp), range(1, 5))
    _assert_close_losses(_evals(ref), _evals(ddp), [4])  # eval split over ranks == one process
    a, b = ck.load_checkpoint(ref / "last.pt"), ck.load_checkpoint(ddp / "last.pt")
    _assert_close_weights(a["model"], b["model"])
    assert find_non_plain(b) is None and len(b["rng_ranks"]) == 2
    assert b["loader"] == {"step": 4, "micro": 0}
    assert len(dist_runs["ddp_dirs"]) == 1, dist_runs["ddp_dirs"]  # one run dir (rank 0's), none per rank
    _assert_same_probes(ref, ddp, [0, 1, 2, 3, 4])  # rank 0 records the probe, as one process does
    assert {p.name for p in ddp.iterdir()} >= {"last.pt", "best.pt", "metrics.jsonl", "loss.png", "train.log",
                                               ".hydra"}


@pytest.mark.slow
def test_ddp_checkpoint_resumes_on_another_world_size(dist_runs):
    _ok(dist_runs, "ddp")
    base = dist_runs["base"]
    _assert_close_losses(_losses(base / "ref8"), _losses(base / "ddp1"), range(5, 9))
    a, b = ck.load_checkpoint(base / "ref8" / "last.pt"), ck.load_checkpoint(base / "ddp1" / "last.pt")
    _assert_close_weights(a["model"], b["model"])


@pytest.mark.slow
def test_fsdp_matches_ddp(dist_runs):
    proc = _ok(dist_runs, "fsdp")
    base = dist_runs["base"]
    assert "FSDP2" in proc.stdout
    _assert_close_losses(_losses(base / "ddp"), _losses(base / "fsdp"), range(1, 5))
    _assert_close_losses(_evals(base / "ddp"), _evals(base / "fsdp"), [4])
    fsdp = base / "fsdp"
    _assert_same_probes(base / "ddp", fsdp, [0, 1, 2, 3, 4])  # every rank runs the probe's forward (it gathers the shards)
    assert S.is_sharded_checkpoint(fsdp / S.LAST_DCP) and S.is_sharded_checkpoint(fsdp / S.BEST_DCP)
    export = ck.load_checkpoint(fsdp / "last.pt")  # the single-file export sample.py reads
    assert export["optimizer"] is None and export["step"] == 4
    assert L.read_checkpoint(fsdp / S.LAST_DCP)[1]["tokens"] == export["tokens"] == 4 * 128  # 4 x 2 ranks x 16
    model = L.model_from_checkpoint(export)
    _assert_close_weights(ck.load_checkpoint(base / "ref4" / "last.pt")["model"], model.state_dict())


@pytest.mark.slow
def test_sharded_checkpoint_resumes_exactly(dist_runs):
    proc = _ok(dist_runs, "fsdp2")
    base = dist_runs["base"]
    assert "resumed from" in proc.stdout and "last_dcp" in proc.stdout
    ref8 = base / "ref8"
    for run in (base / "fsdp2", base / "fsdp1"):  # 2 processes again, and resharded onto 1
        _assert_close_losses(_losses(ref8), _losses(run), range(5, 9))
        assert sorted(_losses(run)) == list(range(1, 9))  # the records up to the checkpoint were kept
        a = ck.load_checkpoint(ref8 / "last.pt")["model"]
        _assert_close_weights(a, ck.load_checkpoint(run / "last.pt")["model"])
        assert _records(run, "summary")[-1]["tokens"] == 8 * 128


SLOW_FINISH = """
import os, runpy, sys, time
from training import edge

real_finish = edge.Edge.finish

def finish(self, status):  # rank 0's summary and loss.png, made slow: rank 1 is done long before
    time.sleep(3)
    real_finish(self, status)

edge.Edge.finish = finish
sys.argv[0] = os.path.join(os.environ["PYTHONPATH"], "train.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """SIGTERM to rank 1 only: rank 0 learns it through the stop all-reduce, both stop after the same
    step, rank 0 writes last.pt, the group is torn down cleanly. The ranks leave together: rank 0's summary
    and loss.png are made slow (train.py run with Trainer.finish delayed 3 s), and had rank 1 left while rank 0
    still wrote them, torchrun would have killed rank 0 before its closing line."""
    corpus = _corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    script = tmp_path / "slow_finish.py"
    script.write_text(SLOW_FINISH)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(script), *TINY, f"data.path={corpus}", "train.max_iters=100000",
           "train.batch_size=2", "train.grad_accum_steps=2",  # DDP's no_sync micro-steps
           "train.eval_interval=100000", "optim.decay_iters=100000", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if (run / "metrics.jsonl").is_file() and len(_records(run, "train")) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        rank1 = [pid for pid in _children(proc.pid) if _environ(pid).get("RANK") == "1"]
        assert len(rank1) == 1
        os.kill(rank1[0], signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    last = ck.load_checkpoint(run / "last.pt")
    assert f"stopped by SIGTERM after step {last['step']}" in out, out + err
    assert "Traceback" not in out
    assert _records(run, "summary")[-1]["status"] == "interrupted"
    assert len(last["rng_ranks"]) == 2  # both ranks took part in the final save


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = (task / "children").read_text().split()
        out += [int(k) for k in kids]
    return out


def _environ(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def test_torchrun_on_mps_is_refused_before_any_process_group(monkeypatch):
    """A Mac as torch reports it (MPS, no CUDA; mocked: no Mac here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "localhost",
                 "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(D.dist, "init_process_group", lambda *a, **k: pytest.fail("a process group was started"))
    with pytest.raises(ValueError, match="^multi-process training does not support Apple's MPS device: use "
                                         r"train.device=cpu \(gloo\)"):
        D.join("auto", "none")
    for k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k)
    assert not D.join("mps", "none").distributed  # one process on MPS: no process group needed
