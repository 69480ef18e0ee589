"""Derived seeds: independent, reproducible random streams for (seed, split, step, rank, ...) tuples."""
from __future__ import annotations

import hashlib


def seed_for(*parts) -> int:
    """A 63-bit seed from a hash of the parts; the same parts give the same seed on every machine."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)
