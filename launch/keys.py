"""docs/configuration.md's tables of keys and of optimizers, written from the code:
`python -m launch.keys --write`.

A setting's default and meaning have one home, its dataclass field (training/config.py,
model/config.py, data/config.py): the default is `training.config.Config()`'s (what
`experiment=null` runs), the meaning the field's comment, trailing it or on the full-line comments
right above it (a comment about several fields stays out: a blank line under it). An optimizer's
row is its entry in `training.optim.OPTIMIZERS`. So a new setting is its field with a comment and
the line that reads it, and the docs follow by this one command; tests/test_docs_agree.py fails,
naming the command, when the doc is stale.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from pathlib import Path

from training.config import Config
from training.optim import OPTIMIZERS

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "configuration.md"
COMMAND = "python -m launch.keys --write"
# the tokenizer's, not a setting (training.config.check refuses it)
LEFT_OUT = ("model.vocab_size",)


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` and its comment: the one trailing it, else the full-line
    comments right above it (up to a blank line, code or the class's start). A field without
    either is a ValueError."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    comments = {t.start[0]: t.string.lstrip("#").strip()
                for t in tokens if t.type == tokenize.COMMENT}
    # a full-line comment is alone on its line; a trailing one follows code
    alone = {n for n in comments if lines[n - 1].lstrip().startswith("#")}
    found = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above = node.lineno - 1
        while not text and above in alone:
            above -= 1
        text = text or [comments[n] for n in range(above + 1, node.lineno)]
        if not text:
            where = Path(inspect.getsourcefile(cls)).relative_to(REPO)
            raise ValueError(f"{where}: {cls.__name__}.{node.target.id} has no comment: say what "
                             f"it does in a comment after it or on the line above, then run "
                             f"{COMMAND}")
        found[node.target.id] = " ".join(text)
    return found


def shown(value) -> str:
    """A default as the command line writes it: null, true, 0.002, auto, [a, b]."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def key_rows() -> list[str]:
    """One row per key: `group.name`, its default, its field's comment; in Config's order."""
    config, rows = Config(), ["| key | default | meaning |", "|---|---|---|"]
    for group in dataclasses.fields(Config):
        values = getattr(config, group.name)
        comments = field_comments(type(values))
        for f in dataclasses.fields(values):
            key, value = f"{group.name}.{f.name}", shown(getattr(values, f.name))
            if key not in LEFT_OUT:
                rows.append(f"| `{key}` | `{value}` | {cell(comments[f.name])} |")
    return rows


def optimizer_rows() -> list[str]:
    """One row per entry of training.optim.OPTIMIZERS: what it is, the settings it reads."""
    rows = ["| `optim.name` | what | settings it reads (besides the schedule's and "
            "`optim.grad_clip`) |", "|---|---|---|"]
    for name, spec in OPTIMIZERS.items():
        reads = ", ".join(f"`optim.{k}`" for k in spec.reads)
        fsdp = f"; not with `train.parallel=fsdp` ({spec.no_fsdp})" if spec.no_fsdp else ""
        rows.append(f"| `{name}` | {cell(spec.about)}{fsdp} | {reads} |")
    return rows


TABLES = {"keys": key_rows, "optimizers": optimizer_rows}


def marker(name: str, end: bool = False) -> str:
    return f"<!-- {'end of ' if end else ''}{name}: written by {COMMAND}, do not edit by hand -->"


def written(doc: str) -> str:
    """`doc` with each table between its markers written anew from the code."""
    for name, rows in TABLES.items():
        start, end = marker(name), marker(name, end=True)
        assert start in doc and end in doc, f"{DOC.name} lost the markers {start} ... {end}"
        before, rest = doc.split(start, 1)
        doc = before + start + "\n" + "\n".join(rows()) + "\n" + end + rest.split(end, 1)[1]
    return doc


def main(argv: list[str]) -> int:
    """--write: rewrite the doc's tables; --check (the default): exit 1 when they are stale."""
    doc = DOC.read_text(encoding="utf-8")
    new = written(doc)
    if argv == ["--write"]:
        if new != doc:
            DOC.write_text(new, encoding="utf-8")
        print(f"{DOC}: {'written' if new != doc else 'up to date'}")
        return 0
    if argv not in ([], ["--check"]):
        print(f"usage: {COMMAND} (or --check)", file=sys.stderr)
        return 2
    if new != doc:
        print(f"{DOC}'s tables of keys are stale: run {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
