"""The points where a run's edge acts on the training loop (training/loop.py), and what it is given
there.

`Hooks` is the plain one: it resumes nothing, saves nothing, prints nothing and never stops early,
so the loop runs from a test or a notebook as it is. A real run's (resume and random state, the
metrics window and progress bar, probes, the best checkpoint and early stop, HellaSwag, checkpoints,
the compile fallback, wandb, signals) is training/edge.py's `Edge`, which overrides these methods;
the loop calls them and knows nothing of what they do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from runtime.ranks import Ranks


@dataclass
class Run:
    """A run's parts, as the loop built them: what every hook may read (and a resume restores in
    place)."""
    config: Any  # training.config.Config
    data: Any  # data.prepare.Prepared: the token files and the tokenizer
    model: torch.nn.Module
    step_model: torch.nn.Module  # what the steps call: DDP(model), or the model itself
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    loader: Any  # data.loader.BatchLoader
    precision: Any  # training.precision.Precision
    state: Any  # training.state.TrainState
    ranks: Ranks
    lr_at: Callable[[int], float]
    token_bytes: Optional[torch.Tensor] = None  # each id's UTF-8 length, for bits per byte


class Hooks:
    """A run with nothing around it. `ranks`: this process's place in a job (one process here)."""

    ranks = Ranks()

    def start(self, run: Run) -> None:
        """The parts are built: resume, compile, say what is about to train."""

    def stop(self, run: Run) -> bool:
        """Stop before the next step? (a signal, early stopping)"""
        return False

    def guard(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call `fn(*args)`: a step ("train") or an evaluation ("eval"); the edge redoes a failed
        compile eagerly."""
        return fn(*args)

    def eval_stop(self) -> bool:
        """Stop an evaluation between its batches?"""
        return False

    def eval_progress(self, split: str) -> Optional[Callable[[int, int], None]]:
        """What an evaluation of `split` calls after each batch (done, total), or None."""
        return None

    def stepped(self, run: Run, metrics: dict[str, torch.Tensor]) -> None:
        """A step is done (`metrics`: its device tensors): log it now and then."""

    def evaluated(self, run: Run, stats: Optional[dict]) -> None:
        """An evaluation is done (`stats`: per split, "loss" and "bpb"; None: a stop cut it short):
        save."""

    def end(self, run: Run) -> Any:
        """The loop is over: what train() returns (here the run's state)."""
        return run.state
