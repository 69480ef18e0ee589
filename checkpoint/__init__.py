"""Checkpoints, in one home: plain dicts written atomically and loaded with weights_only=True.

file: one checkpoint file (which one a path or run directory means, format 1, save, load and check); manager: a
run's resume and saves; sharded: DCP directories of FSDP runs, imported only by runs that use them.
Imports model/ and common/ only. Nothing is imported here, and checkpoint.file imports torch only when it reads or
writes, so sample.py checks its arguments before torch loads.
"""
