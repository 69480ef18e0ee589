"""What a run says once it starts, before its first step: the settings that do nothing or may not be meant (the
config's own notes, training.config.notes), which preset a machine without CUDA got (the CPU note, built from the
config, so that it names the model and optimizer the run really has), and how long a GPU-sized run takes on a CPU,
which would otherwise print nothing for minutes and train for hours. Logged by launch.run.run, one warning each.
"""
from __future__ import annotations

import torch

from launch import memory
from training.config import SCHEMA_KEYS, Config, notes
from training.metrics import flops_per_token
from training.optim import OPTIMIZERS

# {what}: the model and optimizer the run has (the preset's: "nanoGPT's CPU-sized model, trained
# with Muon")
CPU_NOTE = ("no CUDA GPU found: using the CPU preset experiment=cpu ({what}) instead of the GPU "
            "preset; pass experiment=gpu to force it (hours on a CPU)")
CPU_SIZE = (4, 4, 128, 64)  # nanoGPT's README CPU model: layers, heads, width, context (model=tiny and model=modern)
# fp32 training FLOP/s of one CPU thread, roughly: experiment=cpu trains at ~10.5k tokens/s x 5.2M FLOPs per token
# on 2 idle cores (docs/benchmarks.md, "The CPU preset"); larger matrices run somewhat faster, so this errs long
CPU_FLOPS_PER_THREAD = 27e9
SLOW_S = 30 * 60  # a CPU run expected to take longer than this is told so at its start


def given_keys(overrides: list[str]) -> set[str]:
    """The schema keys the command line set (`optim.muon_lr=0.05`, `+train.seed=1`), not group choices."""
    return {key for o in overrides if not o.startswith("~") and (key := o.lstrip("+").split("=")[0]) in SCHEMA_KEYS}


def cpu_note(c: Config) -> str:
    """The line that says a machine without CUDA got the CPU preset, naming what the run trains (`c`: its config,
    the user's overrides applied)."""
    m = c.model
    size = "nanoGPT's CPU-sized model" if (m.n_layer, m.n_head, m.n_embd, m.block_size) == CPU_SIZE else \
        f"a {m.n_layer}-layer, {m.n_embd}-wide model with context {m.block_size}"
    return CPU_NOTE.format(what=f"{size}, trained with {OPTIMIZERS[c.optim.name].display}")


def sweep_cpu_notes(jobs: list[list[str]]) -> list[str]:
    """The CPU note of each distinct run a sweep's jobs train (each job's overrides composed), said
    once each; with no jobs (Hydra's own flags), the preset's."""
    from launch.config import compose, to_dataclass
    jobs = jobs or [["experiment=cpu"]]
    return list(dict.fromkeys(cpu_note(to_dataclass(compose(job))) for job in jobs))


def cpu_seconds(c: Config, threads: int) -> float:
    """Seconds a run of `c` takes on `threads` CPU threads, roughly: training's FLOPs (6N + attention, per token) and
    the evaluations' (forward only: a third) against CPU_FLOPS_PER_THREAD."""
    m, t, kind = c.model, c.train, c.data.validate()
    vocab = memory.vocab_size(c, kind) if kind != "bpe" or c.data.vocab_size else memory.GPT2_VOCAB  # (a BPE
    params = memory.meta_model(c, vocab).num_params(non_embedding=False)  # file is read later: GPT-2's size stands in)
    per_token = flops_per_token(params, m.n_layer, m.n_head, m.head_size, m.block_size)
    train = t.max_iters * t.batch_size * t.grad_accum_steps * m.block_size
    evals = -(-t.max_iters // t.eval_interval) + t.eval_at_start  # every eval_interval steps, the last step too
    evaluated = evals * 2 * t.eval_iters * t.batch_size * m.block_size  # two splits
    return (train + evaluated / 3) * per_token / (CPU_FLOPS_PER_THREAD * max(1, threads))


def slow_note(c: Config, device: torch.device, overrides: list[str]) -> str | None:
    """On a CPU, a run expected to take over SLOW_S: how long, roughly, and how to get a CPU-sized one; else None."""
    if device.type != "cpu":
        return None
    threads = torch.get_num_threads()
    seconds = cpu_seconds(c, threads)
    if seconds < SLOW_S:
        return None
    t = c.train
    fix = ("lower train.max_iters or train.grad_accum_steps (a fine-tune's model is its source's size)"
           if c.model.init_from else "lower train.max_iters or the model's size" if "experiment=cpu" in overrides
           else "for a CPU-sized run (under a minute) use experiment=cpu, or lower train.max_iters")
    return (f"this run is long for a CPU: about {about(seconds)} here (a rough estimate for {t.max_iters:,} steps "
            f"of {t.batch_size * t.grad_accum_steps * c.model.block_size:,} tokens on {threads} thread"
            f"{'s' if threads > 1 else ''}, evaluations included): {fix}")


def about(seconds: float) -> str:
    """A rough duration: '40 minutes', '6 hours', '1,856 days'."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= 2 * size or unit == "minute":
            n = round(seconds / size)
            return f"{n:,} {unit}{'s' if n != 1 else ''}"


def start_notes(c: Config, device: torch.device, overrides: list[str]) -> list[str]:
    """Every warning a run gives at its start (`overrides`: its command line's, as Hydra read them)."""
    slow = slow_note(c, device, overrides)
    return notes(c, given_keys(overrides)) + ([slow] if slow else [])
