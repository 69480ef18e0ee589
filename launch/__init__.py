"""The run's edge, above training/: Hydra composition, the command line's hints, sweeps and their report, the checks
before a run (the memory estimate) and the one-line failure. The only code that knows Hydra and OmegaConf."""
