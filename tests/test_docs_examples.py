"""The run output README and docs/ show is what the code prints: every marked block is its example
as tests/doc_examples.py renders it with the run's own functions (a line's format changed and the
docs were not: this fails; `python -m tests.doc_examples` rewrites them), and no run transcript in
those pages is copied by hand."""
from __future__ import annotations

import difflib
import re
import sys

import pytest

from tests import doc_examples
from tests.helpers import REPO

# lines a run prints (training.metrics.RunLog, runtime.signals' closing lines): a block holding one
# shows a run's output, so it must be a rendered example
RUN_LINE = re.compile(r"^(run dir|data|model|device|parallel|global batch): |^step \d+/\d+: |"
                      r"^done: \d|^resumed from |^resuming with |^stopped by |^interrupted; ", re.M)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


@pytest.mark.slow  # (each example composes its config and builds its model: seconds in all)
@pytest.mark.skipif(sys.platform == "win32", reason="the examples show POSIX paths and quoting")
def test_every_marked_example_is_what_the_code_prints():
    stale = []
    for page, (text, fresh) in doc_examples.rendered().items():
        if fresh != text:
            diff = difflib.unified_diff(text.splitlines(True), fresh.splitlines(True), page, page)
            stale.append("".join(diff))
    assert not stale, "the docs' example output is not what the code prints (to refresh: " \
                      "python -m tests.doc_examples):\n" + "\n".join(stale)


def test_every_run_transcript_in_the_docs_is_a_marked_example():
    unmarked, used = [], set()
    for page in doc_examples.PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        marks = list(doc_examples.MARKER.finditer(text))
        used |= {m[1] for m in marks}
        marked = {m.start() + m[0].index("```") for m in marks}
        for block in BLOCK.finditer(text):
            run_line = RUN_LINE.search(block[2])
            if block[1] in ("", "text") and run_line and block.start() not in marked:
                where = text[:block.start()].count("\n") + 1
                unmarked.append(f"{page}:{where}: {run_line[0]}...")
    assert not unmarked, "run output copied by hand (add it to tests/doc_examples.py and mark " \
                         "its block):\n" + "\n".join(unmarked)
    assert used == set(doc_examples.EXAMPLES), set(doc_examples.EXAMPLES) - used


def test_a_marker_takes_the_block_that_follows_it_and_only_that_one():
    text = ("<!-- example: cpu-run (python -m tests.doc_examples) -->\n```\nold\nlines\n```\n"
            "```bash\npython train.py\n```\n")
    found = [(m[1], m[2]) for m in doc_examples.MARKER.finditer(text)]
    assert found == [("cpu-run", "old\nlines\n")]
