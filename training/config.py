"""The run configuration: one dataclass per config group under `Config` (the model's is the model's own GPTConfig).

Plain dataclasses: the schema the edge (launch/config.py) merges every preset and override onto, so a wrong key or
type fails before any work; `validate` adds ranges and cross-field rules. Nothing here knows Hydra or OmegaConf.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Collection, Iterator, Optional

from common.cli import in_keys
from data.config import DataConfig
from model.config import GPTConfig
from model.hub import download_command
from runtime.ranks import PARALLEL_MODES

DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}  # accepted spellings -> canonical torch dtype name
SCHEDULES = ("cosine", "linear", "wsd", "constant")
OPTIMIZERS = ("adamw", "muon")
REQUIRED = "required"  # model.init_from in a preset that fine-tunes (YAML's ??? would not survive the merge)
SEED_MAX = 2**32 - 1  # numpy's seed range (torch's is wider); the loop seeds torch, random and numpy with it
MUON_ONLY = ("muon_lr", "muon_momentum", "muon_ns_steps")  # optim keys that only optim.name=muon reads


def baby() -> GPTConfig:
    """The `model` group's defaults: nanoGPT's shakespeare_char "baby GPT" (conf/model/baby.yaml)."""
    return GPTConfig(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 2e-3  # peak learning rate, reached after warmup
    min_lr: float = 2e-4  # floor of the decay
    weight_decay: float = 0.1  # applied to >=2-D weights only (matmuls, embeddings)
    beta1: float = 0.9
    beta2: float = 0.99
    warmup_iters: int = 100
    decay_iters: Optional[int] = None  # null = train.max_iters
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    schedule: str = "cosine"  # cosine | linear | wsd | constant (each after linear warmup)
    cooldown_frac: float = 0.2  # schedule=wsd: the last fraction of decay_iters spent cooling down to min_lr
    muon_lr: float = 0.02  # optim=muon: peak lr of the blocks' matrices (follows the same schedule as lr)
    muon_momentum: float = 0.95  # optim=muon: Nesterov momentum of the Muon updates
    muon_ns_steps: int = 5  # optim=muon: Newton-Schulz iterations per update


@dataclass
class TrainConfig:
    device: str = "auto"  # auto (CUDA > MPS > CPU) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    compile: Any = "auto"  # auto (on for CUDA only) | true | false
    max_iters: int = 1500  # optimizer steps
    batch_size: int = 64  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    tokens_per_step: Optional[int] = None  # global batch in tokens: derives grad_accum_steps from the processes
    eval_interval: int = 250  # evaluate + checkpoint every this many steps (and at the end)
    eval_iters: int = 40  # batches per split in each evaluation
    eval_at_start: bool = False  # also evaluate the untrained model at step 0 (not on resume)
    patience: Optional[int] = None  # stop when val loss has not improved for this many evaluations (null: off)
    log_interval: int = 10  # steps between train-loss readings (the only host syncs in the loop)
    seed: int = 1337
    resume: Any = False  # false | true (last.pt in the run dir) | path to a .pt file or run dir
    parallel: str = "none"  # none (DDP when launched by torchrun with >1 process) | ddp | fsdp
    hellaswag: Optional[str] = None  # a HellaSwag jsonl also scored at each evaluation (evals/hellaswag.py)
    probe: bool = True  # record attention and logit lens on one text at each evaluation (RUN/probes/, the explorer)
    probe_text: Optional[str] = None  # that text (null: the first min(64, block_size) tokens of the validation split)
    probe_steps: int = 8  # and at step 0 and this many steps log-spaced up to max_iters (0: at evaluations only)


@dataclass
class LoggerConfig:
    name: Optional[str] = None  # null (metrics.jsonl only) | wandb
    project: str = "tinygpt"
    entity: Optional[str] = None
    mode: str = "online"  # online | offline | disabled  (the WANDB_MODE env var wins when set)
    run_name: Optional[str] = None


@dataclass
class Config:
    model: GPTConfig = field(default_factory=baby)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def _dotted(cls: type, prefix: str = "") -> Iterator[str]:
    for f in fields(cls):
        kind = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(kind):
            yield from _dotted(type(kind), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


SCHEMA_KEYS = tuple(_dotted(Config))  # model.n_layer, ...
KEYS = {**{k.split(".")[1]: k for k in SCHEMA_KEYS if k.startswith(("model.", "data.", "train."))}, "name": "data"}
train_keys = functools.partial(in_keys, KEYS)  # libraries' errors in these keys (DataConfig's name: data=text)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


COMPILE = {"auto": "auto", **dict.fromkeys(("true", "on", "yes", "1"), True),
           **dict.fromkeys(("false", "off", "no", "0"), False)}  # accepted spellings of train.compile


@train_keys()
def validate(c: Config) -> None:
    """Range and cross-field checks the schema's types cannot express; ValueError with one line."""
    c.model = dataclasses.replace(c.model)  # GPTConfig checks itself when built (again: code may have changed it)
    m, o, t, lg = c.model, c.optim, c.train, c.logger
    _check(m.vocab_size is None, f"model.vocab_size={m.vocab_size} cannot be set: the vocabulary is the "
           f"tokenizer's (data.tokenizer, data.vocab_size), padded per model.pad_vocab_to")
    _check(m.init_from not in ("", REQUIRED), f"model.init_from must be given: add model.init_from=PATH, a local "
           f"Hugging Face GPT-2 directory (e.g. {download_command('gpt2')}) or a tinygpt run directory")
    _check(o.name in OPTIMIZERS, f"optim.name={o.name!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    _check(_finite(o.lr) and o.lr > 0, f"optim.lr={o.lr} must be a positive number: e.g. optim.lr=1e-3")
    _check(_finite(o.min_lr) and o.min_lr >= 0, f"optim.min_lr={o.min_lr} must be >= 0: e.g. optim.min_lr=1e-4")
    _check(o.min_lr <= o.lr, f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}: set optim.min_lr to at most "
                             f"optim.lr (e.g. optim.min_lr={o.lr / 10:g})")
    _check(_finite(o.weight_decay) and o.weight_decay >= 0,
           f"optim.weight_decay={o.weight_decay} must be >= 0: e.g. optim.weight_decay=0.1")
    for name, v in (("beta1", o.beta1), ("beta2", o.beta2)):
        _check(0.0 <= v < 1.0, f"optim.{name}={v} must be in [0, 1): e.g. optim.{name}=0.9")
    _check(o.warmup_iters >= 0, f"optim.warmup_iters={o.warmup_iters} must be >= 0: e.g. optim.warmup_iters=100")
    _check(o.decay_iters is None or o.decay_iters >= 1,
           f"optim.decay_iters={o.decay_iters} must be >= 1: or null to decay over train.max_iters")
    _check(_finite(o.grad_clip) and o.grad_clip >= 0,
           f"optim.grad_clip={o.grad_clip} must be >= 0: use 0 to disable clipping or e.g. optim.grad_clip=1.0")
    _check(_finite(o.muon_lr) and o.muon_lr > 0, f"optim.muon_lr={o.muon_lr} must be a positive number: e.g. 0.02")
    _check(0.0 <= o.muon_momentum < 1.0, f"optim.muon_momentum={o.muon_momentum} must be in [0, 1): e.g. 0.95")
    _check(o.muon_ns_steps >= 1, f"optim.muon_ns_steps={o.muon_ns_steps} must be >= 1: e.g. optim.muon_ns_steps=5")
    _check(_finite(o.cooldown_frac) and 0.0 <= o.cooldown_frac <= 1.0,
           f"optim.cooldown_frac={o.cooldown_frac} must be in [0, 1]: e.g. optim.cooldown_frac=0.2")
    _check(o.schedule in SCHEDULES, f"optim.schedule={o.schedule!r} is not known: use one of {', '.join(SCHEDULES)}")
    _check(t.device in ("auto", "cpu", "cuda", "mps") or (t.device.startswith("cuda:") and t.device[5:].isdigit()),
           f"train.device={t.device!r} is not valid: use auto, cpu, cuda, cuda:N or mps")
    _check(t.dtype in DTYPES, f"train.dtype={t.dtype!r} is not valid: use auto, float32, bfloat16 or float16")
    t.dtype = DTYPES[t.dtype]
    comp = COMPILE.get(t.compile.strip().lower()) if isinstance(t.compile, str) else t.compile
    _check(isinstance(comp, bool) or comp == "auto",
           f"train.compile={t.compile!r} is not valid: use auto, true or false")
    t.compile = comp
    for name in ("max_iters", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval"):
        _check(getattr(t, name) >= 1, f"train.{name}={getattr(t, name)} must be >= 1: give a positive whole number")
    _check(t.patience is None or t.patience >= 1,
           f"train.patience={t.patience} must be >= 1 (evaluations without a better val loss), or null (no early "
           f"stopping)")
    _check(0 <= t.seed <= SEED_MAX, f"train.seed={t.seed} must be >= 0: e.g. train.seed=1337" if t.seed < 0 else
           f"train.seed={t.seed} is too large: use a whole number from 0 to {SEED_MAX}, e.g. train.seed=1337")
    _check(t.parallel in PARALLEL_MODES, f"train.parallel={t.parallel!r} is not valid: use none (DDP under torchrun), "
                                         f"ddp or fsdp")
    _check(not (t.parallel == "fsdp" and o.name == "muon"),
           "optim=muon does not work with train.parallel=fsdp (Muon needs whole weight matrices): "
           "use optim=adamw with FSDP, or train.parallel=ddp with Muon")
    r = t.resume
    _check(isinstance(r, bool) or (isinstance(r, str) and r.strip() != ""),
           f"train.resume={r!r} is not valid: use false, true (last.pt in the run dir) or a checkpoint path")
    t.resume = {"true": True, "false": False}.get(r.strip().lower(), r) if isinstance(r, str) else r
    _check(t.probe_steps >= 0, f"train.probe_steps={t.probe_steps} must be >= 0: snapshots on a log scale besides "
           "the evaluations, e.g. train.probe_steps=8 (0: at evaluations only)")
    _check(t.probe or t.probe_steps == TrainConfig.probe_steps, f"train.probe_steps={t.probe_steps} has no effect "
           "with train.probe=false: drop one of them")
    _check(t.probe_text != "", "train.probe_text='' is empty: give a text, or null (the validation split's start)")
    _check(t.probe or t.probe_text is None, f"train.probe_text={t.probe_text!r} has no effect with train.probe=false: "
           "drop one of them")
    c.data.validate()  # the data package's own checks (no I/O)
    if t.tokens_per_step is not None:
        t.grad_accum_steps = grad_accum_for(t.tokens_per_step, t.batch_size, m.block_size, _env_world_size())
    if t.hellaswag is not None:  # read now (and kept): a bad file is one line before training, not at an evaluation
        from training.eval_hellaswag import examples
        examples(t.hellaswag)
    _check(lg.name in (None, "wandb"), f"logger.name={lg.name!r} is not known: use logger=wandb, or logger.name=null")
    _check(lg.mode in ("online", "offline", "disabled"),
           f"logger.mode={lg.mode!r} is not valid: use online, offline or disabled")
    unused = [f"logger.{f.name}={getattr(lg, f.name)}" for f in fields(LoggerConfig)
              if f.name != "name" and getattr(lg, f.name) != f.default]
    _check(lg.name is not None or not unused, f"{', '.join(unused)} has no effect without logger=wandb: add "
           f"logger=wandb to log to Weights & Biases, or drop it (metrics.jsonl is always written)")


def notes(c: Config, given: Collection[str] = ()) -> list[str]:
    """One line for each setting of a validated config that does nothing, or that may not be what was meant yet can
    be (a smoke run shorter than the preset's warmup): the run's start logs each as a warning (docs/configuration.md,
    "Warnings"). `given`: the keys the command line set. A setting that merely does nothing is told only when given
    there, since a preset lists every key of its group whether the run reads it or not."""
    o, t, out = c.optim, c.train, []
    ignored = lambda keys: [f"{k}={getattr(o, k.split('.')[1])}" for k in keys if k in given]  # noqa: E731
    if o.warmup_iters >= t.max_iters:
        end = o.lr * t.max_iters / (o.warmup_iters + 1)  # lr_at(max_iters - 1): the last step's rate
        out.append(f"optim.warmup_iters={o.warmup_iters} is not shorter than train.max_iters={t.max_iters}: the "
                   f"learning rate climbs to {end:.3g} at the last step, never reaching optim.lr={o.lr:g}"
                   f"{'' if o.schedule == 'constant' else ' nor decaying'}; for the full schedule lower "
                   f"optim.warmup_iters (e.g. optim.warmup_iters={t.max_iters // 10})")
    elif o.schedule != "constant" and o.decay_iters is not None and o.warmup_iters >= o.decay_iters:
        out.append(f"optim.warmup_iters={o.warmup_iters} is not shorter than optim.decay_iters={o.decay_iters}: the "
                   f"rate drops from optim.lr={o.lr:g} to optim.min_lr={o.min_lr:g} as the warmup ends, with no "
                   f"decay: raise optim.decay_iters, or lower optim.warmup_iters")
    elif o.schedule != "constant" and o.decay_iters is not None and o.decay_iters > t.max_iters:
        out.append(f"optim.decay_iters={o.decay_iters} is beyond train.max_iters={t.max_iters}: the run ends before "
                   f"its rate reaches optim.min_lr={o.min_lr:g} (as meant only if a resume with a larger "
                   f"train.max_iters will finish it); null decays over train.max_iters")
    if o.name != "muon" and (keys := ignored([f"optim.{k}" for k in MUON_ONLY])):
        out.append(f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'} nothing with optim.name={o.name}: "
                   f"Muon's settings apply to optim=muon only: add optim=muon to train with Muon, or drop "
                   f"{'it' if len(keys) == 1 else 'them'}")
    if o.schedule != "wsd" and (keys := ignored(["optim.cooldown_frac"])):
        out.append(f"{keys[0]} does nothing with optim.schedule={o.schedule}: it is schedule=wsd's cool-down: add "
                   f"optim.schedule=wsd, or drop it")
    if o.schedule == "constant" and (keys := ignored(["optim.min_lr", "optim.decay_iters"])):
        out.append(f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'} nothing with optim.schedule=constant "
                   f"(the rate stays at optim.lr after the warmup): choose a decaying optim.schedule (cosine, linear, "
                   f"wsd), or drop {'it' if len(keys) == 1 else 'them'}")
    if t.tokens_per_step is not None and "train.grad_accum_steps" in given:
        out.append(f"train.grad_accum_steps does nothing with train.tokens_per_step={t.tokens_per_step}, which "
                   f"derives it ({t.grad_accum_steps} here): drop train.grad_accum_steps, or add "
                   f"train.tokens_per_step=null to use it")
    evals = (t.max_iters - 1) // t.eval_interval  # evaluations before the last step, where an early stop can happen
    if t.patience is not None and evals <= t.patience:
        out.append(f"train.patience={t.patience} can never stop this run early: it evaluates {evals} time"
                   f"{'' if evals == 1 else 's'} before its last step, fewer than the {t.patience + 1} an early stop "
                   f"needs (the best, then {t.patience} without improvement): lower train.patience or "
                   f"train.eval_interval, or drop train.patience")
    return out


def _env_world_size() -> int:
    """The processes torchrun started (WORLD_SIZE, which runtime.distributed.init also reads), else 1."""
    w = os.environ.get("WORLD_SIZE", "1")
    return int(w) if w.isdigit() and int(w) >= 1 else 1


def grad_accum_for(tokens_per_step: int, batch_size: int, block_size: int, world_size: int) -> int:
    """train.grad_accum_steps for a global batch of `tokens_per_step` tokens (train.tokens_per_step)."""
    micro = batch_size * block_size * world_size  # tokens of one micro-step over all processes
    _check(tokens_per_step >= 1 and tokens_per_step % micro == 0,
           f"train.tokens_per_step={tokens_per_step} is not a multiple of train.batch_size x model.block_size x "
           f"processes = {batch_size} x {block_size} x {world_size} = {micro}: change train.batch_size (or "
           f"train.tokens_per_step, or null to use train.grad_accum_steps)")
    return tokens_per_step // micro
