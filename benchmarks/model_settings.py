"""The model settings side by side on a CPU: `python -m benchmarks.model_settings [--rounds N] [--nanogpt DIR]`.

Trains each variant (experiment=cpu, GPT-2 style, against the modern decoder and its relu2 and softcap
variants, all at 0.80M parameters, same data, optimizer and steps) with train.py as a user runs it, in
alternating order round after round (the machine may be shared: compare within a round, quote ratios).
Per run: the val loss reached, tokens/s, the process wall time, and the wall time at which the first
evaluation reached a target (default: the val loss the GPT-2-style run ends at). Then batch-1 decode
tokens/s with the KV cache for each shape. `--nanogpt DIR` also runs nanoGPT's README CPU command there.
Figures and commands: docs/benchmarks.md, Model settings on a CPU.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.commands import _train_cmd
from training.metrics import read_metrics

VARIANTS = {  # name -> train.py overrides (the model keys: docs/configuration.md); all 350 steps
    "gpt2": ["experiment=cpu_gpt2"],
    "modern": ["experiment=cpu_gpt2", "model=modern"],
    "modern_relu2": ["experiment=cpu_gpt2", "model=modern", "model.mlp=relu2", "model.mlp_hidden=576"],  # 0.80M
    "modern_softcap": ["experiment=cpu_gpt2", "model=modern", "model.logit_softcap=15"],
    "cpu": ["experiment=cpu"],  # the CPU preset: the modern decoder, 180 steps
}
NANOGPT = ["train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
           "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
           "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]  # nanoGPT's README CPU command
NANO_EVAL = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def timed(cmd: list[str], cwd: Path, parse, poll: float = 0.1) -> dict:
    """Run cmd; parse(log text, run) -> [(step, val_loss)] read while it runs, each stamped with the wall time
    (from process start) at which it first appeared."""
    log, seen = cwd / f"run-{time.time_ns()}.log", {}
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            for step, val in parse(log.read_text(errors="replace"), cwd):
                seen.setdefault(step, (val, time.perf_counter() - t0))
            if done:
                break
            time.sleep(poll)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {log.read_text()[-2000:]}")
    return {"wall_s": round(wall, 2), "evals": [(s, round(v, 4), round(t, 2)) for s, (v, t) in sorted(seen.items())]}


def tinygpt_evals(text: str, run: Path):
    return [(r["step"], r["val_loss"]) for r in read_metrics(run / "run" / "metrics.jsonl") if r.get("type") == "eval"]


def nanogpt_evals(text: str, run: Path):
    return [(int(m[1]), float(m[3])) for m in NANO_EVAL.finditer(text)]


def train_variant(name: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = _train_cmd(Path(tmp) / "run", *VARIANTS[name], "train.device=cpu", *extra)
        res = timed(cmd, Path(tmp), tinygpt_evals)
        summary = [r for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if r.get("type") == "summary"][-1]
    return dict(res, final_val=res["evals"][-1][1], tokens_per_s=summary["mean_tokens_per_s"],
                train_s=summary["train_s"], params=summary["num_params"], command=" ".join(cmd[1:-1]))


def train_nanogpt(directory: Path) -> dict:
    with tempfile.TemporaryDirectory() as out:  # its checkpoint: not in the checkout others may share
        res = timed([sys.executable, "-u", *NANOGPT, f"--out_dir={out}"], directory, nanogpt_evals)
    return dict(res, final_val=res["evals"][-1][1], command="python " + " ".join(NANOGPT))


def first_at_or_below(evals, target: float):
    return next((t for _, v, t in evals if v <= target), None)


def decode_rate(name: str, tokens: int = 500, reps: int = 3) -> float:
    """Batch-1 greedy decode tokens/s with the KV cache, a random-init model of the variant's shape (median)."""
    import torch
    from launch.config import compose, register_configs, to_dataclass
    from model.gpt import GPT
    from model.generate import Sampling, generate
    register_configs()
    c = to_dataclass(compose(VARIANTS[name]))
    torch.manual_seed(0)
    model, idx, rates = GPT(c.model.with_vocab(65)).eval(), torch.zeros(1, 1, dtype=torch.long), []
    generate(model, idx, 20, Sampling(temperature=0))  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        generate(model, idx, tokens, Sampling(temperature=0))
        rates.append(tokens / (time.perf_counter() - t0))
    return round(statistics.median(rates), 1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="gpt2,modern,modern_relu2,modern_softcap", help="comma-separated, from " + ", ".join(VARIANTS))
    p.add_argument("--target", type=float, default=None, help="val loss to time (default: the gpt2 run's final)")
    p.add_argument("--nanogpt", type=Path, default=None, help="a nanoGPT checkout with shakespeare_char prepared")
    p.add_argument("--overrides", default="", help="extra train.py overrides for every variant (space-separated)")
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    names = a.variants.split(",")
    runs = {n: [] for n in names + (["nanogpt"] if a.nanogpt else [])}
    for r in range(a.rounds):  # A B C, then B C A, ...: each variant meets each load position
        order = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
        for n in order:
            res = train_nanogpt(a.nanogpt) if n == "nanogpt" else train_variant(n, a.overrides.split())
            runs[n].append(res)
            print(json.dumps({"round": r, "variant": n, **res}), flush=True)
    for r in range(a.rounds):
        target = a.target or (runs["gpt2"][r]["final_val"] if "gpt2" in runs else 1.88)
        for n in runs:
            x = runs[n][r]
            x["target"], x["time_to_target_s"] = target, first_at_or_below(x["evals"], target)
    decode = {} if a.no_decode else {n: decode_rate(n) for n in names}
    print("\n| variant | round | val loss | tokens/s | wall s | target | time to target s | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for n, rs in runs.items():
        for r, x in enumerate(rs):
            print(f"| {n} | {r} | {x['final_val']:.4f} | {x.get('tokens_per_s') or '-'} | {x['wall_s']:.1f} | "
                  f"{x['target']:.4f} | {x['time_to_target_s'] or 'not reached'} | {decode.get(n, '-')} |")
    if a.out:
        a.out.write_text(json.dumps({"runs": runs, "decode_tokens_per_s": decode}, indent=1))


if __name__ == "__main__":
    main()
