"""Checkpoints, in one home: plain dicts written atomically and loaded with weights_only=True.

`checkpoint.file` is the single-file format (save, load, link, model rebuild, RNG state). Imports model/
and common/ only, so inference (sample.py) can load a checkpoint without the training package.
"""
from checkpoint.file import (FORMAT, VERSION, CheckpointError, capture_rng_state, clean_state_dict,  # noqa: F401
                             find_non_plain, link_checkpoint, load_checkpoint, load_model_weights,
                             model_from_checkpoint, remove_stale_temp_files, restore_rng_state, save_checkpoint)
