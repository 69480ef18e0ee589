"""Batches of whole conversations (`ChatLoader`) and `build_loader`, the one choice of loader for
prepared data.

A row starts at a conversation's first token and packs the conversations after it while they fit
whole, then pads: every answer sees its whole prompt (a random window could cut it off), and short
conversations do not waste a row each (packing, not one conversation a row). Targets are -1 (ignored
by the loss) on system and user tokens, on the padding and on a conversation longer than the context
past its cut; an answer's tokens and its end-of-turn token are learnt. The interface is
`BatchLoader`'s (next_batch, eval_batch, state_dict, load_state_dict), and batches depend only on
(seed, global step) the same way, so resuming and ranks need nothing new.
"""
from __future__ import annotations

import logging

import numpy as np

from common.rng import seed_for
from data.loader import BatchLoader, Prepared, TokenFile, _positive_int

log = logging.getLogger(__name__)


def build_loader(prepared: Prepared, block_size: int, batch_size: int, **kw):
    """The loader for `prepared`: conversations (data=chat) -> ChatLoader, token windows ->
    BatchLoader. `kw`: seed, grad_accum_steps, rank, world_size, device, as BatchLoader takes them.
    """
    if prepared.meta.get("format") == "tinygpt-chat":
        return ChatLoader(prepared, block_size, batch_size, **kw)
    return BatchLoader(*prepared.token_files(), block_size, batch_size, **kw)


def targets(next_ids, learnt):
    """The targets of a row: the next ids where they are learnt (an answer's tokens), else -1
    (ignored)."""
    return next_ids.masked_fill(learnt == 0, -1)


class ChatSplit:
    """A split's ids, loss mask and conversation starts; `row(i, n)`: n ids and their mask from
    conversation i on."""

    def __init__(self, prepared: Prepared, split: str):
        d = prepared.dir
        self.ids = TokenFile(d / f"{split}.bin").tokens
        self.mask = TokenFile(d / f"{split}-mask.bin").tokens
        self.starts = np.asarray(TokenFile(d / f"{split}-starts.bin").tokens, dtype=np.int64)
        self.count = len(self.starts) - 1

    def longer_than(self, n: int) -> int:
        return int((np.diff(self.starts) > n).sum())

    def row(self, i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Conversations i, i+1, ... that fit whole in n tokens (the first cut to n if it alone is
        longer), padded."""
        lo = self.starts[i]
        # the last start whose conversations before it all fit
        j = int(np.searchsorted(self.starts, lo + n, side="right")) - 1
        hi = self.starts[j] if j > i else min(lo + n, self.starts[-1])
        ids, mask = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        ids[:hi - lo], mask[:hi - lo] = self.ids[lo:hi], self.mask[lo:hi]
        return ids, mask


class ChatLoader:
    """BatchLoader's interface over prepared conversations: rows drawn by (seed, global step),
    resumable."""

    def __init__(self, prepared: Prepared, block_size: int, batch_size: int, *, seed: int,
                 grad_accum_steps: int = 1, rank: int = 0, world_size: int = 1, device="cpu"):
        import torch
        self.block_size = _positive_int("block_size", block_size)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.grad_accum_steps = _positive_int("grad_accum_steps", grad_accum_steps)
        self.world_size = _positive_int("world_size", world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank!r} must be in 0..{world_size - 1} for "
                             f"world_size={world_size}")
        self.rank, self.seed, self.device = int(rank), int(seed), torch.device(device)
        self.global_batch = self.batch_size * self.grad_accum_steps * self.world_size
        self.splits = {split: ChatSplit(prepared, split) for split in ("train", "val")}
        if cut := self.splits["train"].longer_than(self.block_size + 1):
            log.warning(f"{cut:,} of {self.splits['train'].count:,} train conversations are longer "
                        f"than the context (model.block_size={self.block_size}): each is cut "
                        "there, and what is past the cut is not learnt")
        self.step, self.micro = 0, 0

    state_dict = BatchLoader.state_dict
    load_state_dict = BatchLoader.load_state_dict

    def _draw(self, split: str, n: int, *key) -> np.ndarray:
        import torch
        g = torch.Generator()
        g.manual_seed(seed_for(self.seed, *key))
        return torch.randint(self.splits[split].count, (n,), generator=g).numpy()

    def next_batch(self):
        """(x, y) for this rank's current micro-step, then advance (micro, then step)."""
        first = self._draw("train", self.global_batch, "train", self.step)
        start = (self.micro * self.world_size + self.rank) * self.batch_size
        self.micro += 1
        if self.micro == self.grad_accum_steps:
            self.micro, self.step = 0, self.step + 1
        return self._rows("train", first[start:start + self.batch_size])

    def eval_batch(self, split: str, i: int):
        """The i-th evaluation batch of `split` ("train" or "val"): always the same rows."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}: use 'train' or 'val'")
        return self._rows(split, self._draw(split, self.batch_size, "eval", split, int(i)))

    def _rows(self, split: str, first: np.ndarray):
        import torch
        rows = [self.splits[split].row(int(i), self.block_size + 1) for i in first]
        ids = torch.from_numpy(np.stack([r[0] for r in rows]))
        learnt = torch.from_numpy(np.stack([r[1] for r in rows]))
        x, y = ids[:, :-1], targets(ids[:, 1:], learnt[:, 1:])
        if self.device.type != "cpu":
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x.contiguous(), y.contiguous()
