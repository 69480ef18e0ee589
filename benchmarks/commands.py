"""The sections that time tinygpt's commands as a user runs them, in subprocesses: time to quality and
start-up (train.py, watched through its metrics.jsonl) and sample.py's decode speed."""
from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO, SHAKESPEARE_CHARS, gpt_config, load_avg, overhead, run_child, say
from common.interrupt import on_stop
from training.metrics import read_metrics as read_evals  # a torn last line (a killed run) is skipped

QUALITY = {"cpu": ("cpu", 1.88), "cuda": ("shakespeare_char", 1.47)}  # device type -> (experiment, target val loss)
FLOOR = "import torch; torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])"  # builds an optimizer: imports dynamo
GENERATED = re.compile(r"generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s")


def first_eval_at_or_below(records: list[dict], target: float):
    return next((r for r in records if r.get("type") == "eval" and isinstance(r.get("val_loss"), (int, float))
                 and r["val_loss"] <= target), None)


def watch(cmd: list[str], run_dir: Path, find, limit: float, stop_at_hit: bool, poll: float = 0.1) -> dict:
    """Runs cmd (output to <run_dir>.log), polling run_dir/metrics.jsonl with find(records) -> record or None.
    Stops it at the first hit when stop_at_hit, or after `limit` seconds; times are from process start."""
    hit, out, timed_out = None, {}, False
    with open(run_dir.with_suffix(".log"), "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=str(run_dir.parent), stdout=log, stderr=subprocess.STDOUT)
        with on_stop(proc.kill):  # a Ctrl-C that ends bench.py at once (common/interrupt.py) ends the run too
            try:
                while True:
                    rc, now = proc.poll(), time.perf_counter() - t0
                    if hit is None and (hit := find(read_evals(run_dir / "metrics.jsonl"))) is not None:
                        out.update(hit=hit, hit_s=now)
                    if rc is not None or (hit and stop_at_hit) or now > limit:
                        timed_out = rc is None and not (hit and stop_at_hit)
                        break
                    time.sleep(poll)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    return {**out, "wall_s": time.perf_counter() - t0, "returncode": proc.returncode, "timed_out": timed_out}


def _train_cmd(run_dir: Path, *overrides: str) -> list[str]:
    """The train.py command line, once the char-level data is prepared (preparation is never timed)."""
    from data.config import DataConfig
    from data.prepare import prepare
    prepare(DataConfig(name="shakespeare_char"), progress=False)
    return [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]


def section_quality(args, precision) -> dict:
    exp, target = QUALITY["cuda" if precision.device.type == "cuda" else "cpu"]
    exp, target = args.quality_experiment or exp, target if args.quality_target is None else args.quality_target
    budget = args.quality_budget or (240.0 if args.quick else None)
    res = {"experiment": exp, "target_val_loss": target, "budget_s": budget}
    if not (REPO / "train.py").is_file():
        return {**res, "skipped": "train.py does not exist yet"}
    tmp = Path(tempfile.mkdtemp(prefix="tinygpt-bench-quality-"))
    overrides = (f"experiment={exp}", *args.quality_overrides)
    res["command"] = " ".join(["python", "train.py", *overrides])
    say("quality", f"{res['command']} (target val loss <= {target}" + (f", budget {budget:.0f} s)" if budget else ")"))
    res["load_avg_before"] = load_avg()
    try:
        w = watch(_train_cmd(tmp / "run", *overrides), tmp / "run", lambda recs: first_eval_at_or_below(recs, target),
                  min(budget or math.inf, args.quality_timeout), stop_at_hit=budget is not None)
        records, hit = read_evals(tmp / "run" / "metrics.jsonl"), w.get("hit", {})
        evals = [r for r in records if r.get("type") == "eval"]
        res.update(returncode=w["returncode"], wall_s=round(w["wall_s"], 2), load_avg_after=load_avg(),
                   evals=[{k: r.get(k) for k in ("step", "val_loss", "train_loss", "elapsed_s")} for r in evals],
                   final_val_loss=evals[-1]["val_loss"] if evals else None,
                   best_val_loss=min((r["val_loss"] for r in evals), default=None),
                   summary=next((r for r in reversed(records) if r.get("type") == "summary"), None),
                   reached=bool(hit), time_to_target_s=round(w["hit_s"], 2) if hit else None,
                   target_step=hit.get("step"), target_val_loss_seen=hit.get("val_loss"))
        if budget is not None and (hit or w["wall_s"] >= budget):
            res["note"] = "stopped at the target" if hit else f"not reached within budget ({budget:.0f} s)"
        elif w["timed_out"]:
            res["error"] = f"timed out after {args.quality_timeout:.0f} s (--quality-timeout)"
        elif w["returncode"] != 0:
            tail = (tmp / "run.log").read_text(errors="replace").strip().splitlines()[-3:]
            res["error"] = f"train.py exited with {w['returncode']}: " + " | ".join(tail)
    finally:
        if args.keep:
            res["run_dir"] = str(tmp / "run")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def section_startup(args, precision) -> dict:
    """Medians of interleaved runs: train.py until its first step's record, and torch's own start-up floor."""
    runs = args.startup_runs or (3 if args.quick else 5)
    overrides = ("train.max_iters=1", "train.log_interval=1", "train.eval_at_start=false", "experiment=cpu",
                 "train.device=cpu")  # on any machine: the figure is tinygpt's own overhead over torch's
    res = {"command": "python train.py " + " ".join(overrides), "floor_command": f'python -c "{FLOOR}"',
           "runs": runs, "load_avg_before": load_avg(), "train_s": [], "floor_s": []}
    say("startup", f"{runs} x ({res['command']}; torch floor)")
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-startup-") as tmp:
        for i in range(runs):
            t0 = time.perf_counter()  # the floor, like train.py, is timed until its work is done (not its exit)
            with subprocess.Popen([sys.executable, "-c", FLOOR + "; print('ready', flush=True)"], cwd=tmp,
                                  stdout=subprocess.PIPE, text=True) as p:
                ready, floor_s = p.stdout.readline() == "ready\n", time.perf_counter() - t0
            if not ready:
                raise ValueError(f"start-up: the torch floor failed: python -c {FLOOR!r}")
            res["floor_s"].append(round(floor_s, 3))
            run_dir = Path(tmp) / f"run{i}"
            cmd = _train_cmd(run_dir, *overrides)
            w = watch(cmd, run_dir, lambda recs: next((r for r in recs if r.get("type") == "train"), None), 600.0,
                      stop_at_hit=True, poll=0.01)
            if "hit" not in w:
                log = run_dir.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-1:]
                raise ValueError(f"start-up: train.py ended (exit {w['returncode']}) before its first step: {log}")
            res["train_s"].append(round(w["hit_s"], 3))
    train, floor = statistics.median(res["train_s"]), statistics.median(res["floor_s"])
    return {**res, "train_py_s": round(train, 3), "torch_floor_s": round(floor, 3),
            **overhead(res["train_s"], res["floor_s"]), "load_avg_after": load_avg()}


