"""Training: the loop and everything it needs, kept apart from the model, the data and the checkpoints.

loop (train), step (train_step, eval_stats), state (the Stateful counters, loss window, RNGs), config (the
Hydra schema), optim + muon, device, distributed (torchrun, DDP/FSDP2), metrics, console, signals,
wandb_run. Checkpoints live in checkpoint/. Nothing is imported eagerly here: importing one module stays cheap.
"""
