"""checkpoint/manager.py: one resume and one save for every Stateful part of a run; format 1 stays as it was.

The first test pins the checkpoint format: a file laid out by hand exactly as the loop before the manager
wrote it (same keys, plain torch.save) resumes into a run that equals an uninterrupted one, and the files
the manager writes have exactly those keys, so the code before the manager reads them too.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

from checkpoint import file as ck
from checkpoint import sharded as S
from checkpoint.file import CheckpointError, save_checkpoint
from checkpoint.manager import CheckpointManager, overwrite_refusal, resume_checkpoint, starts_afresh
from data.tokenizer import describe_tokenizer as describe
from tests.helpers import REPO, find_non_plain, tiny_model_and_opt, train_steps
from runtime import distributed as D
from runtime.ranks import Ranks
from training import edge as edge_mod
from launch.config import register_configs
from launch.run import train
from training.state import TrainState

register_configs()

# the top-level keys of a single-process checkpoint, in the order the pre-manager loop (_Trainer._save) wrote them
FORMAT_1 = ("format", "version", "step", "best_val_loss", "best_step", "model", "model_config", "tokenizer",
            "optimizer", "scaler", "config", "rng", "loader", "wandb_run_id", "elapsed_s", "tokens", "loss_window",
            "eval_pending")
TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
        "model.block_size=16", "train.batch_size=4", "train.eval_iters=2", "train.eval_at_start=false",
        "optim.warmup_iters=2", "model.dropout=0.1", "optim.decay_iters=8", "train.eval_interval=3",
        "train.log_interval=2", "data=text"]

ONE = Ranks()  # a one-process run's place


def _cfg(corpus, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=[*TINY, f"data.path={corpus}", *overrides])


def _records(run):
    strip = ("elapsed_s", "tokens_per_s", "wall_s", "train_s", "mean_tokens_per_s")
    return [{k: v for k, v in json.loads(line).items() if k not in strip}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


class _Killed(BaseException):
    pass


@pytest.mark.slow  # over ~1 s
def test_a_checkpoint_in_the_old_layout_resumes_exactly(tmp_path, tiny_corpus, monkeypatch):
    straight = tmp_path / "straight"
    train(_cfg(tiny_corpus, "train.max_iters=8"), straight)

    first = tmp_path / "first"  # stopped right after the step-3 checkpoint: step 3's loss is not logged yet
    real_save = edge_mod.Edge._save

    def save_then_die(self, step, best=False):
        real_save(self, step, best)
        raise _Killed
    with monkeypatch.context() as mp:
        mp.setattr(edge_mod.Edge, "_save", save_then_die)
        with pytest.raises(_Killed):
            train(_cfg(tiny_corpus, "train.max_iters=8"), first)
    new = torch.load(first / "last.pt", weights_only=True)
    assert sorted(new) == sorted(FORMAT_1)  # what the manager writes is format 1: no key more, none less
    assert (new["format"], new["version"], new["step"], new["tokens"]) == ("tinygpt", 1, 3, 3 * 4 * 16)
    assert new["loader"] == {"step": 3, "micro": 0} and new["scaler"] is None and new["eval_pending"] is False
    assert new["loss_window"]["first_step"] == 2 and len(new["loss_window"]["values"]["loss"]) == 1
    assert set(new["rng"]) == {"python", "numpy", "torch", "cuda"} and set(new["optimizer"]) == {"state",
                                                                                                "param_groups"}
    assert find_non_plain(new) is None

    old = tmp_path / "old"  # the same state, laid out by hand as the old writer did (its window: the losses alone)
    old.mkdir()
    losses = {"first_step": 2, "losses": new["loss_window"]["values"]["loss"]}
    torch.save({**{k: new[k] for k in FORMAT_1}, "loss_window": losses}, old / "last.pt")
    shutil.copy(first / "metrics.jsonl", old / "metrics.jsonl")
    res = train(_cfg(tiny_corpus, "train.max_iters=8", "train.resume=true"), old)
    assert res.step == 8
    a, b = ck.load_checkpoint(straight / "last.pt"), ck.load_checkpoint(old / "last.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for pid, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][pid][k]), (pid, k)
    assert (a["best_val_loss"], a["best_step"], a["tokens"]) == (b["best_val_loss"], b["best_step"], b["tokens"])
    # every train/eval record (the summaries' times differ); the old window had no grad_norm: step 4's is step 4's
    comparable = lambda r: {k: v for k, v in r.items() if (k, r["step"]) != ("grad_norm", 4)}  # noqa: E731
    assert [comparable(r) for r in _records(straight)[:-1]] == [comparable(r) for r in _records(old)[:-1]]


@pytest.mark.slow  # over ~1 s
def test_a_format_1_file_without_the_later_fields_resumes(tmp_path, tiny_corpus):
    """The first format-1 files had no best_step, tokens, loss_window or eval_pending: they still resume."""
    run = tmp_path / "run"
    train(_cfg(tiny_corpus, "train.max_iters=3"), run)
    ckpt = torch.load(run / "last.pt", weights_only=True)
    for k in ("best_step", "tokens", "loss_window", "eval_pending", "elapsed_s"):
        del ckpt[k]
    torch.save(ckpt, run / "last.pt")
    res = train(_cfg(tiny_corpus, "train.max_iters=6", "train.resume=true"), run)
    assert res.step == 6 and ck.load_checkpoint(run / "last.pt")["tokens"] == 6 * 4 * 16


def _model(seed):
    from model.config import GPTConfig
    from model.gpt import GPT
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))


def _opt(model):
    from training.config import OptimConfig
    from training.optim import build_optimizer
    return build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")


def _parts(seed):
    m = _model(seed)
    return m, _opt(m)


def _meta(m):
    return {"model_config": m.config.to_dict(), "tokenizer": {"type": "char", "chars": "ab"}, "config": {}}


def test_single_file_and_sharded_round_trips_under_fsdp(tmp_path):
    """A single-file checkpoint resumes into an FSDP2-sharded model (weights and optimizer state sharded on
    load), whose sharded save resumes into a plain model again: both continue the original bitwise."""
    m, opt = _parts(0)
    train_steps(m, opt, 2, seed=1)
    state = TrainState(step=2)
    CheckpointManager(tmp_path / "a", {"model": m, "optimizer": opt, "train_state": state}, _meta(m),
                      describe, ranks=ONE).save(2)
    expected = train_steps(m, opt, 2)

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        info = D.ProcessGroup(parallel="fsdp", backend="gloo")
        f = info.wrap_model(_model(3), torch.device("cpu"))
        fopt = _opt(f)  # after sharding: its parameters are the shards
        fs = TrainState()
        mgr = CheckpointManager(tmp_path / "a", {"model": f, "optimizer": fopt, "train_state": fs}, _meta(m),
                                describe, ranks=info, sharded=True)
        assert mgr.resume(True) == 2 and fs.step == 2 and mgr.source == tmp_path / "a" / "last.pt"
        mgr.run_dir = tmp_path / "b"
        mgr.save(2, best=True)  # last_dcp/ + best_dcp/ + a weights-only last.pt
        assert S.is_sharded_checkpoint(tmp_path / "b" / S.LAST_DCP) and (tmp_path / "b" / "best.pt").is_file()
        assert train_steps(f, fopt, 2) == expected
    finally:
        dist.destroy_process_group()

    g, gopt = _parts(4)
    mgr = CheckpointManager(tmp_path / "b", {"model": g, "optimizer": gopt, "train_state": TrainState()}, _meta(m),
                            describe, ranks=ONE)
    assert mgr.resume(True) == 2 and mgr.source == tmp_path / "b" / S.LAST_DCP  # the export holds no optimizer
    assert train_steps(g, gopt, 2) == expected


def test_resume_refusals_name_the_fix(tmp_path):
    m, opt = _parts(0)
    run = tmp_path / "run"
    CheckpointManager(run, {"model": m, "optimizer": opt, "train_state": TrainState(step=1)}, _meta(m),
                      describe, ranks=ONE).save(1)
    assert (run / "last.pt").is_file() and not (run / "best.pt").exists()

    def manager(meta=None, **states):
        m2, opt2 = _parts(1)
        return CheckpointManager(run, {"model": m2, "optimizer": opt2, "train_state": TrainState(), **states},
                                 meta or _meta(m2), describe, ranks=ONE)
    assert manager().resume(False) is None  # (a fresh run into it is refused at set-up: launch/run.py)
    with pytest.raises(ValueError, match=r"vocabulary \(char \(3 characters\)\) differs from the checkpoint's "
                                         r"\(char \(2 characters\)\)"):
        manager(meta={**_meta(m), "tokenizer": {"type": "char", "chars": "abc"}}).resume(True)
    with pytest.raises(ValueError, match=r"does not match the checkpoint .*: here n_layer=3, in the checkpoint "
                                         r"n_layer=2: resume with the checkpoint's model settings \(model.n_layer=2\)"):
        manager(meta={**_meta(m), "model_config": {**m.config.to_dict(), "n_layer": 3}}).resume(True)
    ck.save_checkpoint({**torch.load(run / "last.pt", weights_only=True), "optimizer": None}, run / "last.pt")
    with pytest.raises(ValueError, match=r"has no optimizer state, so it cannot be resumed: start a new run from its "
                                         rf"weights with model.init_from={run / 'last.pt'} instead of train.resume$"):
        manager().resume(True)
    (run / "last.pt").unlink()
    assert manager().resume(False) is None  # a fresh run


def test_resume_with_another_bpe_vocabulary_names_data_vocab_size(tmp_path):
    """Issue 29: the suggested command carries every data setting that makes the vocabulary, data.vocab_size too."""
    m, opt = _parts(0)
    bpe = {"type": "bpe", "vocab_size": 300, "json": "{}"}
    data = {"name": "text", "path": "t.txt", "tokenizer": "bpe", "vocab_size": 300}
    meta = {**_meta(m), "tokenizer": bpe, "config": {"data": data}}
    CheckpointManager(tmp_path, {"model": m, "optimizer": opt, "train_state": TrainState(step=1)}, meta,
                      describe, ranks=ONE).save(1)
    m2, opt2 = _parts(1)
    mgr = CheckpointManager(tmp_path, {"model": m2, "optimizer": opt2, "train_state": TrainState()},
                            {**meta, "tokenizer": {**bpe, "vocab_size": 400}}, describe, ranks=ONE)
    with pytest.raises(ValueError) as e:
        mgr.resume(True)
    assert str(e.value) == ("the prepared data's vocabulary (own BPE (400 tokens)) differs from the checkpoint's (own "
                            "BPE (300 tokens)): resume with the data settings the checkpoint was trained with "
                            "(data=text data.path=t.txt data.tokenizer=bpe data.vocab_size=300)")


def test_a_save_that_fails_leaves_the_previous_checkpoint_the_last(tmp_path, monkeypatch):
    """What the closing line of an aborted run names: last/last_step move only once the file is written."""
    from checkpoint import manager as manager_mod
    m, opt = _parts(0)
    mgr = CheckpointManager(tmp_path, {"model": m, "optimizer": opt, "train_state": TrainState(step=1)}, _meta(m),
                            describe, ranks=ONE)
    mgr.save(1)

    def interrupted(obj, path):
        raise KeyboardInterrupt
    monkeypatch.setattr(manager_mod, "save_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mgr.save(2)
    assert (mgr.last, mgr.last_step) == (tmp_path / "last.pt", 1)
    assert ck.load_checkpoint(tmp_path / "last.pt")["step"] == 1


def test_resume_checkpoint_picks_the_freshest_resumable_one(tmp_path):
    """true: last.pt with optimizer state vs last_dcp/, by step (an FSDP export, no optimizer, loses)."""
    m, opt = tiny_model_and_opt()
    train_steps(m, opt, 2, seed=1)
    meta = {"format": "tinygpt", "version": 1, "model": None, "optimizer": None, "step": 2,
            "model_config": m.config.to_dict(), "config": {}, "sharded": True}
    run = tmp_path / "run"
    S.save_sharded(run / S.LAST_DCP, m, opt, meta, ranks=ONE)
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
    # issue 43: a run kept without its last.pt: its best.pt is named, not "<path to last.pt>"
    kept = tmp_path / "kept"
    kept.mkdir()
    save_checkpoint({**meta, "model": m.state_dict(), "optimizer": opt.state_dict(), "step": 4}, kept / "best.pt")
    for spec, said in ((True, "train.resume=true: "), (str(kept), "")):
        with pytest.raises(CheckpointError, match=rf"^{said}{kept} has no last.pt, but its best.pt \(step 4\) can be "
                                                  rf"resumed: give train.resume={kept / 'best.pt'}$"):
            resume_checkpoint(spec, kept)
    assert resume_checkpoint(str(kept / "best.pt"), tmp_path)[0] == kept / "best.pt"


def test_overwrite_refusal(tmp_path):
    assert overwrite_refusal(tmp_path) is None
    (tmp_path / "last.pt").write_bytes(b"x")
    (tmp_path / "best.pt").write_bytes(b"x")
    assert overwrite_refusal(tmp_path) == (f"{tmp_path} already holds last.pt from an earlier run: continue it with "
                                           f"train.resume=true, or choose another hydra.run.dir (nothing was "
                                           f"overwritten)")


def _one_of_each(d, name):
    """`d` holding only `name` of an earlier run (a checkpoint that resumes, a file, or a snapshot in probes/)."""
    d.mkdir(parents=True)
    if name == "probes/":
        (d / "probes").mkdir()
        (d / "probes" / "step_000010.safetensors").write_bytes(b"snapshot")
    elif name.endswith(".pt"):
        save_checkpoint({"format": "tinygpt", "version": 1, "step": 10, "model": {}, "model_config": {},
                         "optimizer": {"state": {}, "param_groups": []}}, d / name)
    elif name == "last_dcp/":
        (d / "last_dcp").mkdir()
        (d / "last_dcp" / ".metadata").write_bytes(b"x")
    else:
        (d / name).write_bytes(b"the user's")


def test_a_new_run_never_overwrites_an_earlier_runs_files(tmp_path):
    """Issue 43: a directory holding a best.pt but no last.pt took a new run (best.pt became a 2-step model,
    metrics.jsonl replaced, the probe snapshots deleted). Any checkpoint, metrics.jsonl, loss.png or probes/ is
    named, with what to do; .hydra/, train.log and .lock (Hydra's for this very run) and empty dirs are not."""
    for name in ("best.pt", "model.pt", "metrics.jsonl", "loss.png", "probes/"):
        d = tmp_path / name.strip("/")
        _one_of_each(d, name)
        more = f" (to train on from it: train.resume={d / name})" if name.endswith(".pt") else ""
        assert overwrite_refusal(d) == (f"{d} already holds {name} from an earlier run, which a new run would "
                                        f"overwrite: choose another hydra.run.dir{more}, or move it out of {d} "
                                        f"(nothing was overwritten)"), name
    _one_of_each(tmp_path / "dcp", "last_dcp/")  # a sharded run: resumable
    assert overwrite_refusal(tmp_path / "dcp").startswith(f"{tmp_path / 'dcp'} already holds last_dcp/ from an "
                                                          f"earlier run: continue it with train.resume=true")
    d = tmp_path / "many"
    _one_of_each(d, "metrics.jsonl")
    for name in ("loss.png", "best.pt", "a.pt", "b.pt"):
        (d / name).write_bytes(b"not a checkpoint")  # (none that resumes: no train.resume offered)
    assert overwrite_refusal(d, "hydra.sweep.dir") == (
        f"{d} already holds best.pt, a.pt, b.pt, metrics.jsonl and 1 more from an earlier run, which a new run "
        f"would overwrite: choose another hydra.sweep.dir, or move them out of {d} (nothing was overwritten)")
    own = tmp_path / "own"  # what Hydra wrote for this run (a sweep's job, Hydra's own flags), an empty probes/
    (own / ".hydra").mkdir(parents=True)
    (own / ".hydra" / "config.yaml").write_text("x")
    for name in ("train.log", ".lock", "notes.txt"):
        (own / name).write_text("x")
    (own / "probes").mkdir()
    assert overwrite_refusal(own) is None and overwrite_refusal(tmp_path / "new") is None
    # a run stopped before step 1 trained nothing: rerunning its command is not refused (a step-0 eval and probe
    # snapshot, the summary, a torn line); one record past step 0, or a file not of tinygpt's, is
    stopped = tmp_path / "stopped"
    _one_of_each(stopped, "probes/")
    (stopped / "probes" / "step_000010.safetensors").rename(stopped / "probes" / "step_000000.safetensors")
    (stopped / "loss.png").write_bytes(b"png")
    step0 = [{"type": "eval", "step": 0, "val_loss": 4.2}, {"type": "summary", "status": "stopped", "step": 0}]
    for records, tail, refused in ((step0, "", False), (step0, '{"type": "tra', False), ([], "", False),
                                   ([], "my notes", True),
                                   ([*step0, {"type": "train", "step": 2}], "", True), ([{"step": 0}], "", True)):
        (stopped / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
        assert (overwrite_refusal(stopped) is not None) == refused, records
    (stopped / "metrics.jsonl").write_text(json.dumps(step0[0]) + "\n")
    (stopped / "best.pt").write_bytes(b"x")  # a checkpoint is always an earlier run's
    assert "already holds best.pt, metrics.jsonl, loss.png, probes/ from" in overwrite_refusal(stopped)


def _tree(d):
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*"))}


@pytest.mark.slow  # over ~1 s
def test_set_up_refuses_before_writing_anything_and_a_sweep_before_its_first_job(tmp_path, monkeypatch):
    """In process, as train.py and a sweep's job set up: the run directory is left exactly as it was (no .lock);
    a sweep's job names hydra.sweep.dir; a resume goes on; run_with_hydra refuses a sweep into an earlier one."""
    from launch import sweep
    from launch.run import set_up
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["experiment=cpu", "train.device=cpu"])
    run = tmp_path / "run"
    _one_of_each(run, "best.pt")
    before = _tree(run)
    for claim, key in ((True, "hydra.run.dir"), (False, "hydra.sweep.dir")):
        with pytest.raises(ValueError, match=rf"already holds best.pt .*: choose another {key} \(to train on"):
            set_up(cfg, run, claim=claim)
        assert _tree(run) == before
    cfg.train.resume = str(run / "best.pt")  # resuming from it (into another directory, or its own) is not refused
    set_up(cfg, tmp_path / "next", claim=False)
    set_up(cfg, run, claim=False)
    # ... but a checkpoint of elsewhere resumed into a directory holding another run's files writes it anew: refused
    other = tmp_path / "other"
    _one_of_each(other, "metrics.jsonl")
    before = _tree(other)
    with pytest.raises(ValueError, match=r"other already holds metrics.jsonl from an earlier run, which a new run "):
        set_up(cfg, other, claim=True)
    assert _tree(other) == before
    assert [starts_afresh(r, run) for r in (True, None, False, str(run), str(run / "best.pt"), str(other))] == [
        False, False, True, False, False, True]
    job = tmp_path / "sweep" / "1"
    _one_of_each(job, "metrics.jsonl")
    with pytest.raises(sweep.Failed, match=r"hydra.sweep.dir=sweep holds an earlier sweep's runs \(sweep.1 holds "
                                           r"metrics.jsonl\): choose another hydra.sweep.dir \(nothing"):
        sweep.run_with_hydra(["-m", "experiment=cpu", "optim.lr=1e-3,2e-3", "hydra.sweep.dir=sweep"],
                             [["experiment=cpu", "optim.lr=1e-3", "hydra.sweep.dir=sweep"]], lambda cfg: None)
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["1"]
