"""common.interrupt: a Ctrl-C at any moment of any entry point ends it with exit 130, no traceback, nothing
half-written, and never a run that goes on (issue 39: a handler that raised was swallowed by a library's `except:`
around an import, or left a half-imported numpy behind). The slow test sends SIGINT to every entry point a few
dozen times over its start-up, and a few more times once its work is under way. Each child starts with SIGINT
ignored and is signalled only once its own handler is in (/proc/PID/status); it is stopped (SIGSTOP) first, so
whether it had already finished is known, not guessed: every try must hold, however fast or busy the machine."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import interrupt
from tests.helpers import REPO


class Exited(Exception):
    pass


@pytest.fixture
def stops(monkeypatch):
    """os._exit raises Exited(code); what a stop writes is collected as (fd, text)."""
    written = []

    def exit_(code):
        raise Exited(code)
    monkeypatch.setattr(interrupt.os, "_exit", exit_)
    monkeypatch.setattr(interrupt, "_write", lambda fd, text: written.append((fd, text)))
    for name, value in (("_stopping", False), ("_pending", None), ("_depth", 0), ("_lines", {}), ("_undo", {})):
        monkeypatch.setattr(interrupt, name, value)
    return written


def test_a_ctrl_c_undoes_what_is_half_done_ends_the_line_and_exits_130(stops):
    calls = []
    with interrupt.on_stop(lambda: calls.append("kept")):
        pass
    with interrupt.on_stop(lambda: calls.append("temp removed")), interrupt.on_stop(lambda: 1 / 0):
        with pytest.raises(Exited) as e:
            interrupt._on_signal(signal.SIGINT, None)
    assert e.value.args == (130,) and calls == ["temp removed"] and stops == [(1, "\n")]
    assert interrupt._undo == {}  # (each block took its own back)


def test_a_ctrl_c_waits_for_a_held_block_and_a_second_one_does_not(stops):
    done = []
    with pytest.raises(Exited) as e:
        with interrupt.held():
            interrupt._on_signal(signal.SIGINT, None)  # waits
            done.append("swapped")
    assert done == ["swapped"] and e.value.args == (130,)
    interrupt._pending, interrupt._stopping = None, False
    with pytest.raises(Exited), interrupt.held():
        interrupt._on_signal(signal.SIGINT, None)
        interrupt._on_signal(signal.SIGINT, None)
        done.append("never")
    assert done == ["swapped"]


def test_sigterm_says_its_line_and_exits_143(stops):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupt.stop_quietly("stopped before step 1")
        assert signal.getsignal(signal.SIGINT) is signal.getsignal(signal.SIGTERM) is interrupt._on_signal
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    with pytest.raises(Exited) as e:
        interrupt._on_signal(signal.SIGTERM, None)
    assert e.value.args == (143,) and stops == [(2, "stopped before step 1\n")]


# ------------------------------------------------------------------------------------- every entry point
PYTHON = os.stat(sys.executable)


def _caught(pid: int) -> bool:
    """Whether process `pid` is Python (past the `sh` that starts it: dash run with -c catches SIGINT until its
    `trap`, and took a Ctrl-C meant for Python's handler) and has a handler for SIGINT (its own: it started with
    SIGINT ignored)."""
    try:
        exe = os.stat(f"/proc/{pid}/exe")
    except OSError:  # ended
        return False
    if (exe.st_dev, exe.st_ino) != (PYTHON.st_dev, PYTHON.st_ino):
        return False
    with open(f"/proc/{pid}/status") as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


def _threads(pid: int) -> str:
    """Each thread's state, wait channel and signal masks, for the message of a lost Ctrl-C."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with contextlib.suppress(OSError):
            fields = dict(ln.split(":", 1) for ln in (task / "status").read_text().splitlines() if ":" in ln)
            wchan = (task / "wchan").read_text() if (task / "wchan").exists() else "?"
            out.append(f"{task.name} {fields['State'].strip()} {wchan} pnd={fields['SigPnd'].strip()} "
                       f"shd={fields['ShdPnd'].strip()} blk={fields['SigBlk'].strip()} cgt={fields['SigCgt'].strip()}")
    return "; ".join(out)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _wait_for(proc, ready, what: str) -> bool:
    """Poll ready() until true (True) or the process ends (False)."""
    t0 = time.perf_counter()
    while not ready():
        if proc.poll() is not None:
            return False
        assert time.perf_counter() - t0 < 120, f"no {what} after 120 s"
        time.sleep(0.001)
    return True


