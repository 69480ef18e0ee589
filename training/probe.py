"""Probe snapshots during training: at each evaluation (and at step 0 with train.eval_at_start), what the model does
with one fixed text, its attention weights and logit lens, is recorded into RUN/probes/ (viz/probes.py's format),
so the explorer can show the heads form as the run trains. One forward of at most a context's tokens per evaluation.

The text is train.probe_text, or the first min(64, block_size) tokens of the validation split. A resumed run keeps
the snapshots up to its step and adds its own; rank 0 writes them (under FSDP every rank runs the forward, which
gathers the shards).
"""
from __future__ import annotations

import numpy as np
import torch

from model.lens import logit_lens, top_tokens
from viz import probes

PROBE_TOKENS = 64  # of the validation split, by default


def probe_ids(text: str | None, tokenizer, val, block_size: int) -> list[int]:
    """The probe's ids: `text` encoded (ValueError naming train.probe_text), else the validation split's first
    tokens (`val`: its TokenShards)."""
    if text is None:
        return val.windows(np.zeros(1, dtype=np.int64), min(PROBE_TOKENS, block_size))[0].tolist()
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:  # a char model: characters outside its vocabulary
        raise ValueError(f"train.probe_text={text!r} cannot be encoded: {e}") from None
    if len(ids) > block_size:
        raise ValueError(f"train.probe_text is {len(ids)} tokens, longer than model.block_size={block_size}: "
                         f"shorten it")
    return ids


class ProbeRecorder:
    """Records the probe at each evaluation the loop asks for (`record`): set up once per run (`start`)."""

    def __init__(self, run_dir, ids: list[int], vocab_size: int, writes: bool, runs: bool):
        self.run_dir, self.ids, self.vocab_size, self.writes, self.runs = run_dir, ids, vocab_size, writes, runs

    @classmethod
    def start(cls, run_dir, text: str | None, tokenizer, val, block_size: int, ranks, step: int, resumed: bool):
        """The run's recorder; rank 0 stores the probe and drops snapshots this run will record again. A probe
        other than the one the run's snapshots show is refused, so a series is always of one text."""
        ids = probe_ids(text, tokenizer, val, block_size)
        if ranks.is_main:
            old = probes.read_probe(run_dir)
            if resumed and old is not None and old["ids"] != ids:
                raise ValueError(f"train.probe_text={text!r} is not the text of this run's probe snapshots "
                                 f"({old['text'][:40]!r}): resume with that train.probe_text, or move "
                                 f"{probes.probe_dir(run_dir)} away to start a new series")
            probes.drop_after(run_dir, step if resumed else -1)
            probes.write_probe(run_dir, tokenizer.decode_bytes(ids).decode("utf-8", errors="replace"), ids)
        return cls(run_dir, ids, tokenizer.vocab_size, ranks.is_main, ranks.is_main or ranks.parallel == "fsdp")

    def record(self, model, step: int) -> None:
        """One forward of `model` (the unwrapped module) on the probe: its snapshot for `step`."""
        if not self.runs:
            return
        idx = torch.tensor([self.ids], device=next(model.parameters()).device)
        logits, attention = logit_lens(model, idx, attention=True)
        lens_probs, lens_ids = top_tokens(logits[:, 0], min(probes.TOP, self.vocab_size), self.vocab_size)
        if self.writes:
            probes.write_snapshot(self.run_dir, step, attention[:, 0], lens_probs, lens_ids)
