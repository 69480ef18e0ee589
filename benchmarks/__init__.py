"""bench.py's sections: `inprocess` times tinygpt's code in this process (train, decode, prep), `commands` its
commands as a user runs them (quality, startup, sample), `gpu_check` the GPU call. Here: what they share (torch is
imported lazily), e.g. `follow`, a command run while its log is watched."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
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


def overhead(runs: list[float], floor: list[float]) -> dict:
    """What `runs` add to `floor` (seconds of repeated runs of each), as far as their noise can
    tell: the medians' `difference_s` (signed), `noise_s` (half of each series' range, added: how
    far a median can move), and `overhead_s`, the difference where it is above the noise, else 0
    (never negative: a command that comes out below its floor has no overhead to show); `verdict`:
    "above noise", "within noise" or "below the floor"."""
    import statistics
    diff = statistics.median(runs) - statistics.median(floor)
    noise = (max(runs) - min(runs) + max(floor) - min(floor)) / 2
    verdict = ("above noise" if diff > noise else "within noise" if diff >= -noise
               else "below the floor")
    return {"overhead_s": round(diff if diff > noise else 0.0, 3), "difference_s": round(diff, 3),
            "noise_s": round(noise, 3), "verdict": verdict}


def describe_overhead(o: dict) -> str:
    """`overhead`'s result in words: never a negative overhead."""
    if o["verdict"] == "above noise":
        return f"{o['overhead_s']:.2f} s (noise ±{o['noise_s']:.2f} s)"
    if o["verdict"] == "within noise":
        return f"within noise (difference {o['difference_s']:+.2f} s, noise ±{o['noise_s']:.2f} s)"
    return f"none: {-o['difference_s']:.2f} s below the floor (noise ±{o['noise_s']:.2f} s)"


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


def follow(cmd: list[str], cwd: Path, env: dict, seen, stop=lambda found: False, limit: float = 600.0) -> dict:
    """Run cmd; every `poll`, seen(log text) -> {name: value} of what has appeared so far, each stamped with the
    seconds from launch at which it first appeared; stop(found) ends the run early."""
    log, found, t0 = cwd / f"log-{time.time_ns()}.txt", {}, time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while True:
                done, now = proc.poll() is not None, time.perf_counter() - t0
                for name, value in seen(log.read_text(errors="replace")).items():
                    found.setdefault(name, (value, round(now, 2)))
                if done or stop(found) or now > limit:
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return {"found": found, "wall_s": round(time.perf_counter() - t0, 2), "returncode": proc.returncode,
            "tail": tail, "log": log.read_text(errors="replace")}
