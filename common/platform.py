"""Facts about the machine that differ by operating system, answered in one place: psutil's where it has them
(available memory, CPU load), else read here (a container's memory limit, the peak memory, the CPU's name). Anything
unknown (or any failure) answers None, so callers degrade to "no check" instead of crashing. No torch: this is
imported before torch (configure_threads). No other module reads /proc (tests/test_common_platform.py scans).
"""
from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import psutil

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
FAILURES = (OSError, RuntimeError, psutil.Error)  # what psutil raises where the OS does not answer


def is_windows() -> bool:
    return os.name == "nt"


def is_macos() -> bool:
    return sys.platform == "darwin"


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _command_output(*cmd: str) -> Optional[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _cgroup_room() -> Optional[int]:
    """Bytes this container may still allocate (cgroup v2, else v1), or None without a limit. Not psutil's: it
    reports the machine's memory, whatever the container's limit."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            return max(int((CGROUP / limit).read_text()) - int((CGROUP / usage).read_text()), 0)
        except (OSError, ValueError):  # no such cgroup file, or "max"
            continue
    return None


def available_memory() -> Optional[int]:
    """Bytes a new allocation can get without swapping (psutil's "available": Linux's MemAvailable; macOS: free and
    inactive pages), within a Linux container's limit; None where that cannot be read (then callers skip their
    memory check)."""
    try:
        free = psutil.virtual_memory().available
    except FAILURES:
        return None
    room = _cgroup_room()
    return free if room is None else min(free, room)


def uses_host_memory(device_type: str) -> bool:
    """Whether tensors on this torch device type live in the machine's RAM: the CPU, and Apple's MPS (unified
    memory), so available_memory() bounds them."""
    return device_type in ("cpu", "mps")


def busy_cores(interval: float = 0.05) -> Optional[float]:
    """How many cores other processes keep busy right now (this one sleeps while it measures the CPU time over
    `interval`), or None where the OS does not say."""
    try:
        return psutil.cpu_percent(interval) / 100 * (psutil.cpu_count() or 1)
    except FAILURES:
        return None


BUSY_CORES = 0.5  # other processes using at least half a core: OpenMP threads must not spin


def configure_threads() -> None:
    """Call first thing in an entry point, before torch is imported (the OpenMP runtime reads the policy once).
    Spinning threads burn their time slice waiting for a partner that is not running: on 2 cores with one busy,
    training ran at 740 tokens/s against 7,700 with sleeping threads (on a quiet machine spinning is faster). So
    PASSIVE only when other processes use the CPUs at start-up; OMP_WAIT_POLICY or OMP_NUM_THREADS set wins."""
    if "OMP_WAIT_POLICY" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    busy = busy_cores()
    if busy is not None and busy >= BUSY_CORES:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def peak_rss() -> Optional[int]:
    """This process's peak resident memory in bytes since it started its program (Linux: VmHWM; macOS: the
    rusage maximum; psutil has no peak there), or None where it cannot be read."""
    status = _read(PROC / "self" / "status") or ""
    line = next((ln for ln in status.splitlines() if ln.startswith("VmHWM:")), None)
    if line is not None:
        return int(line.split()[1]) * 1024
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if is_macos() else None  # bytes on macOS


def process_age() -> Optional[float]:
    """Seconds since this process started (the interpreter's start-up included), or None where the OS does not say.
    Linux: its start in clock ticks since boot (psutil's create_time adds /proc's boot time, in whole seconds: up
    to 1 s off); elsewhere psutil's create_time."""
    stat = _read(PROC / "self" / "stat")
    if stat is not None and hasattr(time, "CLOCK_BOOTTIME"):
        try:  # (fields after the command's closing parenthesis: the 22nd, starttime, is the 20th of them)
            ticks = int(stat.rpartition(")")[2].split()[19])
            return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        except (ValueError, IndexError, OSError):
            pass
    try:
        return time.time() - psutil.Process().create_time()
    except FAILURES:
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpuinfo() -> dict[str, str]:
    text = _read(PROC / "cpuinfo") or ""
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}


def cpu_model() -> str:
    """The CPU's marketing name where the OS tells it, else platform.processor() or the architecture."""
    name = _cpuinfo().get("model name")
    if not name and is_macos():
        name = (_command_output("sysctl", "-n", "machdep.cpu.brand_string") or "").strip()
    if not name and is_windows():
        try:
            import winreg
            with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0") as k:
                name = str(winreg.QueryValueEx(k, "ProcessorNameString")[0]).strip()
        except (ImportError, OSError):
            name = ""
    return name or platform.processor() or platform.machine()


def cpu_flags() -> Optional[set[str]]:
    """The x86 feature flags in /proc/cpuinfo's spelling (avx2, avx512f...), or None where the OS does not list
    them (Windows, Apple silicon)."""
    flags = _cpuinfo().get("flags")
    if flags is None and is_macos():
        out = _command_output("sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features")
        flags = out.lower().replace(".", "_") if out else None
    return set(flags.split()) if flags is not None else None


def has_triton() -> bool:
    """Whether Triton (torch.compile's GPU code generator) is installed: Linux CUDA wheels bring it; on
    Windows it is a separate package (triton-windows)."""
    return importlib.util.find_spec("triton") is not None


def compile_unsupported(device_type: str) -> Optional[str]:
    """Why torch.compile should stay off by default on this device type here, in a few words; None when
    nothing stands in its way. An explicit setting still wins."""
    if device_type == "mps":
        return "torch.compile on Apple's MPS backend is a prototype"
    if device_type == "cuda" and not has_triton():
        return f"Triton is not installed (pip install {'triton-windows' if is_windows() else 'triton'})"
    return None


def command_line(parts: list[str]) -> str:
    """`parts` as one command the user can paste into this system's shell (POSIX quoting, or Windows')."""
    return subprocess.list2cmdline(parts) if is_windows() else " ".join(shlex.quote(p) for p in parts)


def script(name: str) -> str:
    """This project's script `name` (train.py, sample.py) as a printed command names it, to run from the current
    directory (where the user launched the run): relative to it when inside it, else absolute."""
    path, cwd = Path(__file__).resolve().parent.parent / name, Path.cwd().resolve()
    return os.path.relpath(path, cwd) if path.is_relative_to(cwd) else str(path)
