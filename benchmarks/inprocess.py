"""The sections timed inside this process: training throughput (training.step's real step) and decode speed.
What each measures, and why so, is in docs/benchmarks.md."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import PRESETS, VOCAB, gpt_config, load_avg, say
from common.cli import failure_reason


def sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_batch(name: str, device_type: str, quick: bool) -> int:
    """The experiment's batch (CUDA: tiny and baby as shakespeare_char; CPU: tiny as experiment=cpu), else a
    size that keeps a CPU step short (a full 64 x 256 baby batch takes ~10 s a step on 2 cores)."""
    from launch.config import preset
    if name == "gpt2" or (name == "baby" and device_type != "cuda"):
        return 32 if device_type == "cuda" else 4 if quick else 12 if name == "baby" else 1
    exp = "shakespeare_char" if device_type == "cuda" else "cpu"
    return preset("experiment", exp)["train"]["batch_size"]


def _step_times(step, n: int, device) -> list[float]:
    """Seconds per call of step(): CUDA events on a GPU (no host sync inside the loop), else perf_counter."""
    import torch
    if device.type != "cuda":
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in events:
        a.record()
        step()
        b.record()
    sync(device)
    return [a.elapsed_time(b) / 1e3 for a, b in events]


def bench_train_preset(name: str, batch: int, steps: int, warmup: int, precision, compile_model: str, tmp: Path,
                       optim: str = "adamw") -> dict:
    """One preset's training steps; compile_model: "off", "regions" (what train.py compiles: training/step.py) or
    "whole" (the whole model, as nanoGPT compiles it)."""
    import numpy as np
    import torch
    from data.loader import BatchLoader, write_token_file
    from model.gpt import GPT
    from training.mfu import flops_per_token, mfu, mfu_peak
    from training.config import OptimConfig, TrainConfig
    from training.optim import build_optimizer
    from training.step import compile_regions, forward_backward, optimizer_step

    cfg, device, vocab = gpt_config(name), precision.device, VOCAB[name]
    row = {"preset": name, "batch_size": batch, "block_size": cfg.block_size, "tokens_per_step": batch * cfg.block_size,
           "model_config": cfg.to_dict(), "dtype": precision.dtype_name, "compile": compile_model, "optimizer": optim,
           "warmup_steps": warmup, "measured_steps": steps, "load_avg_before": load_avg()}
    paths = [tmp / f"{split}.bin" for split in ("train", "val")]  # random tokens: speed does not depend on them
    for p in paths:
        n = max(1 << 20, 4 * batch * (cfg.block_size + 1))
        write_token_file(p, np.random.default_rng(0).integers(0, vocab, n, dtype=np.int64), vocab)
    torch.manual_seed(0)
    model = GPT(cfg).to(device).train()
    row["params"] = model.num_params()
    fpt = flops_per_token(row["params"], cfg.n_layer, cfg.n_head, cfg.head_size, cfg.block_size)
    opt = build_optimizer(model, OptimConfig(name=optim, lr=1e-4, weight_decay=0.1, beta2=0.95), device.type)
    loader = BatchLoader(*paths, cfg.block_size, batch, seed=0, device=device)
    model_c = torch.compile(model) if compile_model == "whole" else model
    if compile_model == "regions":
        compile_regions(model)
    scaler, peak = precision.grad_scaler(), mfu_peak(precision)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def step():  # the training loop's own step (clip 1.0, optim.grad_clip's default)
        forward_backward(model_c, loader.next_batch, TrainConfig(), precision.autocast, scaler)
        optimizer_step(model, opt, OptimConfig(grad_clip=1.0), scaler)
    try:
        (first,) = _step_times(step, 1, device)  # carries torch.compile's compilation when compiling
        row["warmup_s"] = round(sum(_step_times(step, warmup, device)), 3)
        t0 = time.perf_counter()
        times = _step_times(step, steps, device)
        wall = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        row["error"] = f"out of memory at batch_size={batch}: pass --batch {name}=N with a smaller N"
        return row
    except Exception as e:  # noqa: BLE001 - e.g. a compiler failure: record it, measure the other presets
        row["error"] = failure_reason(e) + " (try --compile off)" * (compile_model != "off")
        return row
    finally:  # CPU: no allocator statistics (see the process's RSS instead)
        cuda = device.type == "cuda"
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None
    med = statistics.median(times)
    tps = row["tokens_per_step"] / med
    return {**row, "first_step_s": round(first, 3),
            "compile_s": round(max(0.0, first - med), 3) if compile_model != "off" else None,
            "step_ms_median": round(med * 1e3, 2), "step_ms_min": round(min(times) * 1e3, 2),
            "step_ms_max": round(max(times) * 1e3, 2), "tokens_per_s": round(tps, 1),
            "tokens_per_s_wall": round(steps * row["tokens_per_step"] / wall, 1), "flops_per_token": fpt,
            "achieved_tflops": round(tps * fpt / 1e12, 3), "peak_flops": peak, "load_avg_after": load_avg(),
            "mfu": round(mfu(tps, fpt, peak), 4) if peak else None}


def section_train(args, precision) -> dict:
    import torch
    cpu = precision.device.type != "cuda"
    presets = args.presets or (["tiny", "baby"] if (args.quick and cpu) else list(PRESETS))
    steps = args.steps or (10 if (args.quick and cpu) else 20 if cpu else 50)
    warmup = args.warmup if args.warmup is not None else (2 if cpu else 10)
    compile_model = {"auto": "off" if cpu else "regions", "on": "regions", "off": "off"}[args.compile]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-") as tmp:
        for name in presets:
            batch = args.batch.get(name) or default_batch(name, precision.device.type, args.quick)
            say("train", f"{name}: batch {batch}, {warmup} warm-up + {steps} measured steps")
            rows.append(bench_train_preset(name, batch, steps, warmup, precision, compile_model, Path(tmp), args.optim))
            if compile_model != "off":
                torch._dynamo.reset()
    return {"rows": rows, "notes": [f"--quick on CPU: presets {', '.join(presets)}, {steps} measured steps (the full "
                                    f"run uses >= 20)"] if args.quick and cpu else []}


def section_decode(args, precision) -> dict:
    import torch
    from model.fast_decode import pick_decode
    from model.generate import Sampling, generate
    from model.gpt import GPT
    from model.device import cuda_bf16_native
    device, n = precision.device, args.decode_tokens
    shape = args.decode_preset or ("gpt2" if device.type == "cuda" else "baby")
    cfg = gpt_config(shape)
    torch.manual_seed(0)
    model, dtype = GPT(cfg).to(device).eval(), "float32"
    if device.type == "cuda" and cuda_bf16_native():
        model, dtype = model.to(torch.bfloat16), "bfloat16"  # as sample.py: decoding is memory-bound
    idx = torch.zeros((1, 1), dtype=torch.long, device=device)
    modes = [("kv_cache", dict(decode=pick_decode(device))), ("no_cache", dict(use_kv_cache=False))]  # CUDA: graphs
    if device.type == "cuda":
        modes.insert(0, ("kv_cache_compiled", dict(decode=pick_decode(device, compile=True))))
    res = {"model": shape, "model_config": cfg.to_dict(), "dtype": dtype, "batch_size": 1, "prompt_tokens": 1,
           "new_tokens": n, "temperature": 1.0, "rows": [], "load_avg_before": load_avg()}

    def timed(kw, tokens):
        torch.manual_seed(0)
        sync(device)
        t0 = time.perf_counter()
        assert generate(model, idx, tokens, Sampling(temperature=1.0), **kw).shape == (1, 1 + tokens)
        sync(device)
        return time.perf_counter() - t0
    for mode, kw in modes:
        say("decode", f"{shape}, {mode}, {n} tokens")
        try:
            first = timed(kw, n if mode == "kv_cache_compiled" else min(n, 16))  # warm-up (compile + graph capture)
            reps = 1 if mode == "no_cache" else args.decode_reps
            best = statistics.median(timed(kw, n) for _ in range(reps))
            row = dict(warmup_s=round(first, 3), seconds=round(best, 3), runs=reps, tokens_per_s=round(n / best, 1))
        except Exception as e:  # noqa: BLE001 - one failed mode must not lose the others
            row = {"error": failure_reason(e)}
        res["rows"].append({"mode": mode, **row})
    by = {r["mode"]: r.get("tokens_per_s") for r in res["rows"]}
    if by.get("kv_cache") and by.get("no_cache"):
        res["cache_speedup"] = round(by["kv_cache"] / by["no_cache"], 2)
    return {**res, "load_avg_after": load_avg()}
