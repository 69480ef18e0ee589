"""The run configuration: structured-config dataclasses, their Hydra registration, and validation.

Design: one dataclass per config group (`model`, `data`, `optim`, `train`, `logger`) under a root
`Config`. The root is registered with Hydra's ConfigStore as `config_schema` and listed first in
`conf/config.yaml`'s defaults, so every YAML preset and every command-line override is merged onto a
typed schema: an unknown key (`train.max_iter=5`) or a wrong type (`train.batch_size=big`) fails when
Hydra composes the config, before any data is read or any step is taken.

The `data` node is the data package's own `data.config.DataConfig` (one definition, no copy).
`resume` and `compile` take more than one type (`false` / `true` / a path; `auto` / `true` / `false`),
which OmegaConf cannot express as a Union, so they are typed `Any` and checked here.

`to_dataclass(cfg)` is the edge: it turns a composed DictConfig (or a plain dict) into a `Config` of
plain dataclasses and runs `validate()`, which checks what types cannot (ranges, choices, cross-field
rules) and raises `ValueError` with a one-line message naming the key and the fix. Past this edge the
training loop never sees OmegaConf. This is the only module in training/ that imports OmegaConf.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.config import DataConfig

SCHEMA_NAME = "config_schema"

DEVICES = ("auto", "cpu", "cuda", "mps")  # "cuda:N" is also accepted
DTYPES = {  # accepted spellings -> canonical torch dtype name
    "auto": "auto",
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16",
}
SCHEDULES = ("cosine", "linear", "wsd", "constant")
OPTIMIZERS = ("adamw", "muon")
LOGGERS = (None, "wandb")
WANDB_MODES = ("online", "offline", "disabled")
PARALLEL_MODES = ("none", "ddp", "fsdp")  # (training/distributed.py has the same tuple; no torch import here)


@dataclass
class ModelConfig:
    """The transformer's shape (defaults: the `baby` preset, nanoGPT's shakespeare_char model)."""
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    block_size: int = 256
    dropout: float = 0.2
    bias: bool = False
    tie_weights: bool = True
    attention: str = "sdpa"  # sdpa | manual
    pad_vocab_to: int = 1  # round the vocabulary up to a multiple of this (64 for GPT-2: faster matmuls)


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3  # peak learning rate, reached after warmup
    min_lr: float = 1e-4  # floor of the decay
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
    max_iters: int = 5000  # optimizer steps
    batch_size: int = 64  # sequences per micro-batch (per process)
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    eval_interval: int = 250  # evaluate + checkpoint every this many steps (and at the end)
    eval_iters: int = 200  # batches per split in each evaluation
    eval_at_start: bool = True  # also evaluate the untrained model at step 0 (not on resume)
    log_interval: int = 10  # steps between train-loss readings (the only host syncs in the loop)
    seed: int = 1337
    resume: Any = False  # false | true (last.pt in the run dir) | path to a .pt file or run dir
    parallel: str = "none"  # none (DDP when launched by torchrun with >1 process) | ddp | fsdp


@dataclass
class LoggerConfig:
    name: Optional[str] = None  # null (metrics.jsonl only) | wandb
    project: str = "tinygpt"
    entity: Optional[str] = None
    mode: str = "online"  # online | offline | disabled  (the WANDB_MODE env var wins when set)
    run_name: Optional[str] = None


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


_SUBSCHEMAS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig,
               "logger": LoggerConfig}


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (idempotent). Imported lazily: Hydra is optional here."""
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name=SCHEMA_NAME, node=Config)


def to_container(cfg: Any) -> dict:
    """A DictConfig, dataclass or dict as a plain, resolved dict (what checkpoints and wandb store)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, dict):
        return OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)
    raise TypeError(f"expected a DictConfig, dataclass or dict, got {type(cfg).__name__}")


def one_line(exc: BaseException) -> str:
    """An OmegaConf/Hydra error message squeezed onto one line (their messages span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("full_key:", "object_type=", "reference_type=",
                                                         "Set the environment variable"))]
    return "; ".join(keep or lines) or type(exc).__name__


def to_dataclass(cfg: Any) -> Config:
    """Composed config (DictConfig, dict or Config) -> validated `Config` of plain dataclasses."""
    if isinstance(cfg, Config):
        validate(cfg)
        return cfg
    try:
        if isinstance(cfg, dict):
            cfg = OmegaConf.create(cfg)
        if not isinstance(cfg, DictConfig):
            raise ValueError(f"config must be a DictConfig or dict, got {type(cfg).__name__}")
        unknown = _unknown_keys(cfg, Config)
        if unknown:  # e.g. `+model.foo=1`: Hydra's + adds keys even to a typed node
            raise ValueError(f"unknown config key {unknown[0]!r}: remove it or check its spelling; "
                             f"python train.py --cfg job prints every key")
        cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)  # typed: unknown keys / bad types raise
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ValueError(f"invalid config: {one_line(e)}") from None
    validate(obj)
    return obj


