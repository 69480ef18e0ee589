"""common/platform.py: each fact answered on every OS (psutil's, a container's limit read from a fake cgroup tree,
the CPU's name from a fake /proc and sysctl output), None where unknown; and a scan that keeps POSIX-only code in
its guarded places."""
from __future__ import annotations

import ast
import os
import types
from pathlib import Path

import psutil
import pytest

from common import platform
from tests.helpers import REPO

SYSCTL = {("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M2 Pro\n"}


@pytest.fixture
def linux(tmp_path, monkeypatch):
    """A fake /proc and cgroup tree; write files into the returned /proc."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir(), cgroup.mkdir()
    monkeypatch.setattr(platform, "PROC", proc)
    monkeypatch.setattr(platform, "CGROUP", cgroup)
    return proc


def test_memory_is_psutils_available_within_the_cgroup_limit(linux, monkeypatch):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=8 << 30))
    assert platform.available_memory() == 8 << 30  # no cgroup (macOS, Windows, a machine): psutil's answer
    (platform.CGROUP / "memory.max").write_text(f"{3 << 30}\n")
    (platform.CGROUP / "memory.current").write_text(f"{1 << 30}\n")
    assert platform.available_memory() == 2 << 30
    (platform.CGROUP / "memory.max").write_text("max\n")  # no limit
    assert platform.available_memory() == 8 << 30


def test_the_process_age_is_this_process_s():
    import time
    age, psutils = platform.process_age(), time.time() - psutil.Process().create_time()
    assert age is not None and 0 < age < psutils + 0.1 and age > psutils - 1.1  # (psutil's: boot time in whole s)


def test_the_process_age_is_its_start_in_ticks_since_boot_else_psutils(linux, monkeypatch):
    (linux / "self").mkdir()
    (linux / "self" / "stat").write_text("42 (a (b) c) S 1" + " 0" * 17 + " 250 0 0\n")  # starttime: the 22nd field
    monkeypatch.setattr(platform.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(platform.time, "CLOCK_BOOTTIME", 7, raising=False)  # (Linux's: absent on macOS, Windows)
    monkeypatch.setattr(platform.time, "clock_gettime", lambda clock: 10.0, raising=False)
    assert platform.process_age() == pytest.approx(7.5)  # 2.5 s after boot, now 10 s
    (linux / "self" / "stat").unlink()
    monkeypatch.setattr(psutil, "Process", lambda: types.SimpleNamespace(create_time=lambda: 100.0))
    monkeypatch.setattr(platform.time, "time", lambda: 103.0)
    assert platform.process_age() == 3.0
    monkeypatch.setattr(psutil, "Process", lambda: (_ for _ in ()).throw(psutil.AccessDenied()))
    assert platform.process_age() is None


@pytest.mark.parametrize("error", [FileNotFoundError("/proc/meminfo"), psutil.AccessDenied(), RuntimeError("sysctl")])
def test_facts_psutil_cannot_read_are_none(monkeypatch, error):
    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(psutil, "virtual_memory", fail)
    monkeypatch.setattr(psutil, "cpu_times", fail)
    assert platform.available_memory() is None and platform.busy_cores(0.01) is None


def test_real_memory_is_positive():
    assert 0 < platform.available_memory() <= psutil.virtual_memory().total


def test_cpu_and_mps_use_host_memory():
    assert platform.uses_host_memory("cpu") and platform.uses_host_memory("mps")
    assert not platform.uses_host_memory("cuda")


def test_busy_cores_is_the_cpu_time_others_used_over_the_interval(monkeypatch):
    def reading(user, system, idle):  # a psutil.cpu_times() of this OS's fields, the others 0
        now = psutil.cpu_times()
        return now._replace(**{f: {"user": user, "system": system, "idle": idle}.get(f, 0.0) for f in now._fields})
    readings = iter([reading(100, 100, 800), reading(250, 250, 900)])  # 300 of 400 busy over the interval
    monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: next(readings))
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 4)
    assert platform.busy_cores(0.01) == pytest.approx(0.75 * 4)


def test_busy_cores_measures_this_machine():
    busy = platform.busy_cores(0.02)
    assert busy is None or 0.0 <= busy <= (os.cpu_count() or 1) + 1e-6


def test_cpu_model_and_flags(linux, monkeypatch):
    (linux / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Fake CPU 9000\nflags\t\t: fpu avx2 avx512f\n\n"
                                   "processor\t: 1\nmodel name\t: Fake CPU 9000\n")
    assert platform.cpu_model() == "Fake CPU 9000" and platform.cpu_flags() == {"fpu", "avx2", "avx512f"}
    (linux / "cpuinfo").unlink()
    monkeypatch.setattr(platform, "is_windows", lambda: True)  # no winreg here: the fallback
    assert platform.cpu_model() and platform.cpu_flags() is None
    monkeypatch.setattr(platform, "is_windows", lambda: False)
    monkeypatch.setattr(platform, "is_macos", lambda: True)
    monkeypatch.setattr(platform, "_command_output", lambda *cmd: SYSCTL.get(cmd))  # Apple silicon: no flags
    assert platform.cpu_model() == "Apple M2 Pro" and platform.cpu_flags() is None


@pytest.mark.parametrize("device, triton, windows, reason", [
    ("cpu", False, False, None),
    ("cuda", True, False, None),
    ("cuda", False, False, "Triton is not installed (pip install triton)"),
    ("cuda", False, True, "Triton is not installed (pip install triton-windows)"),
    ("mps", True, False, "torch.compile on Apple's MPS backend is a prototype"),
])
def test_compile_unsupported_names_what_stands_in_the_way(monkeypatch, device, triton, windows, reason):
    monkeypatch.setattr(platform, "has_triton", lambda: triton)
    monkeypatch.setattr(platform, "is_windows", lambda: windows)
    assert platform.compile_unsupported(device) == reason


def test_command_line_quotes_for_this_systems_shell(monkeypatch):
    parts = ["python", "train.py", r"hydra.run.dir=C:\runs\my run", "x=it's"]
    assert platform.command_line(parts) == "python train.py 'hydra.run.dir=C:\\runs\\my run' 'x=it'\"'\"'s'"
    monkeypatch.setattr(platform, "is_windows", lambda: True)
    assert platform.command_line(parts) == 'python train.py "hydra.run.dir=C:\\runs\\my run" x=it\'s'


# -- the scan: Windows has none of these modules, and no /proc --

POSIX_ONLY = {"fcntl", "termios", "pwd", "grp", "resource", "posix"}
PROC_HOME = "common/platform.py"  # the one module that reads /proc
PENDING: set[str] = set()  # files still reading /proc until their call-site edit (none now)


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a `try:` whose handler catches ImportError."""
    ok = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and {"ImportError", "ModuleNotFoundError"} & {n.id for n in ast.walk(h.type)
                                                                                  if isinstance(n, ast.Name)}
                for h in node.handlers):
            ok.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ok


