"""Training: the loop and everything it needs, kept apart from the model and the data.

- `training.config`      structured-config dataclasses (the Hydra schema), `to_dataclass`, validation
- `training.loop`        `train(cfg, run_dir)`: the training loop (train.py is a thin Hydra wrapper)
- `training.optim`       AdamW parameter groups (or Muon, `training.muon`), the learning-rate schedule
- (checkpoints live in checkpoint/)
- `training.device`      device / dtype / autocast choice, the GPU peak-FLOP/s table for MFU
- `training.metrics`     metrics.jsonl, loss.png, FLOPs per token and MFU
- `training.console`     log lines above the tqdm progress bar
- `training.signals`     SIGINT/SIGTERM -> finish the step, save, exit 130/143
- `training.wandb_run`   optional Weights & Biases logging (wandb imported only when used)
- `training.distributed` torchrun: process groups, DDP / FSDP2, sharded checkpoints

Imports model/ and data/; OmegaConf only in training.config; Hydra only in train.py (the ConfigStore
registration in training.config.register_configs imports it lazily). Nothing is imported eagerly here,
so importing one module stays cheap.
"""
