"""One command for a GPU machine: `python bench.py --gpu-check [--nanogpt DIR]` checks and times what a CPU cannot.

Steps, each recorded in one JSON rewritten after every step (a run cut short still tells what it measured): `tests`
(pytest -m cuda), `default` (plain `python train.py`: its start-up trace, each evaluation's time), `compile` (its first
logged step with a cold and a warm torch.compile cache, and eager), `nanogpt` (config/train_shakespeare_char.py for
2000 of its 5000 steps: its best is at 1750), `startup` (torch + CUDA's start, sample.py's first token), `decode`
(sample.py and GPT-2 124M tokens/s), `throughput` (GPT-2 124M training, regions / whole model / nanoGPT's bench.py).
How to read it: docs/benchmarks.md, "On one GPU".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO, follow, load_avg, say
from common import startup
from training.metrics import read_metrics

CUDA_TESTS = ["-m", "cuda", "-q", "-p", "no:cacheprovider", "-n", "0", "--continue-on-collection-errors"]
STEPS = ("tests", "default", "compile", "nanogpt", "startup", "decode", "throughput")
TARGET, NANO_BEST = 1.47, 1.4725  # val loss: nanoGPT's best is about 1.4717 (at its step 1750)
NANO_EVAL = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
NANO_ITER = re.compile(r"time per iteration: ([\d.]+)ms, MFU: ([\d.]+)%")
GENERATED = re.compile(r"generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s")
PYTEST = re.compile(r"(\d+) (passed|failed|skipped|error|errors)\b")
TRACE = {startup.SWITCH: startup.VALUE}  # train.py's and sample.py's start-up phases on stderr


def pytest_counts(text: str) -> dict:
    """{"passed": n, "failed": n, ...} from pytest's last summary line."""
    last = next((ln for ln in reversed(text.splitlines()) if " in " in ln and PYTEST.search(ln)), "")
    return {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in PYTEST.findall(last)}


def tinygpt_seen(run: Path):
    def seen(text: str) -> dict:
        out = {"config_printed": True} if "run dir:" in text else {}
        for r in read_metrics(run / "metrics.jsonl"):
            if r.get("type") == "train":
                out.setdefault("first_logged_step", r["step"])
            elif r.get("type") == "eval":
                out[f"eval_{r['step']}"] = r["val_loss"]
        return out
    return seen


def evals(found: dict) -> list[list]:
    """[[step, val_loss, seconds from launch], ...] in step order."""
    return sorted([int(k.split("_")[1]), v, t] for k, (v, t) in found.items() if k.startswith("eval_"))


def first_at(rows: list[list], target: float):  # the first [step, val, seconds] at or below target
    return next(([s, v, t] for s, v, t in rows if v <= target), None)


def step_tests(ctx) -> dict:
    t0 = time.perf_counter()  # -n 0: one at a time (some compare speeds)
    p = subprocess.run([sys.executable, "-m", "pytest", *CUDA_TESTS], cwd=REPO, env=ctx["env"], capture_output=True,
                       text=True, timeout=ctx["limit"])
    return {"command": "python -m pytest -m cuda", "seconds": round(time.perf_counter() - t0, 1),
            "returncode": p.returncode, **pytest_counts(p.stdout), "tail": p.stdout.strip().splitlines()[-15:]}


def _train(ctx, name: str, *overrides: str, cache: str, stop_at_first_step: bool) -> dict:
    run = ctx["tmp"] / name
    env = {**ctx["env"], "TORCHINDUCTOR_CACHE_DIR": str(ctx["tmp"] / cache / "inductor"),
           "TRITON_CACHE_DIR": str(ctx["tmp"] / cache / "triton"), **TRACE}
    cmd = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run}"]
    r = follow(cmd, ctx["tmp"], env, tinygpt_seen(run), limit=ctx["limit"],
               stop=(lambda f: "first_logged_step" in f) if stop_at_first_step else (lambda f: False))
    out = {"command": "python train.py " + " ".join(overrides), "wall_s": r["wall_s"], "returncode": r["returncode"],
           "config_printed_s": r["found"].get("config_printed", (None, None))[1],
           "first_logged_step_s": r["found"].get("first_logged_step", (None, None))[1], "evals": evals(r["found"]),
           "startup": startup.parse(r["log"])}  # [phase, seconds from launch, its own]
    if r["returncode"] not in (0, None, -9) and not stop_at_first_step:
        out["error"] = " | ".join(r["tail"])
    return out


