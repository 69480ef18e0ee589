"""The run configuration: one dataclass per config group under `Config` (the model's is the model's
own GPTConfig).

Plain dataclasses, each setting's one home (default, meaning): the schema that presets (listing what
they change) and overrides merge onto at the edge (launch/config.py), so a wrong key or type fails
at once; `check` adds the rules, `normalize` the one spelling of each value. Nothing here knows
Hydra or OmegaConf.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional

from common.cli import in_keys
from data.config import DataConfig
from model.config import GPTConfig
from runtime.ranks import PARALLEL_MODES
from training.optim import OPTIMIZERS

# accepted spellings -> canonical torch dtype name
DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
# accepted spellings of train.compile
COMPILE = {"auto": "auto", **dict.fromkeys(("true", "on", "yes", "1"), True),
           **dict.fromkeys(("false", "off", "no", "0"), False)}
SCHEDULES = ("cosine", "linear", "wsd", "constant")
# model.init_from in a preset that fine-tunes (YAML's ??? would not survive the merge)
REQUIRED = "required"
# numpy's seed range (torch's is wider); the loop seeds torch, random and numpy with it
SEED_MAX = 2**32 - 1


def baby() -> GPTConfig:
    """The `model` group's default and model=baby's one home (conf/model/baby.yaml lists nothing):
    nanoGPT's shakespeare_char "baby GPT". The other model presets list what they change from it."""
    return GPTConfig(block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False)


@dataclass
class OptimConfig:
    """optim=adamw: AdamW, linear warmup, cosine decay; twice nanoGPT's rates (1e-3 -> 1e-4), which
    suit TrainConfig's 1500 steps (experiment=shakespeare_char: nanoGPT's own). optim=muon changes a
    few (conf/optim/muon.yaml)."""
    name: str = "adamw"  # the optimizer: a name in training/optim.py's OPTIMIZERS
    lr: float = 2e-3  # peak learning rate, reached after warmup (optim=muon: the AdamW part's)
    min_lr: float = 2e-4  # floor of the decay
    # applied to >=2-D weights only (matmuls, embeddings; optim=muon: the AdamW part's)
    weight_decay: float = 0.1
    beta1: float = 0.9  # the optimizer's first beta (AdamW: the first moment's decay rate)
    beta2: float = 0.99  # its second beta (AdamW: the second moment's decay rate)
    warmup_iters: int = 100  # steps of linear warmup from 0 to lr
    decay_iters: Optional[int] = None  # the step the decay reaches min_lr; null = train.max_iters
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    schedule: str = "cosine"  # cosine | linear | wsd | constant (each after linear warmup)
    # schedule=wsd: the last fraction of decay_iters spent cooling down to min_lr
    cooldown_frac: float = 0.2
    # optim=muon: peak lr of the blocks' matrices (follows the same schedule as lr)
    muon_lr: float = 0.02
    muon_momentum: float = 0.95  # optim=muon: Nesterov momentum of the Muon updates
    muon_ns_steps: int = 5  # optim=muon: Newton-Schulz iterations per update


@dataclass
class TrainConfig:
    """The loop; its defaults, the baby GPT's GPU run: val 1.4542 at step 1500 on an H100 with
    optim=adamw, no overfitting tail (nanoGPT's 5000-step config: 1.4665 at step 1500, 1.7079 at
    5000; BENCHMARKS.md)."""
    device: str = "auto"  # auto (CUDA > MPS > CPU) | cpu | cuda | cuda:N | mps
    # auto (bf16 on GPUs with it, else fp16 + GradScaler; CPU: fp32) | float32 | bfloat16 | float16
    dtype: str = "auto"
    compile: Any = "auto"  # auto (on for CUDA only) | true | false
    max_iters: int = 1500  # optimizer steps
    batch_size: int = 64  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    # global batch in tokens: derives grad_accum_steps from the processes
    tokens_per_step: Optional[int] = None
    eval_interval: int = 250  # evaluate + checkpoint every this many steps (and at the end)
    eval_iters: int = 40  # batches per split in each evaluation
    eval_at_start: bool = False  # also evaluate the untrained model at step 0 (not on resume)
    # stop when val loss has not improved for this many evaluations (null: never)
    patience: Optional[int] = None
    log_interval: int = 10  # steps between train-loss readings (the only host syncs in the loop)
    seed: int = 1337  # seeds torch, random and numpy (and the data loader's order)
    resume: Any = False  # false | true (last.pt in the run dir) | path to a .pt file or run dir
    # none (DDP when torchrun starts >1 process) | ddp | fsdp (FSDP2, sharded checkpoints)
    parallel: str = "none"
    # a HellaSwag jsonl also scored at each evaluation (evals/hellaswag.py)
    hellaswag: Optional[str] = None
    # record attention and logit lens on one text at each evaluation (RUN/probes/, the explorer)
    probe: bool = True
    # that text (null: the first min(64, block_size) tokens of the validation split)
    probe_text: Optional[str] = None
    # and at step 0 and this many steps log-spaced up to max_iters (0: at evaluations only)
    probe_steps: int = 8