def _ctrl_c(argv: list[str], cwd: Path, delay: float, marker=None, finished=None, env=None):
    """Start `python argv` in `cwd`; `delay` s after its handler is in (and after marker(), if given) stop it and
    send SIGINT: (exit status, stdout, stderr); status None when it had ended, or finished() its work, before."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(cwd / "stdout", "wb+") as out, open(cwd / "stderr", "wb+") as err:
        proc = subprocess.Popen(["sh", "-c", 'trap "" INT; exec "$0" "$@"', sys.executable, *argv], cwd=cwd,
                                env=env, stdout=out, stderr=err)
        try:
            status = None
            if _wait_for(proc, lambda: _caught(proc.pid), "SIGINT handler") and \
                    (marker is None or _wait_for(proc, marker, "marker")):
                time.sleep(delay)
                os.kill(proc.pid, signal.SIGSTOP)
                while (state := _state(proc.pid)) not in ("T", "Z", "gone"):
                    time.sleep(0.0002)
                if state == "T":  # stopped before it ended: the Ctrl-C must end it
                    done = finished is not None and finished()
                    os.kill(proc.pid, signal.SIGINT)
                    os.kill(proc.pid, signal.SIGCONT)
                    try:
                        status = proc.wait(timeout=90)  # a lost Ctrl-C: it runs on, and this fails
                    except subprocess.TimeoutExpired:
                        raise AssertionError(f"a Ctrl-C was lost ({argv}, {delay} s in): {_threads(proc.pid)}")
                    status = None if done and status == 0 else status  # (done first: exit 0 is right)
            assert status is not None or proc.wait(timeout=90) == 0, (argv, delay, proc.returncode)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return status, out.read().decode("utf-8"), err.read().decode("utf-8")  # (split UTF-8: an error)


def _has(path: Path, text: str):
    return lambda: path.is_file() and text in path.read_text(errors="replace")


def _entry_points(run: Path, text: Path) -> dict:
    """name: (argv, start-up window s, [(marker(cwd), [delays after it])], stderr lines it prints anyway,
    done(cwd): its work is complete, so a Ctrl-C that comes after it (while Python exits) may find exit 0)."""
    out, err, using = lambda cwd: cwd / "stdout", lambda cwd: cwd / "stderr", r"using .*best\.pt"
    tiny = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
            "model.block_size=16", "train.batch_size=4", "train.eval_iters=2", "train.max_iters=1000000",
            "train.eval_interval=1000000", "data=text", f"data.path={text}", "hydra.run.dir=run"]
    return {
        "sample.py": (["sample.py", "--run", str(run), "--max-new-tokens", "1000000"], 1.0,
                      [(lambda cwd: out(cwd).stat().st_size > 0, [0.02])], [using], lambda cwd: False),
        "eval.py": (["eval.py", "--run", str(run), "--file", str(text)], 1.0,
                    [(lambda cwd: _has(err(cwd), "using")(), [0.3])], [using], lambda cwd: _has(out(cwd), "loss")()),
        "export.py": (["export.py", "--hf", "hf", "--run", str(run)], 1.0,
                      [(lambda cwd: any(cwd.glob(".hf.tmp-*")), [0, 0.002])], [using],
                      lambda cwd: (cwd / "hf").exists()),
        "explore.py": (["explore.py", "--run", str(run), "--port", "0"], 1.0,
                       [(lambda cwd: _has(out(cwd), "explorer:")(), [0])], [using], lambda cwd: False),
        "train.py": (["train.py", *tiny], 1.0, [(lambda cwd: (cwd / "run" / ".lock").exists(), [0]),
                                               (lambda cwd: (cwd / "run" / ".hydra").is_dir(), [0, 0.05])], [],
                      lambda cwd: False),
        "bench.py": (["bench.py", "--quick", "--only", "train", "--presets", "tiny", "--out", "bench.json"], 1.0,
                     [(lambda cwd: _has(err(cwd), "[train]")(), [0.3])],
                     [r"\[train\] .*", r"warning: the machine is busy.*"], lambda cwd: (cwd / "bench.json").exists()),
        "data.prepare": (["-m", "data.prepare", "--data", "text", "--path", str(text), "--tokenizer", "bpe",
                          "--vocab-size", "300", "--quiet"], 0.6,
                         [(lambda cwd: (cwd / "cache" / "prepared").is_dir(), [0, 0.3])],
                         [re.escape("error: interrupted (finished shards are kept: run the same command again to "
                                    "continue)")],
                         lambda cwd: any((cwd / "cache" / "prepared").glob("[!.]*/meta.json"))),
        "data.bpe": (["-m", "data.bpe", "--path", str(text), "--vocab-size", "300"], 0.6,
                     [(lambda cwd: _has(err(cwd), "training a")(), [0, 0.2])], [r"train(ing|ed) a .*BPE.*"],
                     lambda cwd: _has(err(cwd), "trained a")()),
    }


def _check(name: str, cwd: Path, status: int, out: str, err: str, allowed: list[str]) -> None:
    """What every Ctrl-C must leave: exit 130, stderr only the lines the command prints anyway (or its documented
    line), the half-printed line ended, no temp file, no half export, a run's checkpoint with its resume line."""
    assert status in (130, -signal.SIGINT), (name, status, err[-3000:])  # -2: as Python exits (docs/faults.md)
    assert all(any(re.fullmatch(a, line) for a in allowed) for line in err.splitlines()), (name, err[-3000:])
    assert "Traceback" not in out and (out.endswith("\n") or status < 0), (name, out[-3000:])
    left = [p for p in cwd.rglob("*") if p.name.endswith(".tmp") or re.match(r"\.hf\.(tmp|old)-", p.name)]
    assert not left, (name, left)
    if (cwd / "hf").exists():  # renamed into place before the Ctrl-C was seen (`held`): whole
        assert {"config.json", "model.safetensors"} <= {p.name for p in (cwd / "hf").iterdir()}
    assert all((d / "meta.json").is_file() for d in (cwd / "cache" / "prepared").glob("[!.]*"))
    if (cwd / "run" / "last.pt").exists():
        assert re.search(r"(stopped by SIGINT after step \d+: saved|interrupted;).*resume with: ", out), out[-3000:]


