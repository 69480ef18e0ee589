"""The GPU smoke suite: `python -m pytest -m cuda` on a machine with one CUDA GPU (about 2 minutes).

Every GPU code path a CPU machine cannot run, each checked by its results (losses, tokens, files), not
only its exit code: compiled bf16 training with fused AdamW, fp16 + GradScaler, Muon, a CPU checkpoint
resumed on the GPU, cached == uncached == compiled greedy decoding in bf16, torchrun with DDP and FSDP2
(export, then sampling from the export), and bench.py on CUDA. Skipped where there is no GPU.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, run_cli

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

# experiment=null: config.yaml's own defaults (GPT-2 style, AdamW), not the experiment=gpu train.py picks on a GPU
SMALL = ["experiment=null", "data=shakespeare_char", "model.n_layer=2", "model.n_head=2", "model.n_embd=64",
         "model.block_size=64", "model.dropout=0.0", "train.batch_size=16", "train.eval_iters=5", "train.log_interval=10",
         "optim.warmup_iters=5", "optim.lr=3e-3", "optim.min_lr=3e-4", "train.eval_at_start=true"]
LN_VOCAB = math.log(65)  # the loss of a uniform guess over Tiny Shakespeare's 65 characters


def _train(tmp_path: Path, run: str, *overrides: str, launcher: tuple[str, ...] = ()) -> tuple[Path, str]:
    script = str(REPO / "train.py") if launcher else "train.py"
    proc = run_cli([*launcher, script, *SMALL, f"hydra.run.dir={run}", *overrides], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return tmp_path / run, (tmp_path / run / "train.log").read_text()


def _evals(run_dir: Path) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["type"] == "eval"]


def _learned(run_dir: Path) -> None:
    evals = _evals(run_dir)
    assert evals[0]["val_loss"] > 0.9 * LN_VOCAB  # from (about) a uniform guess at step 0 ...
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5  # ... to a model that learned something
    assert all(math.isfinite(e["val_loss"]) for e in evals)


def test_compiled_bf16_training_uses_fused_adamw(tmp_path, cache_with_shakespeare):
    run, log = _train(tmp_path, "bf16", "train.max_iters=60", "train.eval_interval=60", "train.compile=true")
    assert "device: cuda" in log and "bfloat16" in log and "torch.compile on" in log
    assert "torch.compile failed" not in log  # really compiled, no silent fallback
    _learned(run)
    from training.config import OptimConfig
    from training.optim import build_optimizer
    from model.config import GPTConfig
    from model.gpt import GPT
    model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=64)).cuda()
    opt = build_optimizer(model, OptimConfig(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95), "cuda")
    assert all(g.get("fused") for g in opt.param_groups)


def test_fp16_with_grad_scaler_trains_and_resumes(tmp_path, cache_with_shakespeare):
    run, log = _train(tmp_path, "fp16", "train.dtype=float16", "train.compile=false", "train.max_iters=40",
                      "train.eval_interval=20")
    assert "float16 + GradScaler" in log
    _learned(run)
    from checkpoint.file import load_checkpoint
    assert load_checkpoint(run / "last.pt")["scaler"]["scale"] > 0
    run, log = _train(tmp_path, "fp16", "train.dtype=float16", "train.compile=false", "train.max_iters=60",
                      "train.eval_interval=20", "train.resume=true")
    assert "resumed from" in log and load_checkpoint(run / "last.pt")["step"] == 60


def test_muon_on_cuda(tmp_path, cache_with_shakespeare):
    run, _ = _train(tmp_path, "muon", "optim=muon", "train.max_iters=40", "train.eval_interval=40")
    _learned(run)


def test_cpu_checkpoint_resumes_on_the_gpu(tmp_path, cache_with_shakespeare):
    run, log = _train(tmp_path, "moved", "train.device=cpu", "train.max_iters=20", "train.eval_interval=20")
    assert "device: cpu" in log
    run, log = _train(tmp_path, "moved", "train.device=cuda", "train.max_iters=40", "train.eval_interval=20",
                      "train.resume=true")
    assert "resumed from" in log and "device: cuda" in log
    evals = _evals(run)
    assert [e["step"] for e in evals if e["step"] > 0] == [20, 40] and evals[-1]["val_loss"] < evals[-2]["val_loss"]


def test_greedy_decoding_cached_uncached_and_compiled_agree_in_bf16(tmp_path, cache_with_shakespeare):
    run, _ = _train(tmp_path, "dec", "train.max_iters=150", "train.eval_interval=150", "train.compile=false")
    outs = {}
    for name, extra in {"cached": [], "uncached": ["--no-kv-cache"], "compiled": ["--compile"]}.items():
        proc = run_cli(["sample.py", "--run", str(run), "--device", "cuda", "--temperature", "0", "--prompt",
                        "ROMEO:", "--max-new-tokens", "100", "--no-stream", *extra], cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "torch.compile failed" not in proc.stderr
        outs[name] = proc.stdout
    assert outs["cached"].startswith("ROMEO:") and len(outs["cached"]) > 100
    assert outs["cached"] == outs["uncached"] == outs["compiled"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_one_gpu_export_and_sample(tmp_path, cache_with_shakespeare, parallel):
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1")
    run, log = _train(tmp_path, parallel, f"train.parallel={parallel}", "train.compile=false", "train.max_iters=40",
                      "train.eval_interval=40", launcher=launcher)
    assert "parallel: " in log and ("DDP" if parallel == "ddp" else "FSDP2") in log
    _learned(run)
    ckpt = run / "last.pt"
    if parallel == "fsdp":
        assert (run / "last_dcp").is_dir()
        proc = run_cli(["export.py", "--pt", str(run)], cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ckpt = run / "last_full.pt"
        from checkpoint.file import load_checkpoint
        full = load_checkpoint(ckpt)
        assert full["step"] == 40 and full["optimizer"] is not None
    proc = run_cli(["sample.py", "--checkpoint", str(ckpt), "--device", "cuda", "--prompt", "ROMEO:",
                    "--max-new-tokens", "50", "--seed", "1"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("ROMEO:") and len(proc.stdout) > 40, proc.stderr


def test_bench_quick_on_cuda(tmp_path, cache_with_shakespeare, cache_with_gpt2):
    out = tmp_path / "bench.json"
    proc = run_cli(["bench.py", "--quick", "--only", "train,decode", "--presets", "tiny", "--out", str(out)],
                   cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["hardware"]["device"].startswith("cuda") and r["hardware"]["gpu"]["name"]
    (row,) = r["sections"]["train"]["rows"]
    assert row["tokens_per_s"] > 0 and not r["errors"]
    from training.mfu import peak_flops
    if peak_flops(torch.cuda.get_device_name()) is not None:  # a GPU in the peak-FLOP/s table has an MFU
        assert row["mfu"] is not None and 0 < row["mfu"] < 1
    modes = {d["mode"]: d["tokens_per_s"] for d in r["sections"]["decode"]["rows"]}
    assert modes["kv_cache"] > modes["no_cache"] > 0
