"""bench.py's sections: `inprocess` times tinygpt's code in this process (train, decode, prep), `commands` its
commands as a user runs them (quality, startup, sample). Here: what both use (torch is imported lazily)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from common.interrupt import on_stop

REPO = Path(__file__).resolve().parent.parent
PRESETS = ("tiny", "baby", "gpt2")
VOCAB = {"tiny": 65, "baby": 65, "gpt2": 50257}  # Tiny Shakespeare's characters; GPT-2 BPE (padded by the preset)
SHAKESPEARE_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def load_avg():
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def say(section: str, msg: str) -> None:
    print(f"[{section}] {msg} ...", file=sys.stderr, flush=True)


def run_child(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, **kw) (no capture_output: pass stdout/stderr), but a Ctrl-C that ends bench.py at once
    (common/interrupt.py) ends the child too: a `kill -INT` reaches bench.py alone."""
    with subprocess.Popen(cmd, **kw) as p, on_stop(p.kill):
        try:
            out, err = p.communicate()
        except BaseException:
            p.kill()
            raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def model_preset(name: str) -> dict:
    """conf/model/<name>.yaml as a plain dict (the single source of the preset sizes)."""
    from launch.config import preset
    return preset("model", name)


def gpt_config(name: str):
    """The GPTConfig of preset `name` with its vocabulary, padded as the preset says."""
    from model.config import GPTConfig
    return GPTConfig(**model_preset(name)).with_vocab(VOCAB[name])
