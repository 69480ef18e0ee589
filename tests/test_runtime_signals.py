"""runtime/signals.py: a signal sets a flag; a second Ctrl-C aborts at once; handlers are restored."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from runtime.signals import EXIT_CODES, StopRequest


def test_first_signal_is_a_flag_second_ctrl_c_aborts():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = StopRequest()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and stop.name == "SIGTERM"
        assert EXIT_CODES[stop.signum] == 143 and EXIT_CODES[signal.SIGINT] == 130
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert {s: signal.getsignal(s) for s in before} == before


def test_install_outside_the_main_thread_is_a_no_op():
    stop = StopRequest()
    t = threading.Thread(target=stop.install)
    t.start()
    t.join()
    assert stop._previous == {} and stop.signum is None and stop.name == ""


def test_a_run_under_way_takes_ctrl_c_over_and_gives_it_back():
    """Issue 39: train.py's start-up handler ends the process at once; from on_start to the closing line Ctrl-C
    raises (the loop's StopRequest inside), and the start-up handler is back for a sweep's next job."""
    from runtime.signals import run_under_way

    def start_up(signum, frame):
        raise AssertionError("the start-up handler while the run is under way")
    before = signal.signal(signal.SIGINT, start_up)
    try:
        with run_under_way():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is start_up
        t = threading.Thread(target=lambda: run_under_way().__enter__())  # (only the main thread sets handlers)
        t.start()
        t.join()
        assert signal.getsignal(signal.SIGINT) is start_up
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_closing_line_of_an_aborted_run_names_the_checkpoint(tmp_path):
    from runtime.signals import interrupted_line
    run = tmp_path / "run"
    assert interrupted_line(run, None, None, "CMD") == "interrupted; no checkpoint was written yet"
    assert interrupted_line(run, tmp_path / "other" / "last.pt", 7, "CMD") == \
        "interrupted; no checkpoint was written yet"  # resumed from elsewhere: nothing in this run dir yet
    assert interrupted_line(run, run / "last.pt", 4, "CMD") == "interrupted; last.pt is from step 4: resume with: CMD"
    run.mkdir()
    (run / "last.pt").write_bytes(b"")
    assert interrupted_line(run, None, None, "CMD") == "interrupted; last.pt is as it was: resume with: CMD"


def test_a_closed_pipe_is_a_stop_in_words_with_its_own_status_and_exit_code(tmp_path):
    from runtime.signals import PIPE, SIGPIPE, closing_line
    stop = StopRequest()
    stop.signum = SIGPIPE
    assert (stop.name, stop.status, stop.exit_code(), stop.exit_code(aborted=True)) == (PIPE, "stopped", 141, 141)
    stop.signum = signal.SIGTERM
    assert (stop.status, stop.exit_code(), stop.exit_code(aborted=True)) == ("interrupted", 143, 130)
    run = tmp_path / "run"
    line = lambda **kw: closing_line(**{**dict(stop=PIPE, step=0, run_dir=run, last=None, last_step=None,  # noqa: E731
                                            resume="CMD", aborted=False, stepped=False), **kw})
    assert line() == f"stopped by {PIPE} before step 1: nothing to save and nothing needs resuming"
    assert line(step=4, last=run / "last.pt", last_step=4) == \
        f"stopped by {PIPE} before step 5: nothing new to save ({run / 'last.pt'} is from step 4); resume with: CMD"
    assert line(step=6, last=run / "last.pt", last_step=6, stepped=True) == \
        f"stopped by {PIPE} after step 6: saved {run / 'last.pt'}; resume with: CMD"
    assert line(step=6, last=run / "last.pt", last_step=4, aborted=True) == \
        f"stopped by {PIPE} mid-step; last.pt is from step 4: resume with: CMD"
    assert line(stop="SIGINT", aborted=True) == "interrupted; no checkpoint was written yet"
