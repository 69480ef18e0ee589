"""runtime/console.py: the one console handler: above the progress bar, quiet once stdout's reader has left
(`train.py | head` in a terminal ends at once with 141, no `--- Logging error ---`), and so does its stderr."""
from __future__ import annotations

import fcntl
import io
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from checkpoint import file as ck
from runtime import console
from runtime.signals import EXIT_CODES, SIGPIPE, StopRequest
from tests.helpers import REPO


@pytest.fixture
def handler(monkeypatch):
    monkeypatch.setattr(console, "_gone", threading.Event())
    h = console.Console()
    h.stream = io.StringIO()
    log = logging.getLogger("tinygpt-console-test")
    log.addHandler(h)
    log.propagate = False
    log.setLevel(logging.INFO)
    yield h, log
    log.removeHandler(h)


def test_above_a_bar_the_per_interval_lines_are_left_to_it(handler):
    h, log = handler
    with console.progress_bar(10, 0, show=False):  # not shown: no bar to write above
        log.info("a train line", extra={"on_bar": False})  # (training.metrics.RunLog says whether it showed it)
    assert h.stream.getvalue() == "a train line\n"
    h.stream = drawn = io.StringIO()  # a terminal showing stdout and stderr
    with console.tqdm(total=10, file=drawn, ncols=80) as bar:
        bar.update(1)
        log.info("an eval line")
        log.info("a train line", extra={"on_bar": True})  # the bar's postfix shows these
    assert "a train line" not in drawn.getvalue()
    cleared, line, bar_again = drawn.getvalue().split("\r")[2:5]  # the bar cleared, the line, the bar below it
    assert (cleared.strip(), line, bar_again[:4]) == ("", "an eval line\n", " 10%")


def test_a_closed_pipe_is_quiet_and_stops_the_run(handler, capsys):
    h, log = handler
    r, w = os.pipe()
    os.close(r)
    h.stream = os.fdopen(w, "w", buffering=1)
    try:
        log.warning("a line nobody reads")
        log.warning("and another")
        stop = StopRequest()
        assert stop.agreed() and stop.signum == SIGPIPE and EXIT_CODES[stop.signum] == 141
        assert stop.name == "a closed output pipe (the output's reader went away)" and stop.status == "stopped"
    finally:
        h.stream.close()
    assert "Logging error" not in capsys.readouterr().err


def test_a_closed_stderr_is_quiet_and_stops_the_run_too(handler, monkeypatch):
    """`train.py 2>&1 | head -2`: the auto-CPU note on stderr raised BrokenPipeError before step 1, and the run was
    recorded as failed with `error: [Errno 32] Broken pipe`. train.py's stderr lines go through to_stderr."""
    r, w = os.pipe()
    os.close(r)
    stream = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        console.to_stderr("no CUDA GPU found: ...")
        console.to_stderr("and a later line")  # quietly nowhere
        assert console.reader_gone()
        stop = StopRequest()
        assert stop.agreed() and stop.name.endswith("(the output's reader went away)")
    finally:
        monkeypatch.undo()
        stream.close()


def test_setup_adds_one_handler(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    assert console.setup() is console.setup() and len(root.handlers) == 1


@pytest.mark.slow
def test_head_in_a_terminal_stops_at_once_with_a_checkpoint(tmp_path, tiny_corpus):
    """`python train.py ... | head` with stderr a terminal (so the progress bar is drawn, and the per-step lines are
    left to it), closed after step 2's evaluation line: the run ends within seconds of the reader leaving, saves
    last.pt, prints no traceback and exits 141."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    args = [sys.executable, str(REPO / "train.py"), "experiment=cpu", "train.device=cpu", "model=tiny", "data=text",
            f"data.path={tiny_corpus}", "train.max_iters=100000", "train.eval_interval=2", "train.eval_iters=1",
            "train.eval_at_start=false", "hydra.run.dir=r"]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 0-column terminal hides the bar
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdin=slave, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    terminal = []

    def drain():
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the last writer closed it
                return
            if not chunk:
                return
            terminal.append(chunk)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        head = []
        for line in proc.stdout:
            head.append(line)
            if line.startswith(b"step 2/"):  # step 2's evaluation
                break
        proc.stdout.close()  # as head does after its lines
        left = time.monotonic()
        proc.wait(timeout=120)
        took = time.monotonic() - left
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=5)
        os.close(master)
    err = b"".join(terminal).decode(errors="replace")
    assert head[-1].startswith(b"step 2/") and proc.returncode == 141, err
    assert took < 10, f"{took:.1f} s after the reader left"
    assert "Logging error" not in err and "Traceback" not in err, err
    assert "step/s" in err or "s/step" in err, err  # the progress bar was drawn
    assert ck.load_checkpoint(tmp_path / "r" / "last.pt")["step"] >= 2
    assert "stopped by a closed output pipe (the output's reader went away) after step" in \
        (tmp_path / "r" / "train.log").read_text()


def test_progress_is_a_postfix_on_a_bar_and_a_plain_line_now_and_then_without_one():
    """Issue 50: a long wait between steps (an evaluation) shows how far it is: the bar's postfix,
    redrawn at most every REDRAW_S and given back to the train line when done; with no bar, a plain
    line once it has lasted PLAIN_AFTER_S and every EVERY_S after (nothing for a short wait)."""
    now, said = [0.0], []
    plain = console.Progress("evaluating the val split", None, said.append, clock=lambda: now[0])
    for done, at in [(1, 1.0), (2, 9.9), (3, 10.0), (4, 20.0), (5, 40.0), (6, 41.0), (8, 90.0)]:
        now[0] = at
        plain(done, 8)  # the last call (8/8) adds nothing: the evaluation's own line follows
    assert said == ["evaluating the val split: 3/8 batches in 10 s",
                    "evaluating the val split: 5/8 batches in 40 s"]
    stream = io.StringIO()
    bar = console.tqdm(total=10, file=stream, disable=False)
    bar.set_postfix_str("loss 2.5000", refresh=False)
    now[0] = 0.0
    drawn = console.Progress("evaluating the val split", bar, said.append, clock=lambda: now[0])
    now[0] = 1.0
    drawn(1, 4)
    assert bar.postfix == "evaluating the val split 1/4"
    now[0] = 1.2
    drawn(2, 4)  # within REDRAW_S: not redrawn
    assert bar.postfix == "evaluating the val split 1/4"
    drawn(4, 4)
    # the train line is back, and no plain line came with a bar
    assert bar.postfix == "loss 2.5000" and len(said) == 2
    bar.close()
    hidden = console.progress_bar(4, 0, show=False)  # not drawn: plain lines
    assert console.Progress("x", hidden, said.append).bar is None
