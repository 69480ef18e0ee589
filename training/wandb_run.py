"""Weights & Biases logging, only when asked for (logger=wandb, rank 0); `import wandb` is slow, so
it is lazy.

WANDB_MODE overrides logger.mode (wandb's convention); a failure to start is one ValueError line.
The run id is kept in the checkpoint, so a resumed run continues the same wandb run.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.config import Config

log = logging.getLogger(__name__)


class WandbRun:
    run = None  # the wandb run, from start() to finish()

    @staticmethod
    def effective_mode(mode: str) -> str:
        env = os.environ.get("WANDB_MODE", "").strip().lower()
        env = {"dryrun": "offline"}.get(env, env)  # wandb's old name
        return env if env in ("online", "offline", "disabled") else mode

    def start(self, c: Config, run_dir: Path, run_id: str) -> None:
        mode = self.effective_mode(c.logger.mode)
        try:
            import wandb
        except ImportError:
            raise ValueError("logger=wandb needs the wandb package, which is not installed: pip "
                             "install wandb (or drop logger=wandb to log to train.log and "
                             "metrics.jsonl only)") from None
        if mode == "online" and not os.environ.get("WANDB_API_KEY"):
            try:
                has_key = bool(wandb.login(prompt=False, verify=False))
            except Exception:  # noqa: BLE001 - any failure here means: no usable key
                has_key = False
            if not has_key:
                raise ValueError("logger.mode=online needs a W&B API key and none was found "
                                 "(WANDB_API_KEY, `wandb login`): add logger.mode=offline to log "
                                 "locally and `wandb sync` later, or run `wandb login`")
        try:
            self.run = wandb.init(project=c.logger.project, entity=c.logger.entity, mode=mode,
                                  name=c.logger.run_name, config=dataclasses.asdict(c), id=run_id,
                                  resume="allow",
                                  dir=str(run_dir))
        # network/auth/usage errors from wandb: one line, not a traceback
        except Exception as e:  # noqa: BLE001
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"wandb could not start a {mode} run ({type(e).__name__}: {first}): "
                             "check the network and logger.project/logger.entity, or use "
                             "logger.mode=offline") from None
        log.info(f"wandb: {mode} run {run_id} (project {c.logger.project})")

    def log(self, data: dict, step: int) -> None:
        if self.run is not None:
            self.run.log(data, step=step)

    def finish(self, exit_code: int = 0) -> None:
        run, self.run = self.run, None  # finished once, even when finish() raises
        if run is not None:
            run.finish(exit_code=exit_code)
