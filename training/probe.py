"""Probe snapshots during training: the model's attention weights and logit lens on one fixed text
go into RUN/probes/ (viz/probes.py), so the explorer can show the heads form. They are taken at each
evaluation (with its val loss), and at step 0 and train.probe_steps steps spaced on a log scale
(with that step's train loss): the heads form in the first steps, often before a run's first
evaluation. The text: train.probe_text, or the validation split's first min(64, block_size) tokens.
A resumed run keeps the snapshots up to its step; every rank runs the forward (under FSDP it gathers
the shards), rank 0 writes. The schedule is a function of the config: a resumed run records the
steps a straight one does.
"""
from __future__ import annotations

import math

import numpy as np

from model.lens import top_of_lens
from viz import probes


def probe_steps(max_iters: int, n: int) -> frozenset[int]:
    """Step 0 and `n` steps spaced evenly on a log scale from 1 to `max_iters` (fewer where two
    round to one step): 0, 1, 2, 4, 9, 19, 41, 86, 180 for n = 8 over 180 steps; none for n = 0."""
    if n <= 0:
        return frozenset()
    return frozenset({0, *(round(max_iters ** (i / (n - 1) if n > 1 else 1.0)) for i in range(n))})


def probe_ids(text: str | None, tokenizer, val, block_size: int) -> list[int]:
    """`text` encoded (ValueError naming train.probe_text), else the first tokens of `val`
    (TokenShards)."""
    if text is None:
        return val.windows(np.zeros(1, dtype=np.int64), min(64, block_size))[0].tolist()
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:  # a char model: characters outside its vocabulary
        raise ValueError(f"train.probe_text={text!r} cannot be encoded: {e}") from None
    if len(ids) > block_size:
        raise ValueError(f"train.probe_text is {len(ids)} tokens, over "
                         f"model.block_size={block_size}: shorten it")
    return ids


class ProbeRecorder:
    def __init__(self, run_dir, text: str, ids: list[int], vocab_size: int, writes: bool,
                 steps: frozenset[int] = frozenset()):
        self.run_dir, self.text, self.ids = run_dir, text, ids
        self.vocab_size, self.writes = vocab_size, writes
        self.steps = steps  # recorded besides the evaluations (probe_steps)

    @classmethod
    def start(cls, run_dir, text: str | None, tokenizer, val, block_size: int, ranks, step: int,
              resumed: bool,
              steps: frozenset[int] = frozenset()):
        """The run's recorder; rank 0 drops the snapshots this run records again. A resumed run's
        probe must be its snapshots' (a series is of one text): refused before anything changes."""
        ids = probe_ids(text, tokenizer, val, block_size)
        # (every rank: every rank refuses)
        kept = [s for s in probes.steps(run_dir) if resumed and s <= step]
        if kept and (old := probes.read_snapshot(run_dir, kept[0], tensors=False))["ids"] != ids:
            given = (f"train.probe_text={text!r}" if text is not None
                     else "the default probe text (the val split's)")
            raise ValueError(f"{given} is not the text of this run's probe snapshots "
                             f"({old['text'][:40]!r}): resume with that train.probe_text, or move "
                             f"{probes.probe_dir(run_dir)} away to start a new series")
        if ranks.is_main:
            probes.drop_after(run_dir, step if resumed else -1)
        return cls(run_dir, tokenizer.decode_bytes(ids).decode("utf-8", errors="replace"), ids,
                   tokenizer.vocab_size,
                   writes=ranks.is_main, steps=steps)

    def record(self, model, step: int, val_loss: float | None = None,
               train_loss: float | None = None) -> None:
        """One forward of `model` (unwrapped) on the probe, on every rank; rank 0 writes the
        snapshot of `step`, with the evaluation's val loss or else the step's train loss (neither at
        step 0 without an evaluation). A model that computes NaN or infinity (a diverging run, which
        its next log line stops) is not recorded."""
        probs, ids, attention = top_of_lens(model, self.ids, min(probes.TOP, self.vocab_size),
                                            self.vocab_size,
                                            attention=True)
        finite = all(x is None or math.isfinite(x) for x in (val_loss, train_loss))
        finite = finite and bool(probs.isfinite().all()) and bool(attention.isfinite().all())
        if self.writes and finite:
            probes.write_snapshot(self.run_dir, step, text=self.text, ids=self.ids,
                                  val_loss=val_loss,
                                  train_loss=train_loss, attention=attention, lens_probs=probs,
                                  lens_ids=ids)