def step_default(ctx) -> dict:
    from data.config import DataConfig
    from data.prepare import prepare
    prepare(DataConfig(name="shakespeare_char"), progress=False)  # as a user's second run: data prepared once
    run = _train(ctx, "default", cache="default", stop_at_first_step=False)
    ctx["default_run"], rows = ctx["tmp"] / "default", run["evals"]
    return {**run, "time_to_target_s": (first_at(rows, TARGET) or [None] * 3)[2], "target": TARGET,
            "time_to_nano_best_s": (first_at(rows, NANO_BEST) or [None] * 3)[2],
            "final_val": rows[-1][1] if rows else None}


def step_compile(ctx) -> dict:
    """The default run with train.compile=true and false, each until its first logged step: cold (an empty cache),
    warm (the same shapes compiled before), eager; compile time = the difference."""
    cold = _train(ctx, "cold", "train.compile=true", cache="compile", stop_at_first_step=True)
    warm = _train(ctx, "warm", "train.compile=true", cache="compile", stop_at_first_step=True)
    eager = _train(ctx, "eager", "train.compile=false", cache="eager", stop_at_first_step=True)
    first = {k: r["first_logged_step_s"] for k, r in (("cold", cold), ("warm", warm), ("eager", eager))}
    # a difference of single runs, never shown negative: 0 when the compiled run came out no slower
    compile_s = {f"compile_{k}_s": round(max(0.0, first[k] - first["eager"]), 2)
                 if first[k] and first["eager"] else None for k in ("cold", "warm")}
    return {"first_logged_step_s": first, **compile_s}


def step_nanogpt(ctx) -> dict:
    nano = ctx["nanogpt"]
    if nano is None:
        return {"skipped": "no --nanogpt DIR given"}
    data = nano / "data" / "shakespeare_char"
    if not (data / "train.bin").is_file():  # its prepare.py downloads input.txt only when it is missing
        from common.files import cache_dir
        shutil.copyfile(cache_dir() / "tinyshakespeare" / "input.txt", data / "input.txt")
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    cmd = [sys.executable, "-u", "train.py", "config/train_shakespeare_char.py", "--max_iters=2000",
           f"--out_dir={ctx['tmp'] / 'nano'}", *ctx["nano_extra"]]

    def seen(text: str) -> dict:
        out = {f"eval_{m[1]}": float(m[3]) for m in NANO_EVAL.finditer(text)}
        return {**out, "first_step": 0} if re.search(r"^iter 0:", text, re.M) else out
    r = follow(cmd, nano, ctx["env"], seen, limit=ctx["limit"])
    rows = evals(r["found"])
    best = min(rows, key=lambda row: row[1]) if rows else None
    return {"command": "python train.py config/train_shakespeare_char.py --max_iters=2000 (its own steps 0-2000 of "
                       "5000; lr_decay_iters stays 5000)", "wall_s": r["wall_s"], "returncode": r["returncode"],
            "first_step_s": r["found"].get("first_step", (None, None))[1], "evals": rows, "best": best,
            "time_to_nano_best_s": (first_at(rows, NANO_BEST) or [None] * 3)[2],
            "time_to_target_s": (first_at(rows, TARGET) or [None] * 3)[2]}


