"""Checkpoints, in one home: plain dicts written atomically and loaded with weights_only=True.

file: one checkpoint file (format 1); sharded: DCP directories of FSDP runs; manager: a run's resume and
saves; locate: which checkpoint an inference CLI means. Imports model/ and common/ only, so inference
reads checkpoints without the training package. Nothing is imported here, so `checkpoint.locate` stays
free of torch (sample.py checks its arguments before torch loads).
"""
