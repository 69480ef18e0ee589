"""tinygpt's benchmark: `python bench.py [--quick] [--only train,quality,decode,prep] [--out PATH]`.

One command measures what people choose a trainer for, prints a table and writes JSON
(`bench_results/<timestamp>.json` next to this file, or `--out PATH`) with the hardware, torch version,
git commit (flagged "uncommitted" when the tree differs from it) and every setting used.

Sections (all by default; pick with `--only`):
- train    Training throughput per model preset (`conf/model/{tiny,baby,gpt2}.yaml`, read with OmegaConf):
           the training loop's step (BatchLoader batch -> autocast forward -> backward -> grad clip ->
           optimizer step -> zero_grad) with training/optim.py's optimizer (AdamW: fused on CUDA, foreach
           elsewhere; `--optim muon`: Muon + AdamW, as experiment=cpu trains), with torch.compile and
           bf16 autocast on CUDA as train.py does. The first step (it carries the
           compilation) and the warm-up steps are excluded and reported apart; tokens/s comes from the
           MEDIAN of the measured steps (>= 20 unless --quick on CPU says otherwise). GPU steps are timed
           with CUDA events (no host sync inside the loop); CPU steps with perf_counter. MFU uses
           6N + 12·L·H·Q·T FLOPs/token (training/metrics.py) and the peak of training/device.py's GPU
           table: none on a CPU or an unknown GPU. Peak GPU memory per preset from
           torch.cuda.max_memory_allocated.
- quality  Time to quality: `python train.py experiment=cpu` (CPU; target val loss <= 1.88) or
           `experiment=shakespeare_char` (GPU; <= 1.47) as a subprocess, data prepared beforehand, evals
           and checkpoints included. Wall time from process start until the first eval record in the run's
           metrics.jsonl at or below the target (polled), and until the process exits.
- decode   Batch-1 decode tokens/s, 500 new tokens from a 1-token prompt, with and without the KV cache
           (and, on CUDA, with the compiled static-cache decode step = CUDA graphs), `baby` shape on CPU and
           `gpt2` shape on CUDA (bf16 weights there, as sample.py does). Random weights: speed does not
           depend on them.
- prep     GPT-2 BPE data preparation (`data.prepare.prepare`, the whole pipeline: hash, scan, encode,
           write) on a >= 100 MB text file made by repeating Tiny Shakespeare in a temporary directory
           (deleted afterwards), reported in MB/s (1 MB = 10^6 bytes).

The load average is recorded around every section: figures taken on a busy machine say so.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent
SECTIONS = ("train", "quality", "decode", "prep")
PRESETS = ("tiny", "baby", "gpt2")
CHAR_VOCAB = 65       # distinct characters of Tiny Shakespeare (the char-level presets' vocabulary)
GPT2_VOCAB = 50257    # GPT-2 BPE (the gpt2 preset pads it to pad_vocab_to)
BATCH_FROM_EXPERIMENT = {"tiny": "cpu", "baby": "shakespeare_char"}  # conf/experiment/<name>.yaml train.batch_size
QUALITY = {"cpu": ("cpu", 1.88), "cuda": ("shakespeare_char", 1.47)}  # device type -> (experiment, target val loss)


# ------------------------------------------------------------------------------------------- environment
def git_info() -> dict:
    """{"commit": sha or None, "uncommitted": bool or None}; tolerates a missing git or repository."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=30, check=True).stdout.strip()
        return {"commit": sha, "uncommitted": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted": None}


def cpu_info() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    import torch
    return {"model": model, "cores": cores, "torch_threads": torch.get_num_threads(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "avx2": "avx2" in flags, "avx512": "avx512f" in flags,
            "bf16": bool(flags & {"avx512_bf16", "amx_bf16"})}


def hardware(device) -> dict:
    import torch
    info = {"cpu": cpu_info(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": p.name, "count": torch.cuda.device_count(), "memory_gib": round(p.total_memory / 2**30, 1),
                       "capability": f"{p.major}.{p.minor}", "cuda": torch.version.cuda}
    return info


def load_avg():
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_preset(name: str) -> dict:
    """conf/model/<name>.yaml as a plain dict (the single source of the preset sizes)."""
    from omegaconf import OmegaConf
    path = REPO / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model preset {name!r} ({path} does not exist): use one of {', '.join(PRESETS)}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def experiment_batch(name: str):
    from omegaconf import OmegaConf
    path = REPO / "conf" / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True).get("train", {}).get("batch_size")


def gpt_config(preset: dict, vocab: int):
    from model import GPTConfig
    pad = int(preset.get("pad_vocab_to", 1) or 1)
    keys = ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights", "attention")
    return GPTConfig(vocab_size=-(-vocab // pad) * pad, **{k: preset[k] for k in keys if k in preset})


def preset_vocab(name: str) -> int:
    return GPT2_VOCAB if name == "gpt2" else CHAR_VOCAB


# ------------------------------------------------------------------------------------------ 1. throughput
def _token_files(tmp: Path, vocab: int, n: int):
    import numpy as np
    from data.loader import write_token_file
    rng = np.random.default_rng(0)
    paths = []
    for split in ("train", "val"):
        p = tmp / f"{split}-{vocab}.bin"
        if not p.exists():
            write_token_file(p, rng.integers(0, vocab, n, dtype=np.int64), vocab)
        paths.append(p)
    return paths


def bench_train_preset(name: str, batch: int, steps: int, warmup: int, dev, compile_model: bool, tmp: Path,
                       optim: str = "adamw") -> dict:
    import torch
    from data.loader import BatchLoader
    from model import GPT
    from training.metrics import flops_per_token, mfu
    from training.optim import build_optimizer

    preset = model_preset(name)
    cfg = gpt_config(preset, preset_vocab(name))
    device = dev.device
    row = {"preset": name, "batch_size": batch, "block_size": cfg.block_size,
           "tokens_per_step": batch * cfg.block_size, "model_config": cfg.to_dict(), "dtype": dev.dtype_name,
           "compile": compile_model, "optimizer": optim, "warmup_steps": warmup, "measured_steps": steps, "load_avg_before": load_avg()}
    torch.manual_seed(0)
    model = GPT(cfg).to(device).train()
    row["params"] = model.num_params()
    fpt = flops_per_token(row["params"], cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.block_size)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(model, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), device_type=device.type, name=optim)
    train_path, val_path = _token_files(tmp, preset_vocab(name), max(1 << 20, 4 * batch * (cfg.block_size + 1)))
    loader = BatchLoader(train_path, val_path, cfg.block_size, batch, seed=0, device=device)
    model_c = torch.compile(model) if compile_model else model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        x, y = loader.next_batch()
        with dev.autocast():
            _, loss = model_c(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        sync(device)
        t0 = time.perf_counter()
        step()  # carries torch.compile's compilation when compiling
        sync(device)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(warmup):
            step()
        sync(device)
        row["warmup_s"] = round(time.perf_counter() - t0, 3)
        times = []
        if device.type == "cuda":
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
            t0 = time.perf_counter()
            for a, b in ev:
                a.record()
                step()
                b.record()
            sync(device)
            wall = time.perf_counter() - t0
            times = [a.elapsed_time(b) / 1e3 for a, b in ev]
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                ts = time.perf_counter()
                step()
                times.append(time.perf_counter() - ts)
            wall = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        row.update(error=f"out of memory at batch_size={batch}: pass --batch {name}=N with a smaller N")
        return row
    except Exception as e:  # noqa: BLE001 - e.g. a compiler failure: record it, measure the other presets
        first = (str(e).strip().splitlines() or [""])[0][:200]
        row.update(error=f"{type(e).__name__}: {first}" + (" (try --compile off)" if compile_model else ""))
        return row
    finally:  # the model, optimizer and batches are freed on return, before the next preset
        if device.type == "cuda":
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    med = statistics.median(times)
    tps = row["tokens_per_step"] / med
    row.update(first_step_s=round(first, 3), compile_s=round(max(0.0, first - med), 3) if compile_model else None,
               step_ms_median=round(med * 1e3, 2), step_ms_min=round(min(times) * 1e3, 2),
               step_ms_max=round(max(times) * 1e3, 2), tokens_per_s=round(tps, 1),
               tokens_per_s_wall=round(steps * row["tokens_per_step"] / wall, 1),
               flops_per_token=fpt, achieved_tflops=round(tps * fpt / 1e12, 3),
               mfu=(round(mfu(tps, fpt, dev.peak_flops), 4) if dev.peak_flops else None),
               peak_flops=dev.peak_flops, load_avg_after=load_avg())
    if device.type != "cuda":
        row["peak_memory_gib"] = None  # CPU: no allocator statistics (see the process's RSS instead)
    return row


def section_train(args, dev) -> dict:
    import torch
    cpu = dev.device.type != "cuda"
    presets = args.presets or (["tiny", "baby"] if (args.quick and cpu) else list(PRESETS))
    steps = args.steps or (10 if (args.quick and cpu) else 20 if cpu else 50)
    warmup = args.warmup if args.warmup is not None else (2 if cpu else 10)
    compile_model = {"auto": dev.device.type == "cuda", "on": True, "off": False}[args.compile]
    notes = []
    if args.quick and cpu:
        notes.append(f"--quick on CPU: presets {', '.join(presets)}, {steps} measured steps (the full run uses >= 20)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-") as tmp:
        for name in presets:
            batch = args.batch.get(name) or default_batch(name, dev.device.type, args.quick)
            print(f"[train] {name}: batch {batch}, {warmup} warm-up + {steps} measured steps ...", file=sys.stderr, flush=True)
            rows.append(bench_train_preset(name, batch, steps, warmup, dev, compile_model, Path(tmp), args.optim))
            if compile_model:
                torch._dynamo.reset()
            if dev.device.type == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, "notes": notes}


def default_batch(name: str, device_type: str, quick: bool) -> int:
    if device_type == "cuda":
        return {"gpt2": 32}.get(name) or experiment_batch(BATCH_FROM_EXPERIMENT[name]) or 12
    if name == "tiny":
        return experiment_batch("cpu") or 12
    return 4 if quick else (12 if name == "baby" else 1)  # CPU: a full 64 x 256 baby batch takes ~10 s a step


# --------------------------------------------------------------------------------------- 2. time to quality
def read_evals(path: Path) -> list[dict]:
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    out.append(rec)
    return out


def first_eval_at_or_below(records: list[dict], target: float):
    for r in records:
        v = r.get("val_loss")
        if r.get("type") == "eval" and isinstance(v, (int, float)) and v <= target:
            return r
    return None


def section_quality(args, dev) -> dict:
    exp, target = QUALITY["cuda" if dev.device.type == "cuda" else "cpu"]
    exp = args.quality_experiment or exp
    target = args.quality_target if args.quality_target is not None else target
    res = {"experiment": exp, "target_val_loss": target}
    if not (REPO / "train.py").is_file():
        return {**res, "skipped": "train.py does not exist yet"}
    from data.config import DataConfig
    from data.prepare import prepare
    prepare(DataConfig(name="shakespeare_char"), progress=False)  # data prepared beforehand (not timed)
    tmp = Path(tempfile.mkdtemp(prefix="tinygpt-bench-quality-"))
    run_dir = tmp / "run"
    cmd = [sys.executable, str(REPO / "train.py"), f"experiment={exp}", f"hydra.run.dir={run_dir}",
           *args.quality_overrides]
    res["command"] = " ".join(["python", "train.py", f"experiment={exp}", *args.quality_overrides])
    print(f"[quality] {res['command']} (target val loss <= {target}) ...", file=sys.stderr, flush=True)
    log_path = tmp / "train_output.log"
    res["load_avg_before"] = load_avg()
    hit = None
    try:
        with open(log_path, "wb") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=str(tmp), stdout=log, stderr=subprocess.STDOUT)
            try:
                while True:
                    rc = proc.poll()
                    now = time.perf_counter() - t0
                    if hit is None:
                        rec = first_eval_at_or_below(read_evals(run_dir / "metrics.jsonl"), target)
                        if rec is not None:
                            hit = (now, rec)
                    if rc is not None:
                        break
                    if now > args.quality_timeout:
                        proc.kill()
                        proc.wait()
                        res["error"] = f"timed out after {args.quality_timeout:.0f} s (--quality-timeout)"
                        break
                    time.sleep(0.1)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            wall = time.perf_counter() - t0
        records = read_evals(run_dir / "metrics.jsonl")
        evals = [r for r in records if r.get("type") == "eval"]
        summary = next((r for r in reversed(records) if r.get("type") == "summary"), None)
        res.update(returncode=proc.returncode, wall_s=round(wall, 2), load_avg_after=load_avg(),
                   evals=[{k: r.get(k) for k in ("step", "val_loss", "train_loss", "elapsed_s")} for r in evals],
                   final_val_loss=evals[-1]["val_loss"] if evals else None,
                   best_val_loss=min((r["val_loss"] for r in evals), default=None), summary=summary)
        if hit is not None:
            res.update(reached=True, time_to_target_s=round(hit[0], 2), target_step=hit[1].get("step"),
                       target_val_loss_seen=hit[1].get("val_loss"))
        else:
            res.update(reached=False, time_to_target_s=None)
        if proc.returncode not in (0, None) and "error" not in res:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            res["error"] = f"train.py exited with {proc.returncode}: " + " | ".join(tail)
    finally:
        if args.keep:
            res["run_dir"] = str(run_dir)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------------------------- 3. decode
def section_decode(args, dev) -> dict:
    import torch
    from model import GPT
    from model.device import cuda_bf16_native
    device = dev.device
    shape = args.decode_preset or ("gpt2" if device.type == "cuda" else "baby")
    cfg = gpt_config(model_preset(shape), preset_vocab(shape))
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    dtype = "float32"
    if device.type == "cuda" and cuda_bf16_native():
        model = model.to(torch.bfloat16)  # as sample.py: decoding is memory-bound, half the bytes per token
        dtype = "bfloat16"
    n = args.decode_tokens
    idx = torch.zeros((1, 1), dtype=torch.long, device=device)
    modes = [("kv_cache", dict(use_kv_cache=True)), ("no_cache", dict(use_kv_cache=False))]
    if device.type == "cuda":
        modes.insert(0, ("kv_cache_compiled", dict(use_kv_cache=True, compile=True)))
    rows = []
    res = {"model": shape, "model_config": cfg.to_dict(), "dtype": dtype, "batch_size": 1, "prompt_tokens": 1,
           "new_tokens": n, "temperature": 1.0, "rows": rows, "load_avg_before": load_avg()}

    def timed(kw, tokens):
        torch.manual_seed(0)
        sync(device)
        t0 = time.perf_counter()
        out = model.generate(idx, tokens, temperature=1.0, **kw)
        sync(device)
        assert out.shape == (1, 1 + tokens)
        return time.perf_counter() - t0

    for mode, kw in modes:
        print(f"[decode] {shape}, {mode}, {n} tokens ...", file=sys.stderr, flush=True)
        row = {"mode": mode}
        try:
            first = timed(kw, n if kw.get("compile") else min(n, 16))  # warm-up (compile + graph capture)
            reps = 1 if mode == "no_cache" else args.decode_reps
            times = [timed(kw, n) for _ in range(reps)]
            best = statistics.median(times)
            row.update(warmup_s=round(first, 3), seconds=round(best, 3), runs=reps, tokens_per_s=round(n / best, 1))
        except Exception as e:  # noqa: BLE001 - one failed mode must not lose the others
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        rows.append(row)
    by = {r["mode"]: r.get("tokens_per_s") for r in rows}
    if by.get("kv_cache") and by.get("no_cache"):
        res["cache_speedup"] = round(by["kv_cache"] / by["no_cache"], 2)
    res["load_avg_after"] = load_avg()
    return res


# ------------------------------------------------------------------------------------------------ 4. prep
def section_prep(args, dev) -> dict:
    from data import sources
    from data.config import DataConfig
    from data.prepare import prepare, _threads
    text = sources.shakespeare_path().read_bytes()
    copies = math.ceil(args.prep_mb * 1e6 / len(text))
    ranks = sources.gpt2_ranks_path()
    tmp = Path(tempfile.mkdtemp(prefix="tinygpt-bench-prep-"))
    old = os.environ.get("TINYGPT_CACHE")
    try:
        path = tmp / "corpus.txt"
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(text)
        nbytes = path.stat().st_size
        cache = tmp / "cache"
        if ranks is not None:  # the GPT-2 ranks, found where the user keeps them
            (cache / "tokenizers").mkdir(parents=True)
            os.symlink(ranks, cache / "tokenizers" / "gpt2.tiktoken")
        os.environ["TINYGPT_CACHE"] = str(cache)
        print(f"[prep] GPT-2 BPE on {nbytes / 1e6:.1f} MB ({copies} x Tiny Shakespeare) ...", file=sys.stderr, flush=True)
        la = load_avg()
        t0 = time.perf_counter()
        p = prepare(DataConfig(name="text", path=str(path), tokenizer="gpt2"), progress=False)
        secs = time.perf_counter() - t0
        tokens = p.train_tokens + p.val_tokens
        return {"bytes": nbytes, "copies": copies, "tokenizer": "gpt2", "seconds": round(secs, 2),
                "mb_per_s": round(nbytes / 1e6 / secs, 2), "tokens": tokens, "tokens_per_s": round(tokens / secs, 1),
                "threads": _threads(), "load_avg_before": la, "load_avg_after": load_avg()}
    finally:
        if old is None:
            os.environ.pop("TINYGPT_CACHE", None)
        else:
            os.environ["TINYGPT_CACHE"] = old
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- output
def _fmt(v, spec="", none="-"):
    if v is None:
        return none
    return format(v, spec) if spec else str(v)


def print_table(result: dict, out=sys.stdout) -> None:
    hw = result["hardware"]
    gpu = hw.get("gpu")
    where = f"{gpu['name']} (CUDA {gpu['cuda']})" if gpu else \
        f"{hw['cpu']['model']}, {hw['cpu']['cores']} cores, {hw['cpu']['torch_threads']} torch thread{'s' if hw['cpu']['torch_threads'] != 1 else ''}, {hw['cpu']['capability']}"
    git = result["git"]
    commit = (git["commit"] or "no git")[:12] + (" (uncommitted changes)" if git.get("uncommitted") else "")
    print(f"tinygpt bench | {where} | torch {hw['torch']} | commit {commit} | {result['started']}", file=out)
    print(f"load average at start: {result['load_avg_start']}", file=out)
    s = result["sections"]
    if "train" in s:
        opts = sorted({r.get("optimizer", "adamw") for r in s["train"]["rows"]})
        print(f"\n== training throughput ({', '.join(opts)}; median step; warm-up and compile excluded) ==", file=out)
        print(f"{'preset':7} {'params':>9} {'batch':>6} {'tok/step':>9} {'step ms':>9} {'tokens/s':>11} {'TFLOP/s':>8} "
              f"{'MFU':>6} {'compile s':>9} {'peak GiB':>8}", file=out)
        for r in s["train"]["rows"]:
            if "error" in r:
                print(f"{r['preset']:7} error: {r['error']}", file=out)
                continue
            mfu = f"{r['mfu'] * 100:.1f}%" if r.get("mfu") is not None else "-"
            print(f"{r['preset']:7} {r['params'] / 1e6:8.2f}M {r['batch_size']:6} {r['tokens_per_step']:9,} "
                  f"{r['step_ms_median']:9.2f} {r['tokens_per_s']:11,.0f} {r['achieved_tflops']:8.3f} {mfu:>6} "
                  f"{_fmt(r.get('compile_s'), '.1f'):>9} {_fmt(r.get('peak_memory_gib'), '.2f'):>8}", file=out)
        for n in s["train"].get("notes", []):
            print(f"  note: {n}", file=out)
    if "quality" in s:
        q = s["quality"]
        print(f"\n== time to quality: {q.get('command', 'train.py experiment=' + q['experiment'])} "
              f"(val loss <= {q['target_val_loss']}) ==", file=out)
        if "skipped" in q:
            print(f"  skipped: {q['skipped']}", file=out)
        else:
            reached = f"{q['time_to_target_s']:.1f} s (step {q['target_step']}, val {q['target_val_loss_seen']:.4f})" \
                if q.get("reached") else "NOT reached"
            print(f"  target reached at: {reached}", file=out)
            print(f"  process wall time: {q['wall_s']:.1f} s, exit code {q['returncode']}, final val loss "
                  f"{_fmt(q.get('final_val_loss'), '.4f')}", file=out)
            if q.get("error"):
                print(f"  error: {q['error']}", file=out)
    if "decode" in s:
        d = s["decode"]
        print(f"\n== decode: {d['model']} shape, batch 1, {d['new_tokens']} new tokens, {d['dtype']} ==", file=out)
        for r in d["rows"]:
            if "error" in r:
                print(f"  {r['mode']:18} error: {r['error']}", file=out)
            else:
                print(f"  {r['mode']:18} {r['tokens_per_s']:10,.1f} tokens/s  ({r['seconds']:.2f} s; warm-up "
                      f"{r['warmup_s']:.2f} s)", file=out)
        if d.get("cache_speedup"):
            print(f"  KV cache speed-up: {d['cache_speedup']:.1f}x", file=out)
    if "prep" in s:
        p = s["prep"]
        if "skipped" in p:
            print(f"\n== data preparation: skipped: {p['skipped']} ==", file=out)
        else:
            print(f"\n== data preparation, GPT-2 BPE, {p['bytes'] / 1e6:.1f} MB ==", file=out)
            print(f"  {p['mb_per_s']:.2f} MB/s ({p['seconds']:.1f} s, {p['tokens']:,} tokens, {p['threads']} thread{'s' if p['threads'] != 1 else ''})",
                  file=out)
    for name, err in result.get("errors", {}).items():
        print(f"\n!! {name} failed: {err}", file=out)


def parse_batch(items: list[str]) -> dict:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in PRESETS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--batch {item!r} is not valid: use PRESET=N, e.g. --batch gpt2=16")
        out[name] = int(value)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python bench.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="CPU-sized run (a few minutes on 2 cores): fewer presets and steps on CPU, said in the output")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}")
    ap.add_argument("--out", default=None, help="JSON output path (default bench_results/<timestamp>.json)")
    ap.add_argument("--device", default="auto", help="auto (CUDA > CPU) | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="training dtype: auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16")
    ap.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                    help="torch.compile for the train section (auto: on CUDA only, as train.py)")
    ap.add_argument("--optim", default="adamw", choices=("adamw", "muon"),
                    help="optimizer of the train section (adamw: fused on CUDA; muon: as optim=muon, used by experiment=cpu)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--presets", default=None, help=f"comma-separated model presets for train ({','.join(PRESETS)})")
    ap.add_argument("--batch", action="append", default=[], metavar="PRESET=N", help="batch size for a preset")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per preset (default 20 CPU, 50 CUDA; 10 quick CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps after the first (default 2 CPU, 10 CUDA)")
    ap.add_argument("--decode-tokens", type=int, default=500)
    ap.add_argument("--decode-reps", type=int, default=3, help="timed runs of the cached modes (median)")
    ap.add_argument("--decode-preset", default=None, help="model shape for decode (default baby on CPU, gpt2 on CUDA)")
    ap.add_argument("--prep-mb", type=float, default=100.0, help="size of the BPE preparation input in MB (10^6 bytes)")
    ap.add_argument("--quality-experiment", default=None, help="experiment for time to quality (default cpu / shakespeare_char)")
    ap.add_argument("--quality-target", type=float, default=None, help="target val loss (default 1.88 CPU / 1.47 GPU)")
    ap.add_argument("--quality-timeout", type=float, default=900.0, help="seconds before the training run is killed")
    ap.add_argument("--quality-overrides", nargs="*", default=[], help="extra Hydra overrides for train.py")
    ap.add_argument("--keep", action="store_true", help="keep the time-to-quality run directory")
    args = ap.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad or not args.sections:
        raise ValueError(f"--only {args.only!r} names unknown sections {bad}: choose from {','.join(SECTIONS)}")
    args.presets = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    for p in args.presets or []:
        if p not in PRESETS:
            raise ValueError(f"--presets: unknown preset {p!r}: choose from {','.join(PRESETS)}")
    args.batch = parse_batch(args.batch)
    for name in ("steps", "decode_tokens", "decode_reps", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')}={v} must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup={args.warmup} must be >= 0")
    if args.prep_mb <= 0:
        raise ValueError(f"--prep-mb={args.prep_mb} must be positive")
    return args


def run(args) -> dict:
    import torch
    from training.device import setup_device
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = setup_device(args.device, args.dtype)
    result = {"format": "tinygpt-bench", "version": 1, "started": datetime.now().isoformat(timespec="seconds"),
              "argv": sys.argv[1:], "quick": args.quick, "git": git_info(), "hardware": hardware(dev.device),
              "load_avg_start": load_avg(),
              "config": {k: v for k, v in vars(args).items() if k not in ("out",)},
              "sections": {}, "errors": {}}
    fns = {"train": section_train, "quality": section_quality, "decode": section_decode, "prep": section_prep}
    for name in SECTIONS:
        if name not in args.sections:
            continue
        t0 = time.perf_counter()
        try:
            result["sections"][name] = fns[name](args, dev)
            result["sections"][name]["section_s"] = round(time.perf_counter() - t0, 2)
        except (ValueError, OSError) as e:  # a missing file or preset: report it, keep the other sections
            result["errors"][name] = " ".join(str(e).split()) or type(e).__name__
    result["load_avg_end"] = load_avg()
    return result


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        result = run(args)
        out = Path(args.out) if args.out else REPO / "bench_results" / f"{datetime.now():%Y%m%d-%H%M%S}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, out)
    except (ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print_table(result)
    print(f"\nJSON: {out}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