@dataclass
class LoggerConfig:
    name: Optional[str] = None  # null (metrics.jsonl only) | wandb (logger=wandb)
    project: str = "tinygpt"  # the wandb project
    entity: Optional[str] = None  # the wandb team or user (null: your default)
    # online (needs wandb login) | offline (wandb sync later) | disabled; WANDB_MODE wins
    mode: str = "online"
    run_name: Optional[str] = None  # the wandb run's name (null: wandb picks one)


@dataclass
class Config:
    model: GPTConfig = field(default_factory=baby)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


# every key as the command line writes it: model.n_layer, ...
SCHEMA_KEYS = tuple(f"{group}.{key}" for group, keys in dataclasses.asdict(Config()).items() for key in keys)
KEYS = {**{k.split(".")[1]: k for k in SCHEMA_KEYS if k.startswith(("model.", "data.", "train."))}, "name": "data"}
# libraries' errors in these keys (DataConfig's name: data=text)
train_keys = functools.partial(in_keys, KEYS)


def _number(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """`test`, for a finite number only (a bool, NaN, inf or a string fails it)."""
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and test(v)


def _one_of(names: tuple) -> tuple:  # the rule of a setting that names one of `names`
    return f"one of {', '.join(names)}", lambda v: v in names


POSITIVE, AT_LEAST_0 = ("a positive number", _number(lambda v: v > 0)), (">= 0", _number(lambda v: v >= 0))
AT_LEAST_1, FRACTION = (">= 1", _number(lambda v: v >= 1)), ("in [0, 1)", _number(lambda v: 0 <= v < 1))
AT_LEAST_1_OR_NULL = (">= 1 or null", lambda v: v is None or AT_LEAST_1[1](v))


def _at_least(example: str, bound: float) -> str:
    return example if float(example) >= bound else f"{bound:g}"


def _at_most(example: str, bound: float) -> str:
    return example if float(example) <= bound else f"{bound:g}"


def _valid(v: Any, otherwise: float) -> float:
    """A setting's value where it is a finite number, else `otherwise` (for an example that depends
    on it)."""
    return v if _number(lambda _: True)(v) else otherwise


# each setting's choices or range: (what it must be, its test), and an example for the one-line
# message (a function of the config where another setting limits it: optim.lr >= optim.min_lr)
RULES = {
    "optim.name": (_one_of(tuple(OPTIMIZERS)), OptimConfig.name),
    "optim.schedule": (_one_of(SCHEDULES), "cosine"),
    "optim.lr": (POSITIVE, lambda c: _at_least("1e-3", _valid(c.optim.min_lr, 0))),
    "optim.min_lr": (AT_LEAST_0, lambda c: _at_most("1e-4", _valid(c.optim.lr, 1) / 10)),
    "optim.weight_decay": (AT_LEAST_0, "0.1"),
    "optim.beta1": (FRACTION, "0.9"), "optim.beta2": (FRACTION, "0.99"), "optim.warmup_iters": (AT_LEAST_0, "100"),
    "optim.decay_iters": (AT_LEAST_1_OR_NULL, "5000 (null: train.max_iters)"),
    "optim.grad_clip": (AT_LEAST_0, "1.0 (0: no clipping)"),
    "optim.cooldown_frac": (("in [0, 1]", _number(lambda v: 0 <= v <= 1)), "0.2"), "optim.muon_lr": (POSITIVE, "0.02"),
    "optim.muon_momentum": (FRACTION, "0.95"), "optim.muon_ns_steps": (AT_LEAST_1, "5"),
    "train.max_iters": (AT_LEAST_1, "1500"), "train.batch_size": (AT_LEAST_1, "64"),
    "train.grad_accum_steps": (AT_LEAST_1, "1"), "train.eval_interval": (AT_LEAST_1, "250"),
    "train.eval_iters": (AT_LEAST_1, "40"), "train.log_interval": (AT_LEAST_1, "10"),
    "train.patience": (AT_LEAST_1_OR_NULL, "5 (evaluations without a better val loss; null: no early stopping)"),
    "train.probe_steps": (AT_LEAST_0, "8 (0: at evaluations only)"),
    "train.parallel": (_one_of(PARALLEL_MODES), "ddp (none: DDP when torchrun starts several processes)"),
    "train.device": (("auto, cpu, cuda, cuda:N or mps", lambda v: v in ("auto", "cpu", "cuda", "mps") or
                      (v.startswith("cuda:") and v[5:].isdigit())), "cpu"),
    "logger.mode": (_one_of(("online", "offline", "disabled")),
                    lambda c: "offline" if c.logger.name else "online (others need logger=wandb)")}


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check(c: Config) -> None:
    """The rules the schema's types cannot express (RULES, settings at odds): one line for the first
    one broken. It changes nothing. (launch.config.to_dataclass calls it and names GPTConfig's and
    DataConfig's settings.)"""
    # GPTConfig checks itself when built (again: code may have changed it)
    dataclasses.replace(c.model)
    m, o, t, lg = c.model, c.optim, c.train, c.logger
    _check(m.vocab_size is None, f"model.vocab_size={m.vocab_size} cannot be set: the vocabulary is the "
           f"tokenizer's (data.tokenizer, data.vocab_size), padded per model.pad_vocab_to")
    if m.init_from in ("", REQUIRED):
        from model.hub import download_command  # (only here: not on every run's path)
        raise ValueError(f"model.init_from must be given: add model.init_from=PATH, a local Hugging Face GPT-2 "
                         f"directory (e.g. {download_command('gpt2')}) or a tinygpt run directory")
    for key, ((rule, test), example) in RULES.items():
        group, name = key.split(".")
        v = getattr(getattr(c, group), name)
        if not test(v):
            shown = example(c) if callable(example) else example
            raise ValueError(f"{key}={v!r} must be {rule}: e.g. {key}={shown}")
    _check(o.min_lr <= o.lr, f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}: set optim.min_lr to at most "
                             f"optim.lr (e.g. optim.min_lr={o.lr / 10:g})")
    _check(0 <= t.seed <= SEED_MAX, f"train.seed={t.seed} must be >= 0: e.g. train.seed=1337" if t.seed < 0 else
           f"train.seed={t.seed} is too large: use a whole number from 0 to {SEED_MAX}, e.g. train.seed=1337")
    why = OPTIMIZERS[o.name].no_fsdp
    sharded = " or ".join(f"optim.name={n}" for n, spec in OPTIMIZERS.items() if not spec.no_fsdp)
    _check(t.parallel != "fsdp" or why is None, f"optim.name={o.name} does not work with "
           f"train.parallel=fsdp ({why}): use {sharded} with FSDP, or train.parallel=ddp")
    _check(t.probe or t.probe_steps == TrainConfig.probe_steps, f"train.probe_steps={t.probe_steps} has no effect "
           "with train.probe=false: drop one of them")
    _check(t.probe_text != "", "train.probe_text='' is empty: give a text, or null (the validation split's start)")
    _check(t.probe or t.probe_text is None, f"train.probe_text={t.probe_text!r} has no effect with train.probe=false: "
           "drop one of them")
    c.data.validate()  # the data package's own checks (no I/O)
    # read now (and kept): a bad file is one line before training, not at an evaluation
    if t.hellaswag is not None:
        from training.eval_hellaswag import examples
        examples(t.hellaswag)
    _check(lg.name in (None, "wandb"), f"logger.name={lg.name!r} is not known: use logger=wandb "
           "instead of logger.name, or logger.name=null")
    unused = [f"logger.{f.name}={getattr(lg, f.name)}" for f in dataclasses.fields(LoggerConfig)
              if f.name != "name" and getattr(lg, f.name) != f.default]
    _check(lg.name is not None or not unused, f"{', '.join(unused)} has no effect without logger=wandb: add "
           f"logger=wandb to log to Weights & Biases, or drop it (metrics.jsonl is always written)")


