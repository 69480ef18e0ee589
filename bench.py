"""tinygpt's benchmark: `python bench.py [--quick] [--only train,quality,decode,prep,startup,sample] [--out PATH]`,
and on a GPU machine `python bench.py --gpu-check [--nanogpt DIR]` (benchmarks/gpu_check.py).

Prints a table and writes JSON (hardware, torch, git commit, load average, every setting) to --out, default
bench_results/<timestamp>.json. The sections live in benchmarks/; docs/benchmarks.md says what each measures.
"""
from __future__ import annotations

if __name__ == "__main__":  # first, so that a Ctrl-C during the imports below ends quietly too
    from common.interrupt import stop_quietly
    stop_quietly()

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from benchmarks import PRESETS, REPO, describe_overhead, load_avg
from common.cli import exit_quietly_on_broken_pipe
from common.files import write_text_atomic
from common.platform import configure_threads, cpu_flags, cpu_model, usable_cores
from common.cli import one_line

SECTIONS = ("train", "quality", "decode", "prep", "startup", "sample")


def git_info() -> dict:
    """{"commit": sha or None, "uncommitted": bool or None}; tolerates a missing git or repository."""
    def git(*a):
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "uncommitted": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted": None}


def hardware(device) -> dict:
    import torch
    flags = cpu_flags()  # None where the OS does not list them: the JSON says null, not "no"

    def has(*names):
        return None if flags is None else bool(flags & set(names))
    info = {"cpu": {"model": cpu_model(), "cores": usable_cores(), "torch_threads": torch.get_num_threads(),
                    "capability": torch.backends.cpu.get_cpu_capability(), "avx2": has("avx2"),
                    "avx512": has("avx512f"), "bf16": has("avx512_bf16", "amx_bf16")},
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": p.name, "count": torch.cuda.device_count(),
                       "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}",
                       "cuda": torch.version.cuda}
    return info


