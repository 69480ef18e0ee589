"""Training, read top to bottom as nanoGPT's train.py: build the data, the model and the optimizer,
then loop: the learning rate, the micro-steps (forward, backward), clipping and the optimizer step,
and now and then an evaluation and a save.

Everything around a run (resume, the progress bar, checkpoints, probes, signals, the compile
fallback) belongs to the `hooks` object, called at fixed points: training/hooks.py's plain one does
nothing, training/edge.py's is a real run's. Why it syncs once per log interval: docs/design.md.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import Any, Optional

import torch

from data.chat_loader import build_loader
from data.prepare import prepare
from model.gpt import GPT
from training.hooks import Hooks, Run
from training.optim import build_optimizer, schedule, set_lr
from training.precision import setup_precision
from training.state import TrainState, seed_all
from training.step import eval_stats, forward_backward, optimizer_step

log = logging.getLogger(__name__)


def train(config, hooks: Optional[Hooks] = None, device="cpu", source=None) -> Any:
    """Train `config` (training.config.Config) on `device`; `source`: a fine-tune's weights
    (training/init_from.py). Returns what `hooks.end` returns: the plain hooks the run's TrainState,
    a real run's hooks its TrainResult."""
    hooks = hooks or Hooks()
    ranks, train, device = hooks.ranks, config.train, torch.device(device)

    # data: the text tokenized once (cached by content), then (B, T) batches drawn by step and rank
    # (windows of the text; whole conversations for data=chat)
    with ranks.main_first():
        data = prepare(config.data, progress=ranks.is_main, log=log.info)
    if source is not None:
        source.check_tokenizer(data.tokenizer.to_dict())
    loader = build_loader(data, config.model.block_size, train.batch_size, seed=train.seed,
                          grad_accum_steps=train.grad_accum_steps, rank=ranks.rank,
                          world_size=ranks.world_size, device=device)

    # the model: new, or the fine-tune's source; the same weights on every rank, its own dropout
    seed_all(train.seed)
    model_config = config.model.with_vocab(data.tokenizer.vocab_size)
    model = GPT(model_config) if source is None else source.build(GPT, model_config, train.resume)
    model.to(device)
    if ranks.rank:
        torch.manual_seed(train.seed + ranks.rank)
    precision = setup_precision(device, train.dtype, ranks.parallel)
    # what the steps call: DDP(model), or the model itself (FSDP2 shards it in place)
    step_model = ranks.wrap_model(model, device, precision.dtype)

    # the optimizer, and the learning rate at each step (a function of the step: resumes exactly)
    optimizer = build_optimizer(model, config.optim, device.type)
    lr_at = schedule(config.optim, train.max_iters)
    batch_tokens = (train.batch_size * train.grad_accum_steps * ranks.world_size
                    * model_config.block_size)
    run = Run(config, data, model, step_model, optimizer, precision.grad_scaler(), loader,
              precision, TrainState(batch_tokens=batch_tokens), ranks, lr_at,
              data.token_bytes(device))
    # a resume restores the parts in place and moves state.step on
    hooks.start(run)

    state, grad_sync = run.state, partial(ranks.grad_sync, step_model)
    while state.step < train.max_iters and not hooks.stop(run):
        # the learning rate for this step
        set_lr(optimizer, lr_at(state.step))

        # forward and backward over the micro-batches (gradients all-reduced on the last one)
        metrics = hooks.guard("train", forward_backward, step_model, loader.next_batch, train,
                              precision.autocast, run.scaler, grad_sync)

        # clip the gradients, step, zero them
        metrics["grad_norm"] = optimizer_step(model, optimizer, config.optim, run.scaler)
        state.step += 1
        state.tokens += batch_tokens
        # the metrics stay device tensors: the hooks read them once per log interval
        hooks.stepped(run, metrics)

        # evaluate both splits every eval_interval steps and at the end; the hooks save checkpoints
        if state.step % train.eval_interval == 0 or state.step == train.max_iters:
            hooks.evaluated(run, hooks.guard("eval", evaluate, run, hooks))
    return hooks.end(run)


def evaluate(run: Run, hooks: Hooks) -> dict[str, dict]:
    """Mean loss and bits per byte of each split over train.eval_iters batches (shared by ranks)."""
    plan = run.ranks.eval_plan(run.config.train.eval_iters)
    return {split: eval_stats(run.step_model, partial(run.loader.eval_batch, split), plan,
                              stop=hooks.eval_stop, progress=hooks.eval_progress(split),
                              autocast=run.precision.autocast,
                              reduce_sum=run.ranks.all_reduce_sum, token_bytes=run.token_bytes)
            for split in ("train", "val")}
