"""Checkpoints, in one home: plain dicts written atomically and loaded with weights_only=True.

file: one checkpoint file (format 1); sharded: DCP directories of FSDP runs; manager: a run's resume and
saves; locate: which checkpoint an inference CLI means. Imports model/ and common/ only, so inference
reads checkpoints without the training package.
"""
from checkpoint.file import (FORMAT, VERSION, CheckpointError, capture_rng_state, clean_state_dict,  # noqa: F401
                             find_non_plain, link_checkpoint, load_checkpoint, load_model_weights,
                             model_from_checkpoint, remove_stale_temp_files, restore_rng_state, save_checkpoint)
