"""What a run says once it starts, before its first step: the settings that do nothing or may not be meant (the
config's own notes, training.config.notes), which preset a machine without CUDA got (the CPU note, built from the
config, so that it names the model and optimizer the run really has), how long a GPU-sized run (or
one of its evaluations) takes on a CPU, which would otherwise print nothing for minutes and train
for hours, and a fine-tune at a from-scratch learning rate. Logged by launch.run.run, one warning
each.
"""
from __future__ import annotations

import torch

from launch import memory
from training.config import SCHEMA_KEYS, Config, notes
from training.mfu import flops_per_token
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
# a CPU evaluation expected to take longer than EVAL_SLOW_S is told so at the run's start, with the
# train.eval_iters that takes about EVAL_QUICK_S
EVAL_SLOW_S, EVAL_QUICK_S = 120, 30
# a fine-tune (model.init_from) at or above these rates trains at a from-scratch rate: nanoGPT's
# fine-tune runs at 3e-5, GPT-2 124M's pretraining at 6e-4; Muon's from-scratch rates are 0.02-0.05
# (measured: docs/training.md)
FINETUNE_LR, FINETUNE_MUON_LR = 3e-4, 3e-3


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


def cpu_seconds(c: Config, threads: int, evaluation_only: bool = False) -> float:
    """Seconds a run of `c` takes on `threads` CPU threads, roughly: training's FLOPs (6N + attention, per token) and
    the evaluations' (forward only: a third) against CPU_FLOPS_PER_THREAD; `evaluation_only`: one
    evaluation's."""
    m, t, kind = c.model, c.train, c.data.validate()
    vocab = memory.vocab_size(c, kind) if kind != "bpe" or c.data.vocab_size else memory.GPT2_VOCAB  # (a BPE
    params = memory.meta_model(c, vocab).num_params(non_embedding=False)  # file is read later: GPT-2's size stands in)
    per_token = flops_per_token(params, m.n_layer, m.n_head, m.head_size, m.block_size)
    train = t.max_iters * t.batch_size * t.grad_accum_steps * m.block_size
    # every eval_interval steps, the last step too, and at the start if asked
    evals = -(-t.max_iters // t.eval_interval) + t.eval_at_start
    if evaluation_only:
        train, evals = 0, 1
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


def eval_note(c: Config, device: torch.device) -> str | None:
    """On a CPU, an evaluation expected to take over EVAL_SLOW_S (it shows its progress as it goes,
    but would otherwise surprise): how long, what it is made of, and the train.eval_iters for half
    a minute."""
    if device.type != "cpu":
        return None
    threads, t = torch.get_num_threads(), c.train
    seconds = cpu_seconds(c, threads, evaluation_only=True)
    if seconds < EVAL_SLOW_S:
        return None
    fewer = max(1, int(t.eval_iters * EVAL_QUICK_S / seconds))
    return (f"each evaluation is long for a CPU: about {about(seconds)} here (a rough estimate: "
            f"2 splits x train.eval_iters={t.eval_iters} batches of {t.batch_size} x "
            f"{c.model.block_size} tokens, forward only, on {threads} thread"
            f"{'s' if threads > 1 else ''}; its progress is shown as it goes): for about half a "
            f"minute use train.eval_iters={fewer}")


def finetune_note(c: Config, given: set[str]) -> str | None:
    """A fine-tune (model.init_from) at a preset's from-scratch learning rate (one the command line
    did not set): its first steps usually make the pretrained model worse (docs/training.md); the
    same rates 10x lower as the override to add, min_lr too where the lower rate would fall below it
    (which training.config.check refuses)."""
    o = c.optim
    if not c.model.init_from:
        return None
    high = {"optim.lr": o.lr} if o.lr >= FINETUNE_LR and "optim.lr" not in given else {}
    if o.name == "muon" and o.muon_lr >= FINETUNE_MUON_LR and "optim.muon_lr" not in given:
        high["optim.muon_lr"] = o.muon_lr
    if not high:
        return None
    fix = {key: rate / 10 for key, rate in high.items()}
    if fix.get("optim.lr", o.lr) < o.min_lr and "optim.min_lr" not in given:
        fix["optim.min_lr"] = o.min_lr / 10
    warmup = " and no warm-up" if o.warmup_iters == 0 else ""
    rates = " ".join(f"{k}={v:g}" for k, v in high.items())
    return (f"model.init_from fine-tunes pretrained weights at a from-scratch learning rate "
            f"({rates}){warmup}: its first steps usually make the model worse before it recovers; "
            f"a fine-tune wants a rate about 10x lower: add "
            f"{' '.join(f'{k}={v:.3g}' for k, v in fix.items())}")


def about(seconds: float) -> str:
    """A rough duration: '40 minutes', '6 hours', '1,856 days'."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= 2 * size or unit == "minute":
            n = round(seconds / size)
            return f"{n:,} {unit}{'s' if n != 1 else ''}"


def start_notes(c: Config, device: torch.device, overrides: list[str]) -> list[str]:
    """Every warning a run gives at its start (`overrides`: its command line's, as Hydra read them)."""
    given = given_keys(overrides)
    said = [slow_note(c, device, overrides), eval_note(c, device), finetune_note(c, given)]
    return notes(c, given) + [line for line in said if line]