def _offences(path: Path) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    tree, found = ast.parse(path.read_text(encoding="utf-8")), []
    guarded = _guarded(tree)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        for name in names:
            if name.split(".")[0] in POSIX_ONLY and id(node) not in guarded:
                found.append(f"{rel}:{node.lineno}: import {name} (POSIX only: guard it with try/except ImportError)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc") \
                and rel != PROC_HOME:
            found.append(f"{rel}:{node.lineno}: {node.value!r} (Linux only: ask common/platform.py)")
    return found


def test_no_unguarded_posix_only_code_outside_its_home():
    files = [p for p in REPO.rglob("*.py") if not {"tests", ".git", ".venv", "venv", "outputs"} & set(
        p.relative_to(REPO).parts)]
    assert len(files) > 30
    offences = [o for p in files for o in _offences(p)]
    assert [o for o in offences if o.split(":")[0] not in PENDING] == []
    for rel in PENDING:  # a ratchet: once fixed, it must leave PENDING so it cannot come back
        assert any(o.startswith(rel) for o in offences), f"{rel} no longer reads /proc: remove it from PENDING"


def test_peak_rss_is_this_process_and_grows_with_it():
    before = platform.peak_rss()
    if before is None:
        pytest.skip("no peak-memory reading on this OS")
    block = bytearray(64 << 20)  # touched: resident
    assert platform.peak_rss() >= before and platform.peak_rss() >= len(block)


# configure_threads: threads sleep instead of spinning only when other processes use the CPUs
@pytest.mark.parametrize("busy, env, want", [
    (0.0, {}, None),                                   # quiet: OpenMP's default (spinning is faster there)
    (None, {}, None),                                  # the load cannot be read here: leave it
    (1.0, {}, "PASSIVE"),                              # another process holds a core: sleep, don't spin
    (1.0, {"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),    # the user's choice wins
    (1.0, {"OMP_NUM_THREADS": "1"}, None),             # the user chose the threads: leave the policy alone
])
def test_wait_policy_follows_the_load(monkeypatch, busy, env, want):
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"):  # setenv first: undo then restores the original state
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(platform, "busy_cores", lambda: busy)
    platform.configure_threads()
    assert os.environ.get("OMP_WAIT_POLICY") == want

