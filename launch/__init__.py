"""The process around a training run: the Hydra edge (overrides, sweeps, the run directory's record), the console
and its signals, device and process-group setup, the memory check and trackers (wandb). training/ holds the run
itself; a run imports from here only what it uses (no process group without torchrun, no wandb without it)."""
