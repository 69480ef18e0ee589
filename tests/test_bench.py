"""bench.py: a tiny end-to-end run of the CLI, its argument errors, and the pieces the GPU/quality runs rely on."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

import bench
from tests.helpers import REPO, run_cli


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_cli_smoke_tiny_sizes(tmp_path, cache_with_shakespeare, cache_with_gpt2, optim):
    out = tmp_path / "r.json"
    proc = run_cli(["bench.py", "--only", "train,decode,prep", "--presets", "tiny", "--steps", "2", "--warmup", "0",
                    "--optim", optim,
                    "--decode-tokens", "8", "--decode-reps", "1", "--decode-preset", "tiny", "--prep-mb", "0.3",
                    "--threads", "1", "--device", "cpu", "--out", str(out)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["format"] == "tinygpt-bench" and r["hardware"]["torch"]
    assert set(r["sections"]) == {"train", "decode", "prep"} and not r["errors"]
    (row,) = r["sections"]["train"]["rows"]
    assert row["preset"] == "tiny" and row["measured_steps"] == 2 and row["tokens_per_s"] > 0
    assert row["optimizer"] == optim and f"training throughput ({optim};" in proc.stdout
    assert row["mfu"] is None  # CPU: no peak FLOP/s, so no MFU rather than a wrong one
    assert row["model_config"]["n_layer"] == bench.model_preset("tiny")["n_layer"]
    modes = {d["mode"]: d for d in r["sections"]["decode"]["rows"]}
    assert set(modes) == {"kv_cache", "no_cache"} and all(m["tokens_per_s"] > 0 for m in modes.values())
    p = r["sections"]["prep"]
    assert p["bytes"] >= 0.3e6 and p["mb_per_s"] > 0 and p["tokens"] > 0
    assert "training throughput" in proc.stdout and "KV cache speed-up" in proc.stdout and str(out) in proc.stdout


@pytest.mark.parametrize("argv, words", [
    (["--only", "train,bogus"], "unknown sections"),
    (["--presets", "huge"], "unknown preset"),
    (["--batch", "gpt2=x"], "PRESET=N"),
    (["--steps", "0"], "--steps"),
])
def test_bad_arguments_one_line(tmp_path, argv, words):
    proc = run_cli(["bench.py", *argv, "--out", str(tmp_path / "x.json")], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.json").exists()


def test_read_evals_and_first_crossing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    recs = [{"type": "eval", "step": 0, "val_loss": 4.2}, {"type": "train", "step": 10, "loss": 1.0},
            {"type": "eval", "step": 500, "val_loss": 1.90}, {"type": "eval", "step": 1000, "val_loss": 1.85},
            {"type": "eval", "step": 1500, "val_loss": 1.80}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"type": "ev')  # a torn last line
    got = bench.read_evals(path)
    assert len(got) == 5
    assert bench.first_eval_at_or_below(got, 1.88)["step"] == 1000
    assert bench.first_eval_at_or_below(got, 1.5) is None
    assert bench.read_evals(tmp_path / "missing.jsonl") == []


def test_git_info_without_a_repository(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPO", tmp_path)
    assert bench.git_info() == {"commit": None, "uncommitted": None}


def test_presets_come_from_conf():
    for name in bench.PRESETS:
        cfg = bench.gpt_config(bench.model_preset(name), bench.preset_vocab(name))
        assert cfg.n_layer == bench.model_preset(name)["n_layer"]
    assert bench.gpt_config(bench.model_preset("gpt2"), bench.GPT2_VOCAB).vocab_size % 64 == 0


def test_quality_section_polls_metrics(tmp_path, monkeypatch, cache_with_shakespeare):
    """A stand-in train.py writes metrics.jsonl like the real loop; the section finds the first crossing."""
    fake = tmp_path / "repo"
    fake.mkdir()
    (fake / "train.py").write_text(textwrap.dedent("""
        import json, sys, time
        from pathlib import Path
        run = Path([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("hydra.run.dir=")][0])
        run.mkdir(parents=True)
        with open(run / "metrics.jsonl", "w") as f:
            for step, v in ((0, 4.2), (100, 2.0), (200, 1.87), (300, 1.80)):
                f.write(json.dumps({"type": "eval", "step": step, "val_loss": v, "elapsed_s": step / 100}) + "\\n")
                f.flush()
                time.sleep(0.05)
            f.write(json.dumps({"type": "summary", "best_val_loss": 1.80}) + "\\n")
    """))
    monkeypatch.setattr(bench, "REPO", fake)
    args = bench.parse_args(["--only", "quality"])
    import torch
    dev = type("Dev", (), {"device": torch.device("cpu")})()
    q = bench.section_quality(args, dev)
    assert q["experiment"] == "cpu" and q["target_val_loss"] == 1.88
    assert q["returncode"] == 0 and q["reached"] and q["target_step"] == 200
    assert q["final_val_loss"] == 1.80 and q["summary"]["best_val_loss"] == 1.80
    assert 0 < q["time_to_target_s"] <= q["wall_s"]


def test_module_imports_cheaply():
    """bench.py is importable without starting any work (tests and tools import its helpers)."""
    proc = run_cli(["-c", "import bench, sys; print('torch' in sys.modules)"], cwd=REPO, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "False"


def test_a_failing_preset_is_an_error_row_not_an_abort(tmp_path, monkeypatch):
    """e.g. inductor failing on the GPU image: that preset's row says why, the bench goes on."""
    import io

    import torch

    from training.device import setup_device

    class Broken(torch.nn.Module):
        def forward(self, *a, **kw):
            raise RuntimeError("backend compiler failed\nlong inductor log")
    monkeypatch.setattr(torch, "compile", lambda m, *a, **kw: Broken())
    bad = bench.bench_train_preset("tiny", 2, 1, 0, setup_device("cpu", "float32"), True, tmp_path)
    assert bad["error"] == "RuntimeError: backend compiler failed (try --compile off)" and "tokens_per_s" not in bad
    out = io.StringIO()
    bench.print_table({"hardware": bench.hardware(torch.device("cpu")), "git": {"commit": None}, "load_avg_start": None,
                       "started": "",
                       "sections": {"train": {"rows": [bad], "notes": []}}, "errors": {}}, out=out)
    assert "backend compiler failed" in out.getvalue()