@pytest.fixture
def trained_run(tmp_path, tiny_corpus) -> tuple[Path, Path]:
    """A run with a tiny model's best.pt, and 1 MB of text (seconds of scoring, preparing, sampling)."""
    from data.tokenizer import CharTokenizer
    from tests.helpers import save_run, tiny_model
    text = tmp_path / "input.txt"
    text.write_text(tiny_corpus.read_text() * 50)
    tok = CharTokenizer(tiny_corpus.read_text())
    save_run(tmp_path / "run", tiny_model(tok.vocab_size, n_layer=3, block_size=32), tok)
    return tmp_path / "run", text


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc to see the child's handler")
@pytest.mark.parametrize("name", ["sample.py", "eval.py", "export.py", "explore.py", "train.py", "bench.py",
                                  "data.prepare", "data.bpe"])
def test_ctrl_c_at_any_moment_of_an_entry_point_stops_it(name, trained_run, tmp_path):
    """24 tries over the start-up window (imports, checks, loading: finer early), each entry point's offset apart,
    then a few once its work is under way (streaming, scoring, writing the export, the loop's handover)."""
    entry_points = _entry_points(*trained_run)
    argv, window, late, allowed, done = entry_points[name]
    argv = [str(REPO / argv[0]) if argv[0].endswith(".py") else argv[0], *argv[1:]]
    offset = (list(entry_points).index(name) * 0.618) % 1  # the entry points' tries interleave
    tries = [(window * ((i + offset) / 24) ** 2, None) for i in range(24)]
    tries += [(d, marker) for marker, delays in late for d in delays]
    stopped = 0
    for i, (delay, marker) in enumerate(tries):
        cwd = tmp_path / str(i)
        own_cache = {"TINYGPT_CACHE": str(cwd / "cache")} if name.startswith("data.") else {}  # (a miss: work)
        status, out, err = _ctrl_c(argv, cwd, delay, marker and (lambda m=marker, c=cwd: m(c)),
                                   lambda c=cwd: done(c), own_cache)
        if status is None:  # it had finished its work (exit 0) before the signal: export.py on a fast machine
            continue
        stopped += 1
        _check(name, cwd, status, out, err, allowed)
    assert stopped >= len(tries) // 3, f"{name} ended before most signals: give it longer work"