def section_sample(args, precision) -> dict:
    """sample.py's own path on a random-init checkpoint in the real format (speed does not depend on weights)."""
    import torch
    from checkpoint.file import FORMAT, VERSION, save_checkpoint
    from data.tokenizer import CharTokenizer, GPT2Tokenizer
    from model.gpt import GPT
    shape = args.decode_preset or "baby"
    cfg = gpt_config(shape)
    tok = GPT2Tokenizer() if shape == "gpt2" else CharTokenizer(SHAKESPEARE_CHARS)
    torch.manual_seed(0)
    ckpt = {"format": FORMAT, "version": VERSION, "model": GPT(cfg).state_dict(), "model_config": cfg.to_dict(),
            "tokenizer": tok.to_dict(), "step": 0}  # what inference reads; a training checkpoint has more
    n = args.decode_tokens
    cmd = ["sample.py", "--checkpoint", "model.pt", "--max-new-tokens", str(n), "--seed", "0", "--no-stream",
           "--device", str(precision.device)]
    res = {"model": shape, "command": "python " + " ".join(cmd), "new_tokens": n, "rows": [],
           "load_avg_before": load_avg()}
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-sample-") as tmp:
        save_checkpoint(ckpt, Path(tmp) / "model.pt")
        say("sample", f"{args.decode_reps} x {res['command']}")
        for _ in range(args.decode_reps):
            t0 = time.perf_counter()
            p = run_child([sys.executable, str(REPO / cmd[0]), *cmd[1:]], cwd=tmp, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
            wall, last = time.perf_counter() - t0, (p.stderr.strip().splitlines() or [""])[-1]
            m = GENERATED.search(last)
            if p.returncode != 0 or not m:
                raise ValueError(f"sample.py exited with {p.returncode}: {last}")
            res["rows"].append({"tokens": int(m[1]), "seconds": float(m[2]), "tokens_per_s": float(m[3]),
                                "wall_s": round(wall, 3)})
    return {**res, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in res["rows"]),
            "wall_s": statistics.median(r["wall_s"] for r in res["rows"]), "load_avg_after": load_avg()}
