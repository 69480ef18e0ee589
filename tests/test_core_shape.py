"""The core a learner reads (issue 51): training as one function that imports little, called by train.py
itself, with everything around a run behind the hooks; and the plain hooks train from Python alone."""
from __future__ import annotations

import ast
import json
import math

import pytest

from tests.helpers import REPO, run_cli

PROJECT = {"common", "data", "model", "training", "runtime", "checkpoint", "launch", "viz", "evals"}
TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_kv_head=2",
        "model.n_embd=32", "model.block_size=16", "train.batch_size=4", "train.eval_iters=1",
        "train.max_iters=2", "train.eval_interval=2"]

# train.py run as it is, its optimizer step spied on: the stack between train.py's module and the step
FRAMES = """
import json, runpy, sys, traceback
import training.loop as loop
real, seen = loop.optimizer_step, []
def spy(*args, **kwargs):
    seen.append([(f.filename, f.name) for f in traceback.extract_stack()[:-1]])
    return real(*args, **kwargs)
loop.optimizer_step = spy
sys.argv = ["train.py", *sys.argv[1:]]
try:
    runpy.run_path("train.py", run_name="__main__")
except SystemExit:
    pass
print("FRAMES " + json.dumps(seen[0]))
"""


def project_modules_imported(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.split(".")[0] in PROJECT}


def test_the_training_function_imports_at_most_eight_project_modules():
    imported = project_modules_imported(REPO / "training" / "loop.py")
    assert len(imported) <= 8, sorted(imported)
    # what it may not know of: checkpoints, the console, signals, Hydra, the trace
    assert not {m for m in imported if m.split(".")[0] in ("checkpoint", "launch", "runtime", "viz")}
    assert "common.startup" not in imported


@pytest.mark.slow  # a training run in its own process
def test_at_the_optimizer_step_train_py_is_three_project_frames_away(tmp_path, tiny_corpus):
    args = [*TINY, "data=text", f"data.path={tiny_corpus}", f"hydra.run.dir={tmp_path / 'run'}"]
    script = tmp_path / "frames.py"
    script.write_text(FRAMES)
    proc = run_cli([str(script), *args], cwd=REPO, check=True)
    frames = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("FRAMES "))[7:])
    top = max(i for i, (f, name) in enumerate(frames) if f.endswith("train.py") and name == "<module>")
    below = [(f, name) for f, name in frames[top + 1:] if (REPO / f).resolve().is_relative_to(REPO)]
    # main -> train, then the step itself (spied on here): at most 3 project frames
    assert [name for _, name in below] == ["main", "train"], below


def test_the_plain_hooks_train_from_python_with_nothing_around(tiny_corpus, tmp_path, monkeypatch):
    """training.loop.train(config) with the plain hooks: no run directory, no checkpoint, no output
    files; the loss falls."""
    from training.config import Config, OptimConfig, TrainConfig
    from training.hooks import Hooks
    from training.loop import train
    from data.config import DataConfig
    from model.config import GPTConfig
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    config = Config(model=GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, dropout=0.0),
                    data=DataConfig(name="text", path=str(tiny_corpus)),
                    optim=OptimConfig(lr=1e-2, warmup_iters=2),
                    train=TrainConfig(max_iters=30, batch_size=8, eval_interval=15, eval_iters=2))
    losses = []

    class Watch(Hooks):
        def evaluated(self, run, stats):
            losses.append(stats["val"]["loss"])
    state = train(config, Watch())
    assert state.step == 30 and len(losses) == 2 and losses[1] < losses[0] and math.isfinite(losses[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", tiny_corpus.name]
