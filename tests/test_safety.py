"""Safety: checkpoints never run code, the project never execs/unpickles, a run writes only where it should.

- A checkpoint that carries a pickled object (one whose unpickling would run code, and a dict subclass)
  is refused by checkpoint.file.load_checkpoint, by `python sample.py --checkpoint` and by
  `python train.py train.resume=...`, each with one clear line, and the payload never runs.
- A static scan (AST, not grep: `model.eval()` and `except pickle.UnpicklingError` are fine) of every
  project .py file outside tests/ finds no eval/exec, no unpickling, no torch.load without
  weights_only=True, no shell=True / os.system, no unsafe YAML and no Hydra instantiate/_target_.
- A training run, given a corpus whose path is full of shell syntax, writes only its run directory and
  the cache directory: the cwd tree, HOME and the temp dir are otherwise unchanged.
"""
from __future__ import annotations

import ast
import collections
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO
from checkpoint import file as ck

TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.eval_iters=2", "optim.warmup_iters=2"]


class RunsCode:
    """Unpickling this calls os.mkdir(marker): proof that a file would execute code if it were unpickled."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


class FancyDict(collections.OrderedDict):
    """A dict subclass: harmless here, but only plain containers may come out of a checkpoint."""


def _evil_checkpoints(tmp_path: Path, marker: Path) -> dict[str, Path]:
    from model.config import GPTConfig
    from model.gpt import GPT
    cfg = GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8)
    base = {"format": "tinygpt", "version": 1, "step": 1, "model": GPT(cfg).state_dict(),
            "model_config": cfg.to_dict(), "tokenizer": {"type": "char", "chars": "abcdefgh"}}
    out = {"code": tmp_path / "runs_code.pt", "subclass": tmp_path / "dict_subclass.pt"}
    torch.save({**base, "extra": RunsCode(marker)}, out["code"])
    torch.save({**base, "model": FancyDict(base["model"])}, out["subclass"])
    return out


def _one_error_line(proc) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: ") and sum(ln.startswith("error:") for ln in lines) == 1, \
        proc.stderr
    return lines[-1]


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)


@pytest.mark.slow
def test_checkpoint_with_pickled_objects_is_refused_everywhere(tmp_path, tiny_corpus):
    marker = tmp_path / "the_payload_ran"
    evil = _evil_checkpoints(tmp_path, marker)
    torch.load(evil["code"], weights_only=False)  # the payload is live: plain unpickling runs it ...
    assert marker.is_dir()
    marker.rmdir()

    with pytest.raises(ck.CheckpointError, match=r"contains a pickled Python object \((posix|os)\.mkdir\), "
                                                 r"which tinygpt refuses to load") as info:
        ck.load_checkpoint(evil["code"])
    assert "\n" not in str(info.value)
    with pytest.raises(ck.CheckpointError, match=r"pickled Python object \(.*FancyDict\)"):
        ck.load_checkpoint(evil["subclass"])

    proc = subprocess.run([sys.executable, str(REPO / "sample.py"), "--checkpoint", str(evil["code"])],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    line = _one_error_line(proc)
    assert "runs_code.pt contains a pickled Python object" in line and "use a checkpoint written by" in line

    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, "data=text", f"data.path={tiny_corpus}",
                           f"train.resume={evil['subclass']}", "hydra.run.dir=run"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    assert "dict_subclass.pt contains a pickled Python object" in line and "refuses to load" in line
    assert not marker.exists()  # ... and tinygpt never did


# ------------------------------------------------------------------------------------------ static scan

UNPICKLERS = {"dill", "cloudpickle", "marshal", "shelve", "joblib", "_pickle", "cPickle"}


def _project_files() -> list[Path]:
    skip = {"tests", "outputs", "multirun", "wandb", "bench_results"}
    files = []
    for f in sorted(REPO.rglob("*.py")):
        parts = f.relative_to(REPO).parts
        if parts[0] in skip or any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        files.append(f)
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _refusing_unpicklers(tree: ast.AST) -> set[int]:
    """The `pickle.Unpickler` base-class nodes of classes whose find_class only raises: an unpickler that admits plain
    data and calls nothing (checkpoint/nanogpt.py's, for nanoGPT's meta.pkl) is no way to run code."""
    ok = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            body = [s for s in getattr(methods.get("find_class"), "body", [])
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # (its docstring)
            if body and all(isinstance(s, ast.Raise) for s in body):
                ok |= {id(b) for b in node.bases if _dotted(b) == "pickle.Unpickler"}
    return ok


def unsafe_uses(source: str, name: str = "<src>") -> list[str]:
    """Every construct that could run code from data or a user string, as 'file:line: what'."""
    found = []
    tree = ast.parse(source)
    refusing = _refusing_unpicklers(tree)

    def bad(node, what):
        found.append(f"{name}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in UNPICKLERS:
                    bad(node, f"import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            if mod in UNPICKLERS or (mod == "pickle" and any(a.name != "UnpicklingError" for a in node.names)):
                bad(node, f"from {node.module} import ...")
            if node.module == "hydra.utils" and any(a.name in ("instantiate", "call") for a in node.names):
                bad(node, "hydra.utils.instantiate/call")
        elif isinstance(node, ast.Attribute) and _dotted(node.value) == "pickle" and node.attr != "UnpicklingError" \
                and id(node) not in refusing:
            bad(node, f"pickle.{node.attr}")
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func)
            kw = {k.arg: k.value for k in node.keywords}
            if fn in ("eval", "exec", "compile", "__import__", "builtins.eval", "builtins.exec"):
                bad(node, f"{fn}()")
            if fn in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput") \
                    or fn.startswith("os.exec") or fn.startswith("os.spawn"):
                bad(node, f"{fn}()")
            if _is_true(kw.get("shell")):
                bad(node, f"{fn}(shell=True)")
            if fn.endswith("subprocess.run") or fn.endswith("subprocess.Popen") or fn.endswith("check_output") \
                    or fn.endswith("check_call") or fn.endswith("subprocess.call"):
                if node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                    bad(node, f"{fn}() with a command string")
            if fn.endswith("torch.load") and not _is_true(kw.get("weights_only")):
                bad(node, f"{fn}() without weights_only=True")
            elif "weights_only" in kw and not _is_true(kw["weights_only"]):
                bad(node, f"{fn}(weights_only=...) not True")
            if _is_true(kw.get("allow_pickle")):
                bad(node, f"{fn}(allow_pickle=True)")
            if "pickle_module" in kw:
                bad(node, f"{fn}(pickle_module=...)")
            if fn in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all"):
                bad(node, f"{fn}()")
            if fn.endswith("instantiate") or fn in ("hydra.utils.call",):
                bad(node, f"{fn}()")
    return found


def test_the_scanner_catches_what_it_looks_for():
    src = ("import pickle, dill\nfrom pickle import loads\nx = pickle.loads(b'')\neval('1')\nexec('x=1')\n"
           "import os, subprocess, torch, yaml\nos.system('ls')\nsubprocess.run('ls', shell=True)\n"
           "subprocess.run('ls')\ntorch.load('f')\ntorch.load('f', weights_only=False)\n"
           "import numpy as np\nnp.load('f', allow_pickle=True)\nyaml.load(s)\n"
           "from hydra.utils import instantiate\ninstantiate(cfg)\n"
           "class U(pickle.Unpickler):\n    def find_class(self, m, n):\n        return super().find_class(m, n)\n")
    assert len(unsafe_uses(src)) == 16, unsafe_uses(src)
    fine = ("import pickle\ntry:\n    pass\nexcept pickle.UnpicklingError:\n    pass\nmodel.eval()\n"
            "torch.load(p, map_location='cpu', weights_only=True)\ntorch.compile(m)\n"
            "subprocess.run(['git', 'status'], capture_output=True)\n"
            "class Plain(pickle.Unpickler):\n    def find_class(self, m, n):\n        'no globals'\n"
            "        raise pickle.UnpicklingError(m)\n")
    assert unsafe_uses(fine) == []


def test_project_code_never_execs_unpickles_or_shells_out():
    files = _project_files()
    names = {f.relative_to(REPO).as_posix() for f in files}
    assert {"train.py", "sample.py", "checkpoint/file.py", "training/loop.py", "data/prepare.py",
            "model/gpt.py"} <= names
    found = [hit for f in files for hit in unsafe_uses(f.read_text(encoding="utf-8"), f.relative_to(REPO).as_posix())]
    assert found == []
    yaml_hits = [f.relative_to(REPO).as_posix() for f in (REPO / "conf").rglob("*.yaml") if "_target_" in f.read_text()]
    assert yaml_hits == []  # no config ever names a class or function for Hydra to import and call


# ----------------------------------------------------------------------------------------- where it writes

def _tree(root: Path) -> dict[str, str]:
    """Every path under root -> sha256 (files), 'dir' or 'link'."""
    out = {}
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.slow
def test_a_training_run_writes_only_its_run_dir_and_the_cache(tmp_path, tiny_corpus):
    """Default run dir (outputs/DATE/TIME under the cwd), HOME and TMPDIR pointed into the tree."""
    weird = tmp_path / "my corpus; $(touch PWNED) `touch PWNED2` x.txt"  # shell syntax, used as a plain path
    weird.write_bytes(tiny_corpus.read_bytes())
    home, tmpdir = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmpdir.mkdir()
    env = _env(HOME=str(home), TMPDIR=str(tmpdir), WANDB_MODE="disabled")
    for k in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        env.pop(k, None)
    # the CUDA driver's JIT cache (~/.nv/ComputeCache on a GPU machine) is the driver's write, not ours
    env["CUDA_CACHE_PATH"] = tempfile.mkdtemp(prefix="tinygpt-test-nv-")
    cache = Path(os.environ["TINYGPT_CACHE"])
    before = _tree(tmp_path)

    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, "data=text", f"data.path='{weird}'",
                           "train.max_iters=2", "train.eval_interval=2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    after = _tree(tmp_path)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    runs = sorted({"/".join(k.split("/")[:3]) for k in changed if k.startswith("outputs/") and k.count("/") >= 2})
    assert len(runs) == 1 and (tmp_path / runs[0] / "last.pt").is_file(), changed
    cache_rel = cache.relative_to(tmp_path).as_posix()
    # torch itself creates an empty torchinductor_<user> directory in the temp dir when torch._dynamo is
    # imported; it holds nothing (no compilation on CPU) and is the only thing allowed there
    torch_tmp = {k for k in changed if k.startswith("tmp/torchinductor_") and after.get(k) == "dir"}
    outside = [k for k in changed if k not in ("outputs", "outputs/" + runs[0].split("/")[1], "outputs/latest")
               and not k.startswith(runs[0]) and not k.startswith(cache_rel) and k not in torch_tmp]
    assert outside == [], outside
    assert (tmp_path / "outputs" / "latest").resolve() == (tmp_path / runs[0]).resolve()  # the newest run
    assert not any(k.startswith("home/") for k in after), "HOME was written to"
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    assert ck.load_checkpoint(tmp_path / runs[0] / "last.pt")["config"]["data"]["path"] == str(weird)
