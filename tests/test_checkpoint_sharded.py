"""checkpoint/sharded.py: DCP save/load without a process group, recovery of an interrupted directory swap,
and the offline export (`python export.py --pt`)."""
from __future__ import annotations

import os

import export
from checkpoint import file as ck
from checkpoint import sharded as S
from checkpoint.file import model_from_checkpoint, read_checkpoint
from runtime.ranks import Ranks
from tests.helpers import find_non_plain, tiny_model_and_opt, train_steps


def test_sharded_checkpoint_round_trip_and_export(tmp_path, capsys):
    """DCP save/load without a process group, and the offline export CLI."""
    m, opt = tiny_model_and_opt()
    train_steps(m, opt, 2, seed=1)
    meta = {"format": ck.FORMAT, "version": ck.VERSION, "model": None, "optimizer": None, "step": 2,
            "model_config": m.config.to_dict(), "config": {"optim": {"lr": 1e-2}}, "sharded": True}
    run = tmp_path / "run"
    S.save_sharded(run / S.LAST_DCP, m, opt, meta, ranks=Ranks(), best_path=run / S.BEST_DCP)
    assert S.is_sharded_checkpoint(run / S.LAST_DCP) and S.is_sharded_checkpoint(run / S.BEST_DCP)
    assert read_checkpoint(run / S.LAST_DCP) == (run / S.LAST_DCP, meta)
    expected = train_steps(m, opt, 2, seed=2)

    m2, opt2 = tiny_model_and_opt(seed=9)
    S.load_sharded(run / S.LAST_DCP, m2, opt2)
    assert train_steps(m2, opt2, 2, seed=2) == expected  # model and optimizer state: bitwise

    # python export.py --pt
    assert export.main(["--pt", str(run / S.BEST_DCP), "-o", str(tmp_path / "f.pt")]) == 0
    full = ck.load_checkpoint(tmp_path / "f.pt")
    assert full["step"] == 2 and full["optimizer"] is not None and find_non_plain(full) is None
    m3 = model_from_checkpoint(full).train()  # what sample.py does
    from training.config import OptimConfig
    from training.optim import build_optimizer
    opt3 = build_optimizer(m3, OptimConfig(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.99), "cpu")
    opt3.load_state_dict(full["optimizer"])
    assert train_steps(m3, opt3, 2, seed=2) == expected
    capsys.readouterr()
    ddp_run = tmp_path / "ddp"  # a run without sharded checkpoints: its last.pt is already one file
    ddp_run.mkdir()
    (ddp_run / "last.pt").write_bytes((tmp_path / "f.pt").read_bytes())
    for src, why in ((tmp_path, "is not a sharded tinygpt checkpoint"), (tmp_path / "nope", "does not exist"),
                     (ddp_run, "has no last_dcp/, so there is nothing to export"),
                     (ddp_run / "last.pt", "is a file, but export reads a sharded checkpoint directory")):
        assert export.main(["--pt", str(src)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {src} {why}") and err.count("\n") == 1, err
        assert "last_dcp/" in err and "or a last.pt" not in err

    S.recover_sharded(run)  # nothing to recover: leaves the checkpoint alone
    os.rename(run / S.LAST_DCP, run / f".{S.LAST_DCP}.old")  # a kill between the two renames of a swap
    S.recover_sharded(run)
    assert S.is_sharded_checkpoint(run / S.LAST_DCP)