def normalize(c: Config) -> None:
    """A checked config's values in one spelling (bf16 -> bfloat16, compile=on -> True,
    resume="true" -> True; one line for a spelling not known), and train.grad_accum_steps derived
    from train.tokens_per_step when that is set."""
    t = c.train
    _check(t.dtype in DTYPES, f"train.dtype={t.dtype!r} is not valid: use auto, float32, bfloat16 or float16")
    t.dtype = DTYPES[t.dtype]
    _check(isinstance(t.compile, (str, bool)) and str(t.compile).strip().lower() in COMPILE,
           f"train.compile={t.compile!r} is not valid: use auto, true or false")
    t.compile = COMPILE[str(t.compile).strip().lower()]
    _check(isinstance(t.resume, bool) or (isinstance(t.resume, str) and t.resume.strip() != ""),
           f"train.resume={t.resume!r} is not valid: use false, true (last.pt in the run dir) or a checkpoint path")
    if isinstance(t.resume, str):
        t.resume = {"true": True, "false": False}.get(t.resume.strip().lower(), t.resume)
    if t.tokens_per_step is not None:
        t.grad_accum_steps = grad_accum_for(t.tokens_per_step, t.batch_size, c.model.block_size, _env_world_size())


def notes(c: Config, given: Collection[str] = ()) -> list[str]:
    """One line for each setting of a validated config that does nothing, or that may not be what
    was meant yet can be (a smoke run shorter than the preset's warmup): the run's start logs each
    as a warning (docs/configuration.md, "Warnings"). `given`: the keys the command line set. A
    setting that merely does nothing is told only when given there: a preset's (experiment=cpu's
    optim.muon_momentum under optim=adamw) is no one's mistake."""
    o, t, out = c.optim, c.train, []
    ignored = lambda keys: [f"{k}={getattr(o, k.split('.')[1])}" for k in keys if k in given]  # noqa: E731
    if o.warmup_iters >= t.max_iters:
        # lr_at(max_iters - 1): the last step's rate
        end = o.lr * t.max_iters / (o.warmup_iters + 1)
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
    # an optimizer's own settings given to another: a line for each set of optimizers that read them
    readers: dict[tuple, list[str]] = {}
    for k in (f.name for f in dataclasses.fields(OptimConfig)):
        names = tuple(n for n, spec in OPTIMIZERS.items() if k in spec.reads)
        if names and o.name not in names and f"optim.{k}" in given:
            readers.setdefault(names, []).append(f"optim.{k}={getattr(o, k)}")
    for names, keys in readers.items():
        them = "it" if len(keys) == 1 else "them"
        out.append(f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'} nothing with optim.name={o.name}: "
                   f"only {' or '.join(f'optim.name={n}' for n in names)} reads {them}: add "
                   f"optim.name={names[0]} to train with {OPTIMIZERS[names[0]].display}, or drop "
                   f"{them}")
    if o.schedule != "wsd" and (keys := ignored(["optim.cooldown_frac"])):
        out.append(f"{keys[0]} does nothing with optim.schedule={o.schedule}: it is schedule=wsd's cool-down: add "
                   f"optim.schedule=wsd, or drop it")
    if o.schedule == "constant" and (keys := ignored(["optim.min_lr", "optim.decay_iters"])):
        out.append(f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'} nothing with optim.schedule=constant "
                   f"(the rate stays at optim.lr after the warmup): choose a decaying schedule "
                   f"(optim.schedule=cosine, linear or wsd), or drop "
                   f"{'it' if len(keys) == 1 else 'them'}")
    if t.tokens_per_step is not None and "train.grad_accum_steps" in given:
        out.append(f"train.grad_accum_steps does nothing with train.tokens_per_step={t.tokens_per_step}, which "
                   f"derives it ({t.grad_accum_steps} here): drop train.grad_accum_steps, or add "
                   f"train.tokens_per_step=null to use it")
    # evaluations before the last step, where an early stop can happen
    evals = (t.max_iters - 1) // t.eval_interval
    if t.patience is not None and evals <= t.patience:
        out.append(f"train.patience={t.patience} can never stop this run early: it evaluates {evals} time"
                   f"{'' if evals == 1 else 's'} before its last step, fewer than the {t.patience + 1} an early stop "
                   f"needs (the best, then {t.patience} without improvement): lower train.patience or "
                   f"train.eval_interval, or drop train.patience")
    return out


def _env_world_size() -> int:
    """The processes torchrun started (WORLD_SIZE, which runtime.distributed.init also reads), else
    1."""
    w = os.environ.get("WORLD_SIZE", "1")
    return int(w) if w.isdigit() and int(w) >= 1 else 1


def grad_accum_for(tokens_per_step: int, batch_size: int, block_size: int, world_size: int) -> int:
    """train.grad_accum_steps for a global batch of `tokens_per_step` tokens
    (train.tokens_per_step)."""
    micro = batch_size * block_size * world_size  # tokens of one micro-step over all processes
    _check(tokens_per_step >= 1 and tokens_per_step % micro == 0,
           f"train.tokens_per_step={tokens_per_step} is not a multiple of train.batch_size x model.block_size x "
           f"processes = {batch_size} x {block_size} x {world_size} = {micro}: change train.batch_size (or "
           f"train.tokens_per_step, or null to use train.grad_accum_steps)")
    return tokens_per_step // micro
