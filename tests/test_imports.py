"""Imports point one way: the table below says which package may import which, and no two files import each other
(directly or round a loop). Every import counts: those inside functions (they only hide a dependency until the
function runs) and those under `if TYPE_CHECKING:` (a type is a dependency too). docs/design.md draws the layers."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

# Top to bottom. A module may import its own package and any package of a LOWER layer, never a peer or one above.
LAYERS = [
    ("entry scripts", {"train", "sample", "eval", "export", "explore", "bench", "benchmarks",
                       "serve"}),
    ("the run's edge (Hydra)", {"launch"}),
    ("training", {"training"}),
    ("talking to a model: the terminal, the OpenAI endpoint", {"chat"}),
    ("runtime services, pictures", {"runtime", "viz"}),
    ("checkpoints, benchmarks' scoring", {"checkpoint", "evals"}),
    ("the model, the data", {"model", "data"}),
    ("common", {"common"}),
]
PEERS = {("bench", "benchmarks")}  # bench.py runs its sections
INFERENCE = {"sample", "eval", "explore", "viz",
             "serve", "chat"}  # never through training/ or the run's process (docs/design.md)
ONLY_HERE = {"hydra": {"launch"}, "omegaconf": {"launch"},  # third-party modules and the packages that may use them
             "matplotlib": {"viz"}, "torch.distributed": {"runtime", "checkpoint"},
             "psutil": {"common"}, "platformdirs": {"common"}}  # (OS facts: common.platform; the cache: common.files)


def _modules() -> dict[str, Path]:
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    paths = [REPO / f for f in files.stdout.split() if not f.startswith("tests/")]
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}


def _imports(path: Path, name: str, modules: dict[str, Path], third_party: bool = False) -> set[str]:
    """The project modules `path` (module `name`) imports anywhere in it (or, `third_party`, every module name)."""
    tree, found = ast.parse(path.read_text(encoding="utf-8")), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *[base] * bool(base)])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return found if third_party else {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return None
    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def allowed(importer: str, imported: str) -> bool:
    """May package `importer` import package `imported`? (the table above)"""
    level = {p: i for i, (_, packages) in enumerate(LAYERS) for p in packages}
    if importer == imported or (importer, imported) in PEERS:
        return True
    if importer in INFERENCE and imported in {"training", "launch", "runtime"}:
        return False
    if importer == "model":
        return imported == "common"
    return level[imported] > level[importer]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, m, modules) for m, p in modules.items()}


def test_the_checker_sees_a_loop_and_the_table_says_no_to_an_upward_import():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert allowed("training", "runtime") and not allowed("runtime", "training") and not allowed("sample", "training")
    assert not allowed("model", "data") and not allowed("viz", "runtime") and allowed("bench", "benchmarks")


def test_every_package_is_in_the_table(graph):
    known = set().union(*(packages for _, packages in LAYERS))
    assert {m.split(".")[0] for m in graph} <= known


def test_imports_point_down_the_layers(graph):
    assert "launch.sweep" in graph["train"]  # the scan sees train.py's function-level import
    wrong = sorted(f"{m} -> {n}" for m, ns in graph.items() for n in ns if not allowed(m.split(".")[0], n.split(".")[0]))
    assert not wrong, "imports against the layers (tests/test_imports.py's table):\n" + "\n".join(wrong)


def test_no_import_loops(graph):
    reach = {}
    for m in graph:
        seen, todo = set(), [m]
        while todo:
            for n in graph[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        reach[m] = seen
    groups = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}  # each loop's modules
    loops = [" -> ".join(_cycle({m: graph[m] & g for m in g})) for g in groups]
    assert not loops, "import loops:\n" + "\n".join(sorted(loops))


def test_hydra_matplotlib_and_process_groups_stay_in_their_homes():
    modules, wrong = _modules(), []
    for m, p in modules.items():
        for name in _imports(p, m, modules, third_party=True):
            for lib, homes in ONLY_HERE.items():
                if (name == lib or name.startswith(lib + ".")) and m.split(".")[0] not in homes:
                    wrong.append(f"{m} imports {name} (only {', '.join(sorted(homes))} may)")
    assert not wrong, "\n".join(sorted(wrong))