def _sample(ctx, *args: str, importtime: bool = False) -> dict:
    """sample.py's time to its first generated character and its own tokens/s line."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), str(REPO / "sample.py"), *args]
    err = ctx["tmp"] / f"sample-{time.time_ns()}.err"
    t0 = time.perf_counter()
    with open(err, "wb") as e:
        p = subprocess.Popen(cmd, cwd=ctx["tmp"], env={**ctx["env"], **TRACE}, stdout=subprocess.PIPE, stderr=e)
        first = p.stdout.read(len("ROMEO:") + 1)  # the prompt, then the first generated character
        first_s = time.perf_counter() - t0
        p.stdout.read()
        p.wait(timeout=ctx["limit"])
    text = err.read_text(errors="replace")
    m = GENERATED.search(text)
    row = {"args": " ".join(args), "first_token_s": round(first_s, 3) if len(first) > 6 else None,
           "wall_s": round(time.perf_counter() - t0, 3), "tokens_per_s": float(m[3]) if m else None,
           "returncode": p.returncode, "startup": startup.parse(text)}
    if importtime:
        row["imports"] = {mod: bool(re.search(rf"\|\s*{re.escape(mod)}$", text, re.M))
                          for mod in ("torch._dynamo", "sympy", "torch.distributed.fsdp")}
        torch_us = re.search(r"\|\s*(\d+) \|\s*torch$", text, re.M)
        row["torch_import_s"] = round(int(torch_us[1]) / 1e6, 3) if torch_us else None
    return row


def _checkpoint(ctx) -> Path:
    run = ctx.get("default_run")
    return run / "best.pt" if run and (run / "best.pt").is_file() else run / "last.pt" if run else None


def step_startup(ctx) -> dict:
    ckpt = _checkpoint(ctx)
    if ckpt is None or not ckpt.is_file():
        return {"skipped": "the default run left no checkpoint"}
    floor = [sys.executable, "-c", f"import torch; torch.zeros(1, device='{ctx['device']}'); print('ready')"]
    t0 = time.perf_counter()  # to its "ready" line, as the sample's time is to its first token: not to its exit
    with subprocess.Popen(floor, env=ctx["env"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as p:
        p.stdout.readline()
        floor_s = round(time.perf_counter() - t0, 3)
    runs = [_sample(ctx, "--checkpoint", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens", "500", "--seed", "0",
                    importtime=i == 0) for i in range(3)]
    first = sorted(r["first_token_s"] for r in runs if r["first_token_s"] is not None)
    median = first[len(first) // 2] if first else None
    return {"torch_cuda_init_s": floor_s, "runs": runs, "first_token_s": median,
            # (a difference of noisy starts: never shown negative)
            "after_torch_cuda_init_s": round(max(0.0, median - floor_s), 3) if first else None}


def step_decode(ctx) -> dict:
    from benchmarks import inprocess
    from training.precision import setup_precision
    import torch
    out = {}
    ckpt = _checkpoint(ctx)
    if ckpt is not None and ckpt.is_file():
        out["sample_default_run"] = [_sample(ctx, "--checkpoint", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens",
                                             "500", "--seed", "0", *flags)
                                     for flags in ((), ("--no-cuda-graphs",), ("--compile",))]
    preset, tokens, reps = ctx["gpt2_decode"]
    args = type("Args", (), {"decode_tokens": tokens, "decode_reps": reps, "decode_preset": preset})()
    out["gpt2_124m_in_process"] = inprocess.section_decode(args, setup_precision(torch.device(ctx["device"]), "auto"))
    return out


def step_throughput(ctx) -> dict:
    import torch
    from benchmarks.inprocess import bench_train_preset
    from training.precision import setup_precision
    precision, out = setup_precision(torch.device(ctx["device"]), "auto"), {}
    for mode in ("regions", "whole"):
        out[f"tinygpt_{mode}"] = bench_train_preset(*ctx["gpt2_run"], precision, mode, ctx["tmp"])
        torch._dynamo.reset()
    if ctx["nanogpt"] is not None:
        cmd = [sys.executable, "bench.py", "--batch_size=32", "--real_data=False", *ctx["nano_bench_extra"]]
        p = subprocess.run(cmd, cwd=ctx["nanogpt"],
                           env=ctx["env"], capture_output=True, text=True, timeout=ctx["limit"])
        m = NANO_ITER.findall(p.stdout)
        out["nanogpt"] = {"command": "python bench.py --batch_size=32 --real_data=False", "returncode": p.returncode,
                          "step_ms": float(m[-1][0]) if m else None, "mfu_percent": float(m[-1][1]) if m else None,
                          "tokens_per_s": round(32 * 1024 / float(m[-1][0]) * 1e3, 1) if m else None,
                          **({} if m else {"error": " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])})}
    return out


def run_gpu_check(args, out: Path, started: dict) -> dict:
    """Every step in order (those in args.skip left out), the JSON at `out` rewritten after each."""
    from common.files import write_text_atomic
    result = {**started, "gpu_check": {}, "errors": {}}
    with tempfile.TemporaryDirectory(prefix="tinygpt-gpu-check-") as tmp:
        ctx = {"tmp": Path(tmp), "env": {**os.environ, "PYTHONUNBUFFERED": "1"}, "limit": args.step_timeout,
               "nanogpt": Path(args.nanogpt).resolve() if args.nanogpt else None, "device": "cuda:0",
               "nano_extra": [], "nano_bench_extra": [], "gpt2_run": ("gpt2", 32, 30, 10),
               "gpt2_decode": ("gpt2", 500, 3), **getattr(args, "dry_run", {})}  # (a test's smaller settings on a CPU)
        t_all = time.perf_counter()
        for name in STEPS:
            if name in args.skip:
                continue
            say("gpu-check", name)
            t0 = time.perf_counter()
            try:
                result["gpu_check"][name] = {**globals()[f"step_{name}"](ctx), "step_s": round(
                    time.perf_counter() - t0, 1), "load_avg": load_avg()}
            except Exception as e:  # noqa: BLE001 - one failing step must not lose the others' figures
                result["errors"][name] = f"{type(e).__name__}: {e}"[:500]
            result["total_s"] = round(time.perf_counter() - t_all, 1)
            write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    return result


def table(result: dict) -> str:
    """The figures the issue asks for, one line each."""
    g, lines = result.get("gpu_check", {}), []
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    if "tests" in g:
        t = g["tests"]
        lines.append(f"cuda tests: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
                     f"{t.get('skipped', 0)} skipped in {t['seconds']} s")
    if "default" in g:
        d = g["default"]
        lines += [f"default run: config printed {f(d['config_printed_s'])} s, first logged step "
                  f"{f(d['first_logged_step_s'])} s; val <= {TARGET} at {f(d['time_to_target_s'])} s, <= {NANO_BEST} "
                  f"at {f(d['time_to_nano_best_s'])} s; final val {f(d['final_val'], '.4f')}",
                  f"  evals (step, val, s): {d['evals']}"]
        if d.get("startup"):
            lines.append("  start-up (s from launch): " + ", ".join(f"{p} {at:.2f}" for p, at, _ in d["startup"]))
    if "compile" in g:
        c = g["compile"]
        lines.append(f"train.compile=true: compile cold {f(c['compile_cold_s'])} s, warm {f(c['compile_warm_s'])} s "
                     f"(first logged step: {c['first_logged_step_s']})")
    if "nanogpt" in g and "evals" in g["nanogpt"]:
        n, d = g["nanogpt"], g.get("default", {})
        lines.append(f"nanoGPT: first step {f(n['first_step_s'])} s, best {n['best']}, val <= {NANO_BEST} at "
                     f"{f(n['time_to_nano_best_s'])} s; wall (2000 steps) {n['wall_s']} s")
        if d.get("time_to_target_s") and n.get("best"):
            lines.append(f"  ratio: tinygpt to {TARGET} / nanoGPT's best = {d['time_to_target_s'] / n['best'][2]:.2f}x")
    if "startup" in g and "runs" in g["startup"]:
        s = g["startup"]
        lines.append(f"start-up: torch + CUDA init {s['torch_cuda_init_s']} s, sample.py's first token "
                     f"{s['first_token_s']} s ({s['after_torch_cuda_init_s']} s after); imports "
                     f"{s['runs'][0].get('imports')}")
    if "decode" in g:
        for r in g["decode"].get("sample_default_run", []):
            lines.append(f"sample.py {r['args'].split('--seed 0')[-1].strip() or '(default)'}: "
                         f"{r['tokens_per_s']} tok/s")
        for r in g["decode"].get("gpt2_124m_in_process", {}).get("rows", []):
            lines.append(f"GPT-2 124M decode {r['mode']}: {r.get('tokens_per_s')} tok/s")
    if "throughput" in g:
        for k, r in g["throughput"].items():
            if isinstance(r, dict) and "tokens_per_s" in r:
                lines.append(f"GPT-2 124M training, {k}: {r['tokens_per_s']} tok/s"
                             + (f", compile {r.get('compile_s')} s" if r.get("compile_s") is not None else ""))
    return "\n".join(lines + [f"error in {k}: {v}" for k, v in result.get("errors", {}).items()])
