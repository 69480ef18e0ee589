"""The project's modules import one another without loops, counting the imports inside functions too (they
only hide a loop until the function runs); `if TYPE_CHECKING:` imports never run and are left out."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO


def _modules() -> dict[str, Path]:
    skip = {"tests", ".git", ".mirror", "outputs", "multirun"}
    return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
            for p in REPO.rglob("*.py") if not skip & set(p.relative_to(REPO).parts)}


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` (module `name`) imports, anywhere in it."""
    tree, found = ast.parse(path.read_text(encoding="utf-8")), set()
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *[base] * bool(base)])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules and m != name}


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


def test_the_checker_sees_a_loop_hidden_in_a_function():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _reach(graph: dict[str, set[str]], m: str) -> set[str]:
    seen, todo = set(), [m]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_no_import_loops():
    modules = _modules()
    graph = {m: _imports(p, m, modules) for m, p in modules.items()}
    assert "training.loop" in graph["train"]  # the scan sees train.py's function-level import
    reach = {m: _reach(graph, m) for m in graph}
    groups = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}  # each loop's modules
    loops = [" -> ".join(_cycle({m: graph[m] & g for m in g})) for g in groups]
    assert not loops, "import loops:\n" + "\n".join(sorted(loops))
