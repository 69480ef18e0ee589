"""bench.py: a tiny end-to-end run of the CLI, its argument errors, and the pieces the GPU/quality runs rely on."""
from __future__ import annotations

import io
import json
import os
import re
import textwrap
import time

import pytest
import torch

import bench
from benchmarks import PRESETS, commands, gpt_config, inprocess, model_preset
from tests.helpers import REPO, run_cli


@pytest.mark.slow
@pytest.mark.parametrize("optim, sections", [("adamw", "train,decode,prep"), ("muon", "train")],
                         ids=["adamw", "muon"])  # (--optim changes the train section alone)
def test_cli_smoke_tiny_sizes(tmp_path, cache_with_shakespeare, cache_with_gpt2, optim, sections):
    out = tmp_path / "r.json"
    proc = run_cli(["bench.py", "--only", sections, "--presets", "tiny", "--steps", "2", "--warmup", "0",
                    "--optim", optim,
                    "--decode-tokens", "8", "--decode-reps", "1", "--decode-preset", "tiny", "--prep-mb", "0.3",
                    "--threads", "1", "--device", "cpu", "--out", str(out)], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["format"] == "tinygpt-bench" and r["hardware"]["torch"]
    assert set(r["sections"]) == set(sections.split(",")) and not r["errors"]
    (row,) = r["sections"]["train"]["rows"]
    assert row["preset"] == "tiny" and row["measured_steps"] == 2 and row["tokens_per_s"] > 0
    assert row["optimizer"] == optim and f"training throughput ({optim};" in proc.stdout
    assert row["mfu"] is None  # CPU: no peak FLOP/s, so no MFU rather than a wrong one
    assert row["model_config"]["n_layer"] == model_preset("tiny")["n_layer"]
    assert "training throughput" in proc.stdout and str(out) in proc.stdout
    if sections == "train":
        return
    modes = {d["mode"]: d for d in r["sections"]["decode"]["rows"]}
    assert set(modes) == {"kv_cache", "no_cache"} and all(m["tokens_per_s"] > 0 for m in modes.values())
    p = r["sections"]["prep"]
    rows = {(x["source"], x["tokenizer"]): x for x in p["rows"]}
    assert {("text", "gpt2"), ("text", "char"), ("jsonl", "gpt2")} <= set(rows)
    assert all(x["bytes"] >= 0.3e6 and x["mb_per_s"] > 0 for x in rows.values())  # MB of text, parquet too
    assert rows["text", "char"]["peak_rss_mib"] is None or rows["text", "char"]["peak_rss_mib"] > 10
    assert "data preparation" in proc.stdout and "MB/s" in proc.stdout and "KV cache speed-up" in proc.stdout


@pytest.mark.parametrize("argv, words", [
    (["--only", "train,bogus"], "unknown sections"),
    (["--presets", "huge"], "unknown preset"),
    (["--batch", "gpt2=x"], "PRESET=N"),
    (["--steps", "0"], "--steps"),
    (["--optim", "sgd"], "--optim sgd: choose from adamw"),  # training/optim.py's names
])
def test_bad_arguments_one_line(tmp_path, capsys, argv, words):
    """bench.main, which `python bench.py` exits with (test_cli_smoke_tiny_sizes runs the script)."""
    assert bench.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0] and out == ""
    assert "Traceback" not in err and not (tmp_path / "x.json").exists()


