"""Random state, in one home: derived seeds for (seed, split, step, rank, ...) tuples, seeding every generator,
and capturing/restoring them as plain containers (a checkpoint's "rng", loadable with weights_only=True).
torch is imported lazily: data preparation derives seeds without it."""
from __future__ import annotations

import hashlib
import random

import numpy as np


def seed_for(*parts) -> int:
    """A 63-bit seed from a hash of the parts; the same parts give the same seed on every machine."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def seed_all(seed: int) -> None:
    """Python's, numpy's and torch's generators from one seed: where every run starts."""
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def capture_rng_state() -> dict:
    """Every RNG that can influence training, as plain containers (weights_only-loadable)."""
    import torch
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }


def restore_rng_state(state: dict) -> None:
    import torch
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["bit_generator"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # a different GPU count restores what lines up (exactness is only promised on the same setup)
        for i, s in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)
