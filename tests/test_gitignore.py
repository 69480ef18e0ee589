""".gitignore: every path the README and docs have a user create in the checkout (a virtual
environment, an export, a download, a run directory, an example's output file) is ignored, so that
following them leaves `git status` clean and bench.py does not label the commit "uncommitted
changes"."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

# the commands in the pages that write a path of the user's choosing into the current directory
CREATES = [
    r"python -m venv ([\w.-]+)",
    r"--local-dir ([\w.-]+)",
    r"export\.py --hf ([\w.-]+)",
    r"export\.py --pt \S+ -o ([\w.-]+)",
    r"bench\.py[^\n`]* --out ([\w.-]+)",
    r"hydra\.run\.dir=([\w-]+)/",  # a run directory's top folder (runs/demo)
    r"`> ([\w.-]+)`",  # an output redirected to a file (sample.py's text)
]


def created_paths() -> set[str]:
    """Every path the pages create (placeholders such as DIR and RUN left out)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    found = {m for pattern in CREATES for m in re.findall(pattern, text)}
    return {m for m in found if not m.isupper()}


def test_every_path_the_docs_create_in_the_checkout_is_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = created_paths()
    assert {".venv", "exported", "gpt2", "runs"} <= paths  # the README's own: the patterns find them
    # a directory is checked through a file inside it (`exported/` matches directories only)
    probe = [f"{p}/x" if "." not in p or p.startswith(".") else p for p in sorted(paths)]
    out = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--verbose",
                          "--non-matching", *probe], capture_output=True, text=True)
    said = out.stdout.splitlines()
    not_ignored = [line.split("\t")[-1] for line in said if line.startswith("::")]
    assert len(said) == len(probe) and not not_ignored, f"not in .gitignore: {not_ignored}"
