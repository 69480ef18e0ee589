"""Windows, simulated (no Windows machine here; the CI's windows job runs the real thing): Ctrl-C's clean stop
with only the signals Windows has, and the resume line a stopped run prints, as cmd.exe and then Hydra read it."""
from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

import common.platform
from launch.overrides import resume_command
from runtime import signals
from runtime.signals import EXIT_CODES, StopRequest
from tests.helpers import REPO

REPO = Path(__file__).resolve().parent.parent
# What Python's `signal` module offers on Windows: the signals signal.signal accepts there, the two handler
# constants, and the two console events os.kill can send.
WINDOWS_SIGNALS = {"SIGABRT", "SIGFPE", "SIGILL", "SIGINT", "SIGSEGV", "SIGTERM", "SIGBREAK", "SIG_DFL", "SIG_IGN",
                   "CTRL_C_EVENT", "CTRL_BREAK_EVENT"}


def windows_argv(line: str) -> list[str]:
    """`line` split as a Windows program's C runtime splits its command line (the inverse of list2cmdline):
    quotes group, 2n backslashes before a quote are n and the quote counts, 2n+1 give n and a literal quote."""
    args, arg, quoted, in_arg, i = [], "", False, False, 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            n = len(line[i:]) - len(line[i:].lstrip("\\"))
            i += n
            if i < len(line) and line[i] == '"':
                arg += "\\" * (n // 2) + ('"' if n % 2 else "")
                quoted, i = quoted ^ (n % 2 == 0), i + 1
            else:
                arg += "\\" * n
            in_arg = True
            continue
        if c == '"':
            quoted, in_arg = not quoted, True
        elif c in " \t" and not quoted:
            if in_arg:
                args.append(arg)
            arg, in_arg = "", False
        else:
            arg, in_arg = arg + c, True
        i += 1
    return args + [arg] if in_arg else args


@pytest.mark.parametrize("parts", [["python", "train.py", r"hydra.run.dir=C:\Users\me\my runs\r1"],
                                   ["a b", 'say "hi"', "trail\\", 'x\\"y', "", r"C:\dir with space\\"]])
def test_the_windows_splitter_inverts_list2cmdline(parts):
    assert windows_argv(subprocess.list2cmdline(parts)) == parts


@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(common.platform, "is_windows", lambda: True)
    return monkeypatch


def test_the_resume_line_reads_back_in_cmd_exe_and_hydra(windows):
    run_dir = Path(r"C:\Users\me\my runs\2024-05-01_12-00-00")
    line = resume_command(run_dir, ["model.n_layer=2", "train.resume=false", r"data.path=D:\corpus.txt"])
    argv = windows_argv(line)
    assert argv[:2] == ["python", str(REPO / "train.py")], line  # (the test's cwd is not the repo)
    parser = OverridesParser.create()
    overrides = {o.key_or_group: o.value() for o in parser.parse_overrides(argv[2:])}
    assert overrides == {"model.n_layer": 2, "data.path": r"D:\corpus.txt", "hydra.run.dir": str(run_dir),
                         "train.resume": True}, line


def test_ctrl_c_stops_cleanly_with_the_signals_windows_has(windows):
    """StopRequest installs its handlers through a `signal.signal` that accepts only what Windows accepts: both
    install (Windows has SIGTERM, though no other process can send it), a first Ctrl-C sets the flag the loop
    polls (it saves last.pt and prints the resume line), a second aborts at once, and restore() undoes both."""
    installed = {}

    def windows_signal(signum, handler):
        if signal.Signals(signum).name not in WINDOWS_SIGNALS:
            raise ValueError("invalid signal value")  # as signal.signal says on Windows
        previous, installed[signum] = installed.get(signum, signal.SIG_DFL), handler
        return previous

    windows.setattr(signals.signal, "signal", windows_signal)
    stop = StopRequest()
    stop.install()
    assert set(installed) == {signal.SIGINT, signal.SIGTERM} <= set(EXIT_CODES)
    installed[signal.SIGINT](signal.SIGINT, None)
    assert stop.agreed() and stop.name == "SIGINT" and EXIT_CODES[stop.signum] == 130
    with pytest.raises(KeyboardInterrupt):
        installed[signal.SIGINT](signal.SIGINT, None)
    stop.restore()
    assert installed == {signal.SIGINT: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL}


def test_the_code_names_only_signals_windows_has():
    """A scan: signal.SIGHUP, SIGKILL, SIGUSR1... would be an AttributeError on Windows at import or at the stop."""
    used = {}
    for path in [*REPO.glob("*.py"), *(p for d in ("common", "data", "model", "checkpoint", "training", "launch", "viz")
                                       for p in (REPO / d).rglob("*.py"))]:
        for name in re.findall(r"\bsignal\.(SIG[A-Z0-9_]+|CTRL_[A-Z_]+)\b", path.read_text(encoding="utf-8")):
            used.setdefault(name, set()).add(path.relative_to(REPO).as_posix())
    assert "SIGINT" in used and "SIGTERM" in used  # the scan sees runtime/signals.py
    assert {k: v for k, v in used.items() if k not in WINDOWS_SIGNALS} == {}
