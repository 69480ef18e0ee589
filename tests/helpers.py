"""Small helpers shared by the tests: the repo path, a subprocess runner for the CLIs, tiny models, plainness."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def approx_record(record: dict, rel: float = 1e-6) -> dict:
    """`record` with its numbers as pytest.approx and its other values (strings, bools) compared exactly:
    pytest.approx itself refuses a dict holding a string since pytest 9."""
    import pytest
    return {k: pytest.approx(v, rel=rel) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in record.items()}


def run_cli(args: list[str], cwd: Path | str | None = None, timeout: float = 300,
            env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run `python <args>` from the repo in a subprocess and capture text output.

    Scripts are given relative to the repo (e.g. ["train.py", "train.max_iters=2"]); the child inherits
    the test's environment (TINYGPT_CACHE, WANDB_MODE) plus `env`, and PYTHONPATH points at the repo so
    `python -m data.prepare` works from any cwd.
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    first = args[0]
    if first.endswith(".py") and not os.path.isabs(first):
        args = [str(REPO / first), *args[1:]]
    proc = subprocess.run([sys.executable, *args], cwd=str(cwd) if cwd else None, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def tiny_model_and_opt(seed=0):
    """A 2-layer GPT (vocab 32, context 16) and its AdamW, seeded: for state round-trip tests."""
    import torch

    from model.config import GPTConfig
    from model.gpt import GPT
    from training.config import OptimConfig
    from training.optim import build_optimizer
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32))
    return m, build_optimizer(m, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")


def train_steps(m, opt, n, seed=2):
    """n optimizer steps on seeded random batches (4 x 16, vocab 32); their losses."""
    import torch
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x, y = torch.randint(0, 32, (4, 16), generator=g), torch.randint(0, 32, (4, 16), generator=g)
        _, loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


def find_non_plain(obj, where: str = "checkpoint") -> str | None:
    """Path of the first value in a checkpoint that is not a plain container (None when all are plain)."""
    import torch
    if isinstance(obj, (torch.Tensor, int, float, str, bool, type(None))):
        return None
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return f"{where} (a {type(obj).__name__})"
    for k, v in items:
        if not isinstance(k, (str, int)):
            return f"{where}[{k!r}] (key of type {type(k).__name__})"
        bad = find_non_plain(v, f"{where}[{k!r}]")
        if bad:
            return bad
    return None


def model_variants(exhaustive: bool = False) -> list:
    """(id, GPTConfig) pairs of the modern settings on a tiny model (2 layers, 4 heads, 32 wide): every combination
    of the settings attention sees (position, n_kv_head, qk_norm, head_dim), each paired with the per-position
    settings (norm, mlp, logit_softcap, bias, tie_weights) so that all of theirs occur; exhaustive: the product."""
    import itertools

    from model.config import GPTConfig
    attention = list(itertools.product(("learned", "rope"), (None, 2, 1), (False, True), (None, 16)))
    per_position = list(itertools.product(("layernorm", "rmsnorm"), ("gelu", "swiglu", "relu2"), (None, 10.0),
                                          (True, False), (True, False)))
    pairs = (itertools.product(attention, per_position) if exhaustive else
             ((attention[i % len(attention)], p) for i, p in enumerate(per_position)))
    out = []
    for (position, n_kv_head, qk_norm, head_dim), (norm, mlp, softcap, bias, tie) in pairs:
        config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32, position=position,
                           n_kv_head=n_kv_head, qk_norm=qk_norm, head_dim=head_dim, norm=norm, mlp=mlp,
                           logit_softcap=softcap, bias=bias, tie_weights=tie)
        out.append((f"{position}-kv{n_kv_head}-qk{int(qk_norm)}-hd{head_dim}-{norm}-{mlp}-cap{softcap}-"
                    f"b{int(bias)}-t{int(tie)}", config))
    return out


# A checkpoint in the real format, as train.py writes it (tests of sample, eval, export, explore, the CLIs)
def randomize(model, seed: int = 0):
    """Weights far from GPT-2's init (std 0.2, LayerNorm gains ~1), so a wrong mapping or GELU shows in logits."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            mean = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
            p.copy_(mean + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_model(vocab_size: int, seed: int = 0, **kw):
    from model.config import GPTConfig
    from model.gpt import GPT
    cfg = dict(vocab_size=vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16)
    return randomize(GPT(GPTConfig(**{**cfg, **kw})), seed)


def save_run(run_dir, model, tokenizer, *, name: str = "best.pt", fsdp: bool = False) -> Path:
    """A checkpoint as train.py writes it; fsdp: the weights-only export beside last_dcp/ (optimizer None)."""
    run_dir = Path(run_dir)
    ckpt = {"format": "tinygpt", "version": 1, "model": model.state_dict(), "model_config": model.config.to_dict(),
            "tokenizer": tokenizer.to_dict(), "optimizer": None if fsdp else {}, "scaler": None, "step": 10,
            "best_val_loss": 2.0, "config": {}, "rng": {}, "loader": {}, "wandb_run_id": None}
    if fsdp:
        ckpt["sharded"] = True
        (run_dir / "last_dcp").mkdir(parents=True, exist_ok=True)
    from checkpoint.file import save_checkpoint
    return save_checkpoint(ckpt, run_dir / name)


def assert_one_error(proc, *words) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]
