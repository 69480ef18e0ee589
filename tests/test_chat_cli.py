"""From a base run to an answer, as docs/chat.md's commands: the task written, the base run
fine-tuned on it (experiment=sft_cpu, the chat tokens' rows added), eval.py --chat-exact, sample.py
--chat (multi-turn, /reset, --system, the end of input) and a base model told it has no template."""
from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the base run, the SFT run, the task directory), made once: 2 steps each."""
    from tests.conftest import SHARED_DATA as shared_data_dir
    if shared_data_dir is None:
        pytest.skip("Tiny Shakespeare not found: set TINYGPT_SHARED_DATA")
    root = tmp_path_factory.mktemp("chat")
    env = {"TINYGPT_CACHE": str(root / "cache")}
    (root / "cache" / "tinyshakespeare").mkdir(parents=True)
    shakespeare = shared_data_dir / "tinyshakespeare.txt"
    (root / "cache" / "tinyshakespeare" / "input.txt").symlink_to(shakespeare)
    run_cli(["-m", "data.chat_tasks", "--out", str(root / "task"), "--train", "300",
             "--heldout", "4"], env=env, check=True)
    run_cli(["train.py", "experiment=cpu", "train.max_iters=2", f"hydra.run.dir={root / 'base'}"],
            env=env, check=True)
    sft = run_cli(["train.py", "experiment=sft_cpu", f"model.init_from={root / 'base'}",
                   f"data.path={root / 'task' / 'train.jsonl'}", "train.max_iters=2",
                   "train.eval_interval=2",
                   "optim.warmup_iters=0", f"hydra.run.dir={root / 'sft'}"], env=env, check=True)
    return root, env, sft.stdout + sft.stderr


@pytest.mark.slow
def test_the_chat_tokens_get_rows_and_the_run_learns_answers_only(runs):
    _, _, out = runs
    assert "no rows for 4 chat token(s)" in out and "train tokens learnt" in out


@pytest.mark.slow
def test_exact_match_is_scored(runs):
    root, env, _ = runs
    r = run_cli(["eval.py", "--chat-exact", str(root / "task" / "heldout.jsonl"),
                 "--run", str(root / "sft"), "--json", "--max-new-tokens", "4"], env=env,
                check=True)
    got = json.loads(r.stdout)
    assert got["examples"] == 4 and 0 <= got["exact_match"] <= 1


@pytest.mark.slow
def test_chat_in_the_terminal(runs):
    root, env, _ = runs
    import os
    import subprocess
    import sys

    from tests.helpers import REPO
    args = [sys.executable, str(REPO / "sample.py"), "--chat", "--run", str(root / "sft"),
            "--system", "Be brief.", "--max-new-tokens", "4", "--seed", "1"]
    p = subprocess.run(args, input="Spell cat.\n/reset\nhi\n", capture_output=True, text=True,
                       timeout=300, env={**os.environ, **env})
    assert p.returncode == 0, p.stderr
    assert "forgotten" in p.stderr
    base = run_cli(["sample.py", "--chat", "--run", str(root / "base")], env=env)
    assert base.returncode == 2 and "no chat template" in base.stderr
    assert len(base.stderr.splitlines()) <= 2
    wrong = run_cli(["sample.py", "--system", "x"], env=env)
    assert wrong.returncode == 2 and "--chat" in wrong.stderr
