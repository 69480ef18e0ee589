"""Checkpoints, in one home: plain dicts written atomically and loaded with weights_only=True.

file: one checkpoint file (format 1: save, load and check); locate: which checkpoint a path, a run directory or
train.resume means, and the one reader; sharded: DCP directories of FSDP runs; manager: a run's resume and saves.
Imports model/ and common/ only. Nothing is imported here, so `checkpoint.locate` stays free of torch (sample.py
checks its arguments before torch loads).
"""