def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(result: dict, out=None) -> None:  # noqa: C901 - one short block per section
    def w(*lines):  # nothing at all for no lines
        print(*lines, sep="\n", end="\n" if lines else "", file=out or sys.stdout)
    hw, git, s = result["hardware"], result["git"], result["sections"]
    c, gpu = hw["cpu"], hw.get("gpu")
    threads = c["torch_threads"]
    where = f"{gpu['name']} (CUDA {gpu['cuda']})" if gpu else \
        f"{c['model']}, {c['cores']} cores, {threads} torch thread{'s' * (threads != 1)}, {c['capability']}"
    commit = (git["commit"] or "no git")[:12] + (" (uncommitted changes)" if git.get("uncommitted") else "")
    w(f"tinygpt bench | {where} | torch {hw['torch']} | commit {commit} | {result['started']}",
      f"load average at start: {result['load_avg_start']}" + (" (busy machine)" if result.get("busy") else ""))
    if "train" in s:
        opts = ", ".join(sorted({r.get("optimizer", "adamw") for r in s["train"]["rows"]}))
        w(f"\n== training throughput ({opts}; median step; warm-up and compile excluded) ==",
          f"{'preset':7} {'params':>9} {'batch':>6} {'tok/step':>9} {'step ms':>9} {'tokens/s':>11} {'TFLOP/s':>8} "
          f"{'MFU':>6} {'compile s':>9} {'peak GiB':>8}")
        for r in s["train"]["rows"]:
            mfu = "-" if r.get("mfu") is None else f"{r['mfu'] * 100:.1f}%"
            w(f"{r['preset']:7} error: {r['error']}" if "error" in r else
              f"{r['preset']:7} {r['params'] / 1e6:8.2f}M {r['batch_size']:6} {r['tokens_per_step']:9,} "
              f"{r['step_ms_median']:9.2f} {r['tokens_per_s']:11,.0f} {r['achieved_tflops']:8.3f} {mfu:>6} "
              f"{_f(r.get('compile_s'), '.1f'):>9} {_f(r.get('peak_memory_gib'), '.2f'):>8}")
        w(*(f"  note: {n}" for n in s["train"].get("notes", [])))
    if "quality" in s:
        q = s["quality"]
        w(f"\n== time to quality: {q.get('command', 'train.py experiment=' + q['experiment'])} "
          f"(val loss <= {q['target_val_loss']}) ==")
        if "skipped" in q:
            w(f"  skipped: {q['skipped']}")
        else:
            w("  target reached at: " + (f"{q['time_to_target_s']:.1f} s (step {q['target_step']}, val "
                                         f"{q['target_val_loss_seen']:.4f})" if q.get("reached") else "NOT reached"),
              f"  process wall time: {q['wall_s']:.1f} s, exit code {q['returncode']}, final val loss "
              f"{_f(q.get('final_val_loss'), '.4f')}", *(f"  {k}: {q[k]}" for k in ("note", "error") if q.get(k)))
    if "decode" in s:
        d = s["decode"]
        w(f"\n== decode: {d['model']} shape, batch 1, {d['new_tokens']} new tokens, {d['dtype']} ==")
        for r in d["rows"]:
            w(f"  {r['mode']:18} " + (f"error: {r['error']}" if "error" in r else f"{r['tokens_per_s']:10,.1f} "
                                      f"tokens/s  ({r['seconds']:.2f} s; warm-up {r['warmup_s']:.2f} s)"))
        if d.get("cache_speedup"):
            w(f"  KV cache speed-up: {d['cache_speedup']:.1f}x")
    if "prep" in s:
        from benchmarks.prepare import print_prep
        print_prep(s["prep"], w)
    if "startup" in s:
        u = s["startup"]
        w(f"\n== start-up: process start -> end of the first training step, median of {u['runs']} ==",
          f"  start-up: train.py {u['train_py_s']:.2f} s, torch floor {u['torch_floor_s']:.2f} s, "
          f"tinygpt overhead {describe_overhead(u)}")
    if "sample" in s:
        m = s["sample"]
        w(f"\n== sample.py: {m['model']} shape, {m['new_tokens']} new tokens ==", f"  {m['tokens_per_s']:,.1f} "
          f"tokens/s (sample.py's own figure; process wall {m['wall_s']:.1f} s)")
    w(*(f"\n!! {name} failed: {err}" for name, err in result.get("errors", {}).items()))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python bench.py", description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--quick", action="store_true", help="CPU-sized run (a few minutes on 2 cores): fewer presets, steps and runs")
    add("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}")
    add("--out", default=None, help="JSON output path (default bench_results/<timestamp>.json)")
    add("--device", default="auto", help="auto (CUDA > CPU) | cpu | cuda | cuda:N")
    add("--dtype", default="auto", help="training dtype: auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16")
    add("--compile", default="auto", choices=("auto", "on", "off"), help="torch.compile in train (auto: on CUDA)")
    add("--optim", default="adamw", help="optimizer of the train section: an optim.name")
    add("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    add("--presets", default=None, help=f"comma-separated model presets for train ({','.join(PRESETS)})")
    add("--batch", action="append", default=[], metavar="PRESET=N", help="batch size for a preset")
    add("--steps", type=int, default=None, help="measured steps per preset (default 20 CPU, 50 CUDA; 10 quick CPU)")
    add("--warmup", type=int, default=None, help="warm-up steps after the first (default 2 CPU, 10 CUDA)")
    add("--decode-tokens", type=int, default=500, help="new tokens per decode and sample run")
    add("--decode-reps", type=int, default=3, help="timed runs of the cached decode modes and of sample.py (median)")
    add("--decode-preset", default=None, help="model shape for decode/sample (default baby; decode on CUDA: gpt2)")
    add("--prep-mb", type=float, default=100.0, help="size of each preparation input in MB (10^6 bytes)")
    add("--quality-experiment", default=None, help="experiment for time to quality (default cpu / shakespeare_char)")
    add("--quality-target", type=float, default=None, help="target val loss (default 1.88 CPU / 1.47 GPU)")
    add("--quality-timeout", type=float, default=900.0, help="seconds before the training run is killed (an error)")
    add("--quality-budget", type=float, default=None,
        help="stop the run at the target or after this many seconds ('not reached within budget'; --quick: 240)")
    add("--quality-overrides", nargs="*", default=[], help="extra Hydra overrides for train.py")
    add("--keep", action="store_true", help="keep the time-to-quality run directory")
    add("--startup-runs", type=int, default=None, help="interleaved start-up runs, median (default 5; --quick 3)")
    add("--gpu-check", action="store_true", help="on a CUDA GPU: the cuda tests, the default run beside nanoGPT's, "
        "start-up, decode and GPT-2 training throughput, in one JSON and table (docs/benchmarks.md)")
    add("--nanogpt", metavar="DIR", help="--gpu-check: a nanoGPT checkout to run side by side")
    add("--skip", default="", help="--gpu-check: comma-separated steps to leave out (tests, default, compile, "
        "nanogpt, startup, decode, throughput)")
    add("--step-timeout", type=float, default=600.0, help="--gpu-check: seconds before one step's command is killed")
    args = ap.parse_args(argv)

    def check(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(msg)
    from benchmarks.gpu_check import STEPS
    from training.optim import OPTIMIZERS  # (imports torch: only once the arguments are read)
    check(args.optim in OPTIMIZERS, f"--optim {args.optim}: choose from {', '.join(OPTIMIZERS)}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    check(set(args.skip) <= set(STEPS), f"--skip {','.join(args.skip)}: choose from {','.join(STEPS)}")
    check(args.nanogpt is None or (Path(args.nanogpt) / "train.py").is_file(),
          f"--nanogpt {args.nanogpt} is not a nanoGPT checkout (no train.py in it): give the directory of a clone")
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = sorted(set(args.sections) - set(SECTIONS))
    check(args.sections and not bad,
          f"--only {args.only!r} names unknown sections {bad}: choose from {','.join(SECTIONS)}")
    args.presets = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    for p in args.presets or []:
        check(p in PRESETS, f"--presets: unknown preset {p!r}: choose from {','.join(PRESETS)}")
    for item in args.batch:
        name, _, value = item.partition("=")
        check(name in PRESETS and value.isdigit() and int(value) >= 1,
              f"--batch {item!r} is not valid: use PRESET=N, e.g. --batch gpt2=16")
    args.batch = {name: int(value) for name, _, value in (item.partition("=") for item in args.batch)}
    for name, low in (("steps", 1), ("decode_tokens", 1), ("decode_reps", 1), ("threads", 1), ("startup_runs", 1),
                      ("warmup", 0), ("prep_mb", 1e-9), ("quality_budget", 1e-9)):
        v = getattr(args, name)
        check(v is None or v >= low,
              f"--{name.replace('_', '-')}={v} must be " + (f">= {low}" if low in (0, 1) else "positive"))
    return args


def run(args) -> dict:
    import torch
    from benchmarks import commands, inprocess, prepare
    from model.device import resolve_device
    from training.precision import setup_precision
    if args.threads:
        torch.set_num_threads(args.threads)
    precision = setup_precision(resolve_device(args.device), args.dtype)
    result = {"format": "tinygpt-bench", "version": 1, "started": datetime.now().isoformat(timespec="seconds"),
              "argv": sys.argv[1:], "quick": args.quick, "git": git_info(), "hardware": hardware(precision.device),
              "load_avg_start": load_avg(), "config": {k: v for k, v in vars(args).items() if k != "out"},
              "sections": {}, "errors": {}}
    cores = result["hardware"]["cpu"]["cores"] or 1
    result["busy"] = bool(result["load_avg_start"] and result["load_avg_start"][0] > cores)
    if result["busy"]:
        print(f"warning: the machine is busy (1-minute load average {result['load_avg_start'][0]} > {cores} cores): "
              f"figures will be slower than on a quiet machine", file=sys.stderr, flush=True)
    for name in (s for s in SECTIONS if s in args.sections):
        t0 = time.perf_counter()
        try:
            fn = next(getattr(m, f"section_{name}") for m in (inprocess, commands, prepare)
                      if hasattr(m, f"section_{name}"))
            result["sections"][name] = fn(args, precision)
            result["sections"][name]["section_s"] = round(time.perf_counter() - t0, 2)
        except (ValueError, OSError) as e:  # a missing file or preset: report it, keep the other sections
            result["errors"][name] = one_line(e)
    result["load_avg_end"] = load_avg()
    return result


def gpu_check(args, out: Path) -> int:
    import torch
    from benchmarks.gpu_check import run_gpu_check, table
    if not torch.cuda.is_available():
        raise ValueError("--gpu-check needs a CUDA GPU: run it on a GPU machine (python bench.py --gpu-check "
                         "--nanogpt DIR), or run bench.py's sections here without it")
    started = {"format": "tinygpt-gpu-check", "version": 1, "started": datetime.now().isoformat(timespec="seconds"),
               "argv": sys.argv[1:], "git": git_info(), "hardware": hardware(torch.device("cuda"))}
    result = run_gpu_check(args, out, started)
    print(table(result))
    print(f"\nJSON: {out}")
    return 1 if result["errors"] else 0


def main(argv=None) -> int:
    configure_threads()  # before torch loads: OpenMP threads sleep, as in train.py and sample.py
    try:
        args = parse_args(argv)
        out = Path(args.out) if args.out else REPO / "bench_results" / f"{datetime.now():%Y%m%d-%H%M%S}.json"
        if args.gpu_check:
            return gpu_check(args, out)
        result = run(args)
        write_text_atomic(out, json.dumps(result, indent=2) + "\n")
    except (ValueError, OSError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print_table(result)
    print(f"\nJSON: {out}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_broken_pipe(main))  # `| head`: no traceback
