"""What is written into a run directory before the run can check its checkpoint (Hydra's .hydra/*.yaml and
train.log, the run lock's record): train.py snapshots it before Hydra runs the job and puts it back unless the
run got as far as starting, so a refused resume leaves every file byte-identical (docs/faults.md).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from common.files import atomic_write
from common.run_lock import LOCK_NAME

LOG_NAME = "train.log"  # Hydra's job log (conf/hydra/job_logging): ${hydra.job.name}.log


class RecordSnapshot:
    """The bytes and times of `run_dir`'s .hydra/ files, train.log and .lock (absent ones noted), to put back."""

    def __init__(self, run_dir: str | os.PathLike, output_subdir: Optional[str] = ".hydra"):
        self.run_dir = Path(run_dir)
        hydra_dir = self.run_dir / output_subdir if output_subdir else None
        names = ("config.yaml", "hydra.yaml", "overrides.yaml")
        paths = [*(hydra_dir / n for n in names if hydra_dir), self.run_dir / LOG_NAME, self.run_dir / LOCK_NAME]
        self.files = {p: self._read(p) for p in paths}  # (the lock file: its record names this process)
        self.hydra_dir_existed = bool(hydra_dir and hydra_dir.is_dir())
        self.hydra_dir, self.pending = hydra_dir, True

    @staticmethod
    def _read(path: Path) -> Optional[tuple[bytes, int, int]]:
        try:
            st = path.stat()
            return path.read_bytes(), st.st_atime_ns, st.st_mtime_ns
        except FileNotFoundError:
            return None

    def keep(self) -> None:
        """The run started: what Hydra wrote stands."""
        self.pending = False

    def restore(self) -> None:
        """Put every file back as it was (those that were absent removed); train.log's handlers closed first."""
        if not self.pending:
            return
        self.pending = False
        root = logging.getLogger()
        for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            if Path(h.baseFilename).resolve() == (self.run_dir / LOG_NAME).resolve():
                root.removeHandler(h)
                h.close()
        for path, old in self.files.items():
            if old is None:
                path.unlink(missing_ok=True)
                continue
            now = self._read(path)
            if now is None or now[0] != old[0]:
                with atomic_write(path, "wb") as f:
                    f.write(old[0])
            if now != old:
                os.utime(path, ns=old[1:])
        if self.hydra_dir is not None and not self.hydra_dir_existed:
            try:
                self.hydra_dir.rmdir()
            except OSError:  # something else is in it now
                pass
