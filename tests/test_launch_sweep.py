"""launch/sweep.py: each job's record (status, best val, bpb from its metrics.jsonl) and the sweep's table."""
from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli
from launch.sweep import outcome, record, table, write_summary


def test_records_and_the_table_name_every_job_and_its_outcome(tmp_path):
    ok, bad = tmp_path / "0", tmp_path / "1"
    ok.mkdir()
    bad.mkdir()
    (ok / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"type": "eval", "step": 2, "val_loss": 3.0, "val_bpb": 4.0},
        {"type": "eval", "step": 4, "val_loss": 2.5, "val_bpb": 3.5})))
    jobs = [record(0, ["model=tiny", "optim.lr=1e-3"], ok, outcome("completed")),
            record(1, ["model=tiny", "optim.lr=9"], bad, outcome("diverged", "error: the loss became nan")),
            record(2, ["model=tiny", "optim.lr=1"], tmp_path / "2", RuntimeError("boom"))]
    assert [j["status"] for j in jobs] == ["completed", "diverged", "failed"]
    text = write_summary(tmp_path, jobs)
    assert "| 0 | optim.lr=1e-3 | completed | 2.5000 | 3.500 |" in text  # the shared model=tiny left out
    assert "| 1 | optim.lr=9 | diverged | - | - |" in text and "- job 1: error: the loss became nan" in text
    assert "- job 2: error: RuntimeError: boom" in text
    assert (tmp_path / "summary.md").read_text() == text + "\n"
    assert [json.loads(ln)["job"] for ln in (tmp_path / "summary.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert table(jobs[:1]).count("model=tiny") == 1  # one job: nothing is shared


@pytest.mark.slow
def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path, tiny_corpus):
    """Job 0 has bad data (an empty file), job 1 trains: the sweep runs both, prints and writes the table, exit 1."""
    (tmp_path / "empty.txt").write_text("")
    proc = run_cli(["train.py", "-m", "experiment=cpu", "train.device=cpu", "model.n_layer=1", "model.n_head=2",
                    "model.n_embd=32", "model.block_size=16", "train.batch_size=4", "train.eval_iters=2",
                    "train.max_iters=2", "train.eval_interval=2", "data=text",
                    f"data.path={tmp_path / 'empty.txt'},{tiny_corpus}", "hydra.sweep.dir=sweep"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "sweep: 1 of 2 jobs completed, 1 did not" in proc.stdout
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "| 0 | " in summary and "| failed |" in summary and "| 1 | " in summary and "| completed |" in summary
    assert (tmp_path / "sweep" / "1" / "last.pt").is_file()
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")][0] in summary
