"""Checkpoints: plain dicts written atomically and loaded with weights_only=True. file: one checkpoint file (which
one a path means, format 1, save, load, check); manager: a run's resume and saves; sharded: FSDP runs' DCP
directories. Imports model/ and common/ only; torch only when a file is read or written (sample.py checks first)."""