def test_read_evals_and_first_crossing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    recs = [{"type": "eval", "step": 0, "val_loss": 4.2}, {"type": "train", "step": 10, "loss": 1.0},
            {"type": "eval", "step": 500, "val_loss": 1.90}, {"type": "eval", "step": 1000, "val_loss": 1.85},
            {"type": "eval", "step": 1500, "val_loss": 1.80}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"type": "ev')  # a torn last line
    got = commands.read_evals(path)
    assert len(got) == 5
    assert commands.first_eval_at_or_below(got, 1.88)["step"] == 1000
    assert commands.first_eval_at_or_below(got, 1.5) is None
    assert commands.read_evals(tmp_path / "missing.jsonl") == []


def test_git_info_without_a_repository(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPO", tmp_path)
    assert bench.git_info() == {"commit": None, "uncommitted": None}


def test_presets_come_from_conf():
    for name in PRESETS:
        cfg = gpt_config(name)
        assert cfg.n_layer == model_preset(name)["n_layer"]
    assert gpt_config("gpt2").vocab_size % 64 == 0 and gpt_config("gpt2").vocab_size >= 50257


@pytest.mark.slow
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
    monkeypatch.setattr(commands, "REPO", fake)
    args = bench.parse_args(["--only", "quality"])
    import torch
    dev = type("Dev", (), {"device": torch.device("cpu")})()
    q = commands.section_quality(args, dev)
    assert q["experiment"] == "cpu" and q["target_val_loss"] == 1.88
    assert q["returncode"] == 0 and q["reached"] and q["target_step"] == 200
    assert q["final_val_loss"] == 1.80 and q["summary"]["best_val_loss"] == 1.80
    assert 0 < q["time_to_target_s"] <= q["wall_s"]


@pytest.mark.slow
def test_module_imports_cheaply():
    """bench.py is importable without starting any work (tests and tools import its helpers)."""
    proc = run_cli(["-c", "import bench, sys; print('torch' in sys.modules)"], cwd=REPO, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "False"


@pytest.mark.slow  # over ~1 s
def test_a_failing_preset_is_an_error_row_not_an_abort(tmp_path, monkeypatch):
    """e.g. inductor failing on the GPU image: that preset's row says why, the bench goes on."""

    import torch

    from training.precision import setup_precision

    class Broken(torch.nn.Module):
        def forward(self, *a, **kw):
            raise RuntimeError("backend compiler failed\nlong inductor log")
    monkeypatch.setattr(torch, "compile", lambda m, *a, **kw: Broken())
    bad = inprocess.bench_train_preset("tiny", 2, 1, 0, setup_precision(torch.device("cpu"), "float32"), "whole",
                                       tmp_path)
    assert bad["error"] == "RuntimeError: backend compiler failed (try --compile off)" and "tokens_per_s" not in bad
    out = io.StringIO()
    bench.print_table({"hardware": bench.hardware(torch.device("cpu")), "git": {"commit": None}, "load_avg_start": None,
                       "started": "",
                       "sections": {"train": {"rows": [bad], "notes": []}}, "errors": {}}, out=out)
    assert "backend compiler failed" in out.getvalue()


@pytest.mark.slow
def test_cli_startup_and_sample_sections(tmp_path, cache_with_shakespeare):
    """The real train.py and sample.py, one start-up run and a few tokens from a tiny random checkpoint."""
    out = tmp_path / "r.json"
    proc = run_cli(["bench.py", "--only", "startup,sample", "--startup-runs", "1", "--decode-preset", "tiny",
                    "--decode-tokens", "8", "--decode-reps", "1", "--device", "cpu", "--out", str(out)],
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert set(r["sections"]) == {"startup", "sample"} and not r["errors"]
    u = r["sections"]["startup"]
    assert u["runs"] == 1 and len(u["train_s"]) == len(u["floor_s"]) == 1
    assert u["train_py_s"] > 0 and u["torch_floor_s"] > 0
    assert u["difference_s"] == pytest.approx(u["train_py_s"] - u["torch_floor_s"], abs=2e-3)
    # one run each: no spread, and never a negative overhead
    assert u["noise_s"] == 0 and u["overhead_s"] == max(0.0, u["difference_s"])
    assert "train.max_iters=1" in u["command"] and "torch.optim.AdamW" in u["floor_command"]
    assert f"start-up: train.py {u['train_py_s']:.2f} s, torch floor {u['torch_floor_s']:.2f} s" in proc.stdout
    m = r["sections"]["sample"]
    assert m["model"] == "tiny" and m["rows"][0]["tokens"] == 8 and m["tokens_per_s"] > 0
    assert "--no-stream" in m["command"] and "tokens/s (sample.py" in proc.stdout


def _fake_repo(tmp_path, evals, sleep_after: float):
    fake = tmp_path / "repo"
    fake.mkdir()
    (fake / "train.py").write_text(textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        run = Path([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("hydra.run.dir=")][0])
        run.mkdir(parents=True)
        with open(run / "metrics.jsonl", "w") as f:
            for step, v in {evals!r}:
                f.write(json.dumps({{"type": "eval", "step": step, "val_loss": v}}) + "\\n")
                f.flush()
            time.sleep({sleep_after})
    """))
    return fake


@pytest.mark.slow
@pytest.mark.parametrize("evals, reached, note", [
    ([(0, 4.2)], False, "not reached within budget (2 s)"),
    ([(0, 4.2), (100, 1.5)], True, "stopped at the target"),
])
def test_quality_budget_stops_the_run(tmp_path, monkeypatch, cache_with_shakespeare, evals, reached, note):
    """--quick (or --quality-budget) bounds the section: a slow run is stopped, not failed as a timeout."""
    import torch
    monkeypatch.setattr(commands, "REPO", _fake_repo(tmp_path, evals, sleep_after=60))
    args = bench.parse_args(["--only", "quality", "--quick", "--quality-budget", "2"])
    t0 = time.perf_counter()
    q = commands.section_quality(args, type("Dev", (), {"device": torch.device("cpu")})())
    assert time.perf_counter() - t0 < 30
    assert q["reached"] is reached and q["note"] == note and "error" not in q and q["budget_s"] == 2


def test_train_section_times_the_real_training_step(tmp_path, monkeypatch):
    import training.step
    from training.precision import setup_precision
    calls = []
    real = training.step.optimizer_step

    def spy(*a, **kw):
        calls.append(a[2])
        return real(*a, **kw)
    monkeypatch.setattr(training.step, "optimizer_step", spy)
    cpu = setup_precision(torch.device("cpu"), "float32")
    row = inprocess.bench_train_preset("tiny", 2, 3, 1, cpu, False, tmp_path)
    assert "error" not in row and row["measured_steps"] == 3
    assert len(calls) == 1 + 1 + 3 and calls[0].grad_clip == 1.0  # first + warm-up + measured


def test_busy_machine_warns_and_records_the_load(monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 50.0, 20.0))
    monkeypatch.setattr(inprocess, "section_train", lambda args, dev: {"rows": [], "notes": []})
    result = bench.run(bench.parse_args(["--only", "train", "--device", "cpu"]))
    assert result["busy"] and result["load_avg_start"] == [99.0, 50.0, 20.0]
    assert "warning: the machine is busy (1-minute load average 99.0 >" in capsys.readouterr().err


@pytest.mark.slow
def test_codepath_counts_executed_lines_per_file(tmp_path, capsys):
    """benchmarks/codepath.py: coverage's executed lines of a checkout's own files, tests left out."""
    from benchmarks.codepath import executed, report
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "helper.py").write_text("X = 1\n")
    (tmp_path / "lib.py").write_text("def f():\n    return 1\n\n\ndef unused():\n    return 2\n")
    (tmp_path / "main.py").write_text("import sys\nsys.path.insert(0, 'tests')\nimport helper\nimport lib\nlib.f()\n")
    files = executed(tmp_path, ["main.py"], tmp_path, tmp_path)
    assert files == {"main.py": 5, "lib.py": 3}  # unused()'s body never ran; tests/ is not counted
    report("x", files, detail=True)
    assert capsys.readouterr().out.splitlines()[0] == "x: 8 lines in 2 files"


def test_gpu_check_reads_pytest_and_nanogpt_and_refuses_without_a_gpu(capsys):
    """bench.py --gpu-check (issue 37): its parsers and its table on a recorded result; on a CPU one line, exit 2."""
    from benchmarks import gpu_check as g
    assert g.pytest_counts("x\n8 failed, 3 passed in 104.61s (0:01:44)\n") == {"failed": 8, "passed": 3}
    assert [(int(m[1]), float(m[3])) for m in g.NANO_EVAL.finditer("step 1750: train loss 1.2, val loss 1.4644")] == \
        [(1750, 1.4644)]
    rows = [[250, 1.56, 24.3], [750, 1.4609, 42.4]]
    assert g.first_at(rows, 1.47) == [750, 1.4609, 42.4] and g.first_at(rows, 1.4) is None
    result = {"gpu_check": {"default": {"config_printed_s": 12.0, "first_logged_step_s": 15.8, "time_to_target_s": 42.4,
                                        "time_to_nano_best_s": 42.4, "final_val": 1.4491, "evals": rows,
                                        "startup": [["python start-up", 0.05, 0.05], ["torch import", 3.8, 3.75]]},
                            "nanogpt": {"first_step_s": 39.8, "best": [1750, 1.4644, 76.6], "time_to_nano_best_s": 76.6,
                                        "wall_s": 85.1, "evals": [[1750, 1.4644, 76.6]]}}, "errors": {}}
    assert "ratio: tinygpt to 1.47 / nanoGPT's best = 0.55x" in g.table(result)
    assert "start-up (s from launch): python start-up 0.05, torch import 3.80" in g.table(result)
    if not torch.cuda.is_available():
        assert bench.main(["--gpu-check"]) == 2
        assert capsys.readouterr().err.startswith("error: --gpu-check needs a CUDA GPU")


@pytest.mark.parametrize("train_s, floor_s, overhead_s, verdict, shown", [
    ([2.10, 2.15, 2.20], [1.60, 1.62, 1.64], 0.53, "above noise", "0.53 s (noise ±0.07 s)"),
    ([1.58, 1.70, 1.90], [1.60, 1.75, 1.80], 0.0, "within noise", "within noise (difference -0.05"),
    ([0.95, 1.00, 1.02], [1.72, 1.75, 1.76], 0.0, "below the floor", "none: 0.75 s below the"),
])
def test_startup_overhead_is_never_shown_negative(train_s, floor_s, overhead_s, verdict, shown):
    """Issue 50: `bench.py --quick` printed "tinygpt overhead -0.75 s": a difference of noisy
    medians is reported as far as their spread can tell (docs/benchmarks.md), never as a negative
    overhead."""
    from benchmarks import overhead
    o = overhead(train_s, floor_s)
    assert (o["overhead_s"], o["verdict"]) == (pytest.approx(overhead_s), verdict)
    assert o["overhead_s"] >= 0
    u = {"runs": 3, "train_py_s": sorted(train_s)[1], "torch_floor_s": sorted(floor_s)[1], **o}
    out = io.StringIO()
    bench.print_table({"hardware": bench.hardware(torch.device("cpu")), "git": {"commit": None},
                       "load_avg_start": None, "started": "", "sections": {"startup": u},
                       "errors": {}}, out=out)
    line = next(x for x in out.getvalue().splitlines() if "tinygpt overhead" in x)
    assert shown in line and not re.search(r"overhead -", line)
