"""What a fresh machine installs and runs: requirements.txt names every third-party module the documented
commands import, those commands import where no POSIX-only module exists (Windows), and the CI workflow
users can run tests on Linux, Windows and macOS."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

ENTRY_POINTS = ["train.py", "sample.py", "eval.py", "export.py", "bench.py", "explore.py", "data/prepare.py",
                "serve.py", "data/chat_tasks.py"]


def _module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def reachable_imports() -> tuple[set[Path], set[str]]:
    """(the repository's files the entry points reach through imports, the other top-level modules imported),
    imports inside functions included."""
    todo, seen, outside = [REPO / e for e in ENTRY_POINTS], set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if _module_file(parts[0]) is None:
                    if parts[0] not in sys.stdlib_module_names:
                        outside.add(parts[0])
                    continue
                todo += [f for i in range(1, len(parts) + 1) if (f := _module_file(".".join(parts[:i])))]
    return seen, outside


# heavy packages used by a single feature: imported only there (one line naming the pip command when missing)
OPTIONAL = {"pyarrow", "datasets", "tokenizers", "lm_eval", "gguf"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> set[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {_normal(re.split(r"[<>=!~;\[ ]", line)[0]) for line in lines if line and not line.startswith("-")}


def test_requirements_name_every_third_party_module_the_commands_import():
    files, modules = reachable_imports()
    assert {"train.py", "common/run_lock.py", "model/hf.py", "training/config.py"} <= {
        p.relative_to(REPO).as_posix() for p in files}
    assert {"torch", "hydra", "omegaconf", "safetensors", "tiktoken"} <= modules
    dists = importlib.metadata.packages_distributions()
    required = requirement_names(REPO / "requirements.txt")
    names = {m: {_normal(d) for d in dists.get(m, [m])} for m in modules}
    missing = {m: sorted(n) for m, n in names.items() if m not in OPTIONAL and not n & required}
    assert missing == {}, f"add to requirements.txt: {missing}"
    dev = requirement_names(REPO / "requirements-dev.txt")  # optional extras: imported only where used, tested
    assert {m: sorted(n) for m, n in names.items() if m in OPTIONAL and not n & dev} == {}
    assert not OPTIONAL & {m for m, n in names.items() if n & required}, "an optional extra is in requirements.txt"
    assert "huggingface-hub" not in required  # `hf download` is the user's tool: tinygpt never imports it


@pytest.mark.slow
def test_the_commands_import_without_posix_only_modules():
    """Windows has no fcntl, termios, pwd, grp or resource: every documented command must still load."""
    code = ("import sys, types, subprocess, getpass, psutil\n"  # stdlib modules that probe for msvcrt load first;
            # psutil too: its Linux layer imports resource (on Windows it loads its own)
            "for m in ('fcntl', 'termios', 'pwd', 'grp', 'resource'): sys.modules[m] = None\n"
            "sys.modules['msvcrt'] = types.ModuleType('msvcrt')\n"
            "import train, sample, eval, export, bench, data.prepare, common.run_lock\n"
            "import filelock\nassert not filelock.has_fcntl\n")  # the locks' library saw no fcntl
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def workflow() -> dict:
    yaml = pytest.importorskip("yaml")  # PyYAML comes with hydra's omegaconf
    return yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())


def _jobs(workflow: dict) -> list[dict]:
    """One dict per job the matrix expands to: its os, torch index, pytest args and shell commands."""
    out = []
    for job in workflow["jobs"].values():
        for entry in job["strategy"]["matrix"]["include"]:
            def fill(text: str) -> str:
                return re.sub(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}", lambda m: str(entry[m.group(1)]), text)
            out.append({**entry, "runs-on": fill(job["runs-on"]),
                        "run": [fill(s["run"]) for s in job["steps"] if "run" in s]})
    return out


def test_ci_tests_on_linux_windows_and_macos(workflow):
    assert {"push", "pull_request", "workflow_dispatch"} <= set(workflow.get("on", workflow.get(True)))
    jobs = {j["runs-on"]: j for j in _jobs(workflow)}
    assert set(jobs) == {"ubuntu-latest", "windows-latest", "macos-latest"}
    readme_command = "pip install -r requirements-dev.txt && python -m pytest"
    assert readme_command in (REPO / "README.md").read_text()
    pins = set()
    for os_name, job in jobs.items():
        torch = [c for c in job["run"] if "pip install torch==" in c]
        assert len(torch) == 1, os_name
        pins.add(re.search(r"torch==([\d.]+)", torch[0]).group(1))
        assert ("download.pytorch.org/whl/cpu" in torch[0]) == (os_name == "ubuntu-latest")  # no CUDA wheels
        tests = [c for c in job["run"] if readme_command in c]
        assert len(tests) == 1 and "python -m pytest" in tests[0], os_name
        assert ('-m "not slow"' in tests[0]) == (os_name != "ubuntu-latest"), os_name
    floor, ceiling = re.search(r"torch>=([\d.]+),<([\d.]+)", (REPO / "requirements.txt").read_text()).groups()
    version = [tuple(map(int, v.split("."))) for v in (*pins, floor, ceiling)]
    assert len(pins) == 1 and version[1] <= version[0] < version[2]  # one torch, inside requirements' range


def test_ci_installs_into_a_fresh_venv_as_the_readme_says():
    """A machine-wide older pytest once hid three failures: .ci/run makes a new venv, installs torch's CPU build
    first, then runs the README's own commands in it."""
    script = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "python -m venv .venv && . .venv/bin/activate" in readme
    steps = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    venv = next(i for i, s in enumerate(steps) if s.startswith("python -m venv --clear"))
    activate = next(i for i, s in enumerate(steps) if s.startswith('. "$venv/bin/activate"'))
    torch = next(i for i, s in enumerate(steps) if "pip install" in s and "torch==" in s)
    test = steps.index("pip install -r requirements-dev.txt && python -m pytest")
    assert venv < activate < torch < test and test == len(steps) - 1
    assert "pip install -r requirements-dev.txt && python -m pytest" in readme
