"""checkpoint/meta.py: a sharded checkpoint's metadata as strict JSON (no pickle), read back exactly; and the
torch.save form older sharded checkpoints hold, still read."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from checkpoint import file as ck
from checkpoint import sharded as S
from checkpoint.meta import read_meta, write_meta
from runtime.ranks import Ranks
from tests.helpers import tiny_model_and_opt
from training.state import capture_rng_state, restore_rng_state


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_round_trip_is_exact_and_strict_json(tmp_path):
    meta = {"format": "tinygpt", "step": 3, "best_val_loss": math.inf, "low": -math.inf, "none": None,
            "rng": capture_rng_state(), "ranks": [{"t": torch.arange(5, dtype=torch.int64)}],
            "scalar": torch.tensor(2.5), "half": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            "flags": torch.tensor([True, False]), "grid": torch.arange(6, dtype=torch.int32).reshape(2, 3)}
    path = write_meta(meta, tmp_path / ck.DCP_META)
    text = path.read_text()
    _strict(text)  # Infinity/NaN spelt out: any JSON reader takes it
    back = read_meta(path)
    assert back["best_val_loss"] == math.inf and back["low"] == -math.inf and back["none"] is None
    for key in ("scalar", "half", "flags", "grid"):
        assert back[key].dtype == meta[key].dtype and torch.equal(back[key], meta[key]), key
    assert torch.equal(back["ranks"][0]["t"], meta["ranks"][0]["t"])
    assert torch.equal(back["rng"]["torch"], meta["rng"]["torch"])
    restore_rng_state(back["rng"])  # the generators continue where they were captured
    after = (torch.rand(3), random.random())
    restore_rng_state(meta["rng"])
    assert torch.equal(after[0], torch.rand(3)) and after[1] == random.random()


@pytest.mark.parametrize("text, why", [("{not json", "not the JSON tinygpt writes"),
                                       ('{"t": {"__tensor__": {"dtype": "object", "shape": [1], "data": ""}}}',
                                        "unknown tensor dtype 'object'"),
                                       ('{"t": {"__tensor__": {"dtype": "int64", "shape": [3], "data": "AAAA"}}}',
                                        "not the JSON tinygpt writes")])
def test_a_damaged_file_is_one_line(tmp_path, text, why):
    path = tmp_path / ck.DCP_META
    path.write_text(text)
    with pytest.raises(ck.CheckpointError, match="is truncated or corrupt") as e:
        ck.load_checkpoint(path)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_sharded_checkpoint_keeps_its_metadata_as_json_and_old_ones_still_read(tmp_path):
    m, opt = tiny_model_and_opt()
    meta = {"format": ck.FORMAT, "version": ck.VERSION, "model": None, "optimizer": None, "step": 2,
            "model_config": m.config.to_dict(), "rng": capture_rng_state(), "best_val_loss": math.inf}
    d = tmp_path / S.LAST_DCP
    S.save_sharded(d, m, opt, meta, ranks=Ranks())
    assert (d / ck.DCP_META).is_file() and not (d / ck.OLD_DCP_META).exists()
    assert _strict((d / ck.DCP_META).read_text())["step"] == 2
    got = ck.read_checkpoint(d)[1]
    assert got["best_val_loss"] == math.inf and torch.equal(got["rng"]["torch"], meta["rng"]["torch"])

    (d / ck.DCP_META).unlink()  # a sharded checkpoint written before: torch.save metadata
    ck.save_checkpoint(meta, d / ck.OLD_DCP_META)
    assert ck.is_sharded_checkpoint(d) and ck.read_checkpoint(d)[1]["step"] == 2
    (d / ck.OLD_DCP_META).unlink()
    assert not ck.is_sharded_checkpoint(d)