def _unknown_keys(node: DictConfig, cls: type, prefix: str = "") -> list[str]:
    """Keys of `node` that the dataclass `cls` does not declare (recursively), as dotted paths."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for key in node.keys():
        if key not in fields:
            out.append(f"{prefix}{key}")
            continue
        ftype = fields[key].type
        sub = ftype if isinstance(ftype, type) else _SUBSCHEMAS.get(key)
        child = node._get_node(key)
        if sub is not None and dataclasses.is_dataclass(sub) and isinstance(child, DictConfig):
            out.extend(_unknown_keys(child, sub, f"{prefix}{key}."))
    return out


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def normalize_compile(value: Any) -> Any:
    """`train.compile` -> "auto" | True | False (accepts the strings true/false/on/off too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v in ("true", "on", "yes", "1"):
            return True
        if v in ("false", "off", "no", "0"):
            return False
    raise ValueError(f"train.compile={value!r} is not valid: use auto, true or false")


def validate(c: Config) -> None:
    """Range and cross-field checks the schema's types cannot express; ValueError with one line."""
    m, o, t, lg = c.model, c.optim, c.train, c.logger
    for name in ("n_layer", "n_head", "n_embd", "block_size"):
        v = getattr(m, name)
        _check(v >= 1, f"model.{name}={v} must be >= 1: give a positive whole number")
    _check(m.n_embd % m.n_head == 0,
           f"model.n_embd={m.n_embd} is not divisible by model.n_head={m.n_head}: choose n_embd as a multiple "
           f"of n_head (e.g. model.n_embd={max(m.n_head, round(m.n_embd / m.n_head) * m.n_head)})")
    _check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} is outside [0, 1): use e.g. model.dropout=0.1")
    _check(m.pad_vocab_to >= 1, f"model.pad_vocab_to={m.pad_vocab_to} must be >= 1: use 1 (no padding) or 64")

    _check(o.name in OPTIMIZERS, f"optim.name={o.name!r} is not known: use one of {', '.join(OPTIMIZERS)}")
    _check(_finite(o.lr) and o.lr > 0, f"optim.lr={o.lr} must be a positive number: e.g. optim.lr=1e-3")
    _check(_finite(o.min_lr) and o.min_lr >= 0, f"optim.min_lr={o.min_lr} must be >= 0: e.g. optim.min_lr=1e-4")
    _check(o.min_lr <= o.lr, f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}: set optim.min_lr to at most "
                             f"optim.lr (e.g. optim.min_lr={o.lr / 10:g})")
    _check(_finite(o.weight_decay) and o.weight_decay >= 0,
           f"optim.weight_decay={o.weight_decay} must be >= 0: e.g. optim.weight_decay=0.1")
    for name in ("beta1", "beta2"):
        v = getattr(o, name)
        _check(0.0 <= v < 1.0, f"optim.{name}={v} must be in [0, 1): e.g. optim.{name}=0.9")
    _check(o.warmup_iters >= 0, f"optim.warmup_iters={o.warmup_iters} must be >= 0: e.g. optim.warmup_iters=100")
    _check(o.decay_iters is None or o.decay_iters >= 1,
           f"optim.decay_iters={o.decay_iters} must be >= 1: or null to decay over train.max_iters")
    _check(_finite(o.grad_clip) and o.grad_clip >= 0,
           f"optim.grad_clip={o.grad_clip} must be >= 0: use 0 to disable clipping or e.g. optim.grad_clip=1.0")
    _check(_finite(o.muon_lr) and o.muon_lr > 0, f"optim.muon_lr={o.muon_lr} must be a positive number: e.g. "
                                                  f"optim.muon_lr=0.02")
    _check(0.0 <= o.muon_momentum < 1.0, f"optim.muon_momentum={o.muon_momentum} must be in [0, 1): e.g. 0.95")
    _check(o.muon_ns_steps >= 1, f"optim.muon_ns_steps={o.muon_ns_steps} must be >= 1: e.g. optim.muon_ns_steps=5")
    _check(_finite(o.cooldown_frac) and 0.0 <= o.cooldown_frac <= 1.0,
           f"optim.cooldown_frac={o.cooldown_frac} must be in [0, 1]: e.g. optim.cooldown_frac=0.2")
    _check(o.schedule in SCHEDULES, f"optim.schedule={o.schedule!r} is not known: use one of {', '.join(SCHEDULES)}")

    dev = t.device
    _check(dev in DEVICES or (dev.startswith("cuda:") and dev[5:].isdigit()),
           f"train.device={dev!r} is not valid: use auto, cpu, cuda, cuda:N or mps")
    _check(t.dtype in DTYPES, f"train.dtype={t.dtype!r} is not valid: use auto, float32, bfloat16 or float16")
    t.dtype = DTYPES[t.dtype]
    t.compile = normalize_compile(t.compile)
    for name in ("max_iters", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval"):
        v = getattr(t, name)
        _check(v >= 1, f"train.{name}={v} must be >= 1: give a positive whole number")
    _check(t.seed >= 0, f"train.seed={t.seed} must be >= 0: e.g. train.seed=1337")
    _check(t.parallel in PARALLEL_MODES,
           f"train.parallel={t.parallel!r} is not valid: use none (DDP under torchrun), ddp or fsdp")
    # Newton-Schulz needs whole matrices; FSDP holds only shards of them on each rank.
    _check(not (t.parallel == "fsdp" and o.name == "muon"),
           "optim=muon does not work with train.parallel=fsdp (Muon needs whole weight matrices): "
           "use optim=adamw with FSDP, or train.parallel=ddp with Muon")
    r = t.resume
    _check(isinstance(r, bool) or (isinstance(r, str) and r.strip() != ""),
           f"train.resume={r!r} is not valid: use false, true (last.pt in the run dir) or a checkpoint path")
    if isinstance(r, str) and r.strip().lower() in ("true", "false"):
        t.resume = r.strip().lower() == "true"

    c.data.validate()  # the data package's own checks (no I/O)

    _check(lg.name in LOGGERS, f"logger.name={lg.name!r} is not known: use logger=wandb, or logger.name=null")
    _check(lg.mode in WANDB_MODES, f"logger.mode={lg.mode!r} is not valid: use online, offline or disabled")
