"""Facts about the machine that differ by operating system, answered in one place.

Linux reads /proc, macOS asks sysctl/vm_stat, Windows asks kernel32 through ctypes; anything else (or any
failure) answers None, so callers degrade to "no check" instead of crashing. Standard library only: this is
imported before torch (configure_threads). No other module reads /proc (tests/test_common_platform.py scans).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")


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


def _kernel32():
    return ctypes.WinDLL("kernel32", use_last_error=True)  # only ever called on Windows


class _MemoryStatusEx(ctypes.Structure):  # GlobalMemoryStatusEx's MEMORYSTATUSEX
    _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                ("ullTotalPhys", ctypes.c_uint64), ("ullAvailPhys", ctypes.c_uint64),
                ("ullTotalPageFile", ctypes.c_uint64), ("ullAvailPageFile", ctypes.c_uint64),
                ("ullTotalVirtual", ctypes.c_uint64), ("ullAvailVirtual", ctypes.c_uint64),
                ("ullAvailExtendedVirtual", ctypes.c_uint64)]


def _windows_memory() -> Optional[tuple[int, int]]:
    try:
        status = _MemoryStatusEx(dwLength=ctypes.sizeof(_MemoryStatusEx))
        if not _kernel32().GlobalMemoryStatusEx(ctypes.byref(status)):
            return None
    except (OSError, AttributeError):
        return None
    return status.ullTotalPhys, status.ullAvailPhys


def _meminfo(key: str) -> Optional[int]:
    text = _read(PROC / "meminfo")
    try:
        info = dict(line.split(":", 1) for line in (text or "").splitlines())
        return int(info[key].split()[0]) * 1024
    except (KeyError, ValueError, IndexError):
        return None


def _sysconf_pages(name: str) -> Optional[int]:
    try:
        n, page = os.sysconf(name), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows) or no such name (macOS: AVPHYS)
        return None
    return n * page if n > 0 and page > 0 else None


def total_memory() -> Optional[int]:
    """Physical memory in bytes, or None where it cannot be read."""
    if is_windows():
        mem = _windows_memory()
        return mem and mem[0]
    if is_macos():
        out = _command_output("sysctl", "-n", "hw.memsize")
        return int(out) if out and out.strip().isdigit() else None
    return _meminfo("MemTotal") or _sysconf_pages("SC_PHYS_PAGES")


def _macos_available() -> Optional[int]:
    """vm_stat's free + inactive + speculative pages: what macOS hands out without swapping (Activity
    Monitor's "available" is close to this)."""
    out = _command_output("vm_stat")
    if not out or "page size of" not in out:
        return None
    try:
        page = int(out.split("page size of", 1)[1].split()[0])
        pages = {k.strip(): int(v.strip().rstrip(".")) for k, _, v in (line.partition(":") for line in
                                                                       out.splitlines()[1:]) if v.strip()}
        return page * sum(pages[k] for k in ("Pages free", "Pages inactive", "Pages speculative"))
    except (KeyError, ValueError, IndexError):
        return None


def _cgroup_room() -> Optional[int]:
    """Bytes this container may still allocate (cgroup v2, else v1), or None without a limit."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            return max(int(_read(CGROUP / limit) or "") - int(_read(CGROUP / usage) or ""), 0)
        except ValueError:  # no such cgroup file, or "max"
            continue
    return None


def available_memory() -> Optional[int]:
    """Bytes a new allocation can get without swapping (Linux: MemAvailable within the cgroup's limit), or None
    where that cannot be read (then callers skip their memory check)."""
    if is_windows():
        mem = _windows_memory()
        return mem and mem[1]
    if is_macos():
        return _macos_available()
    free = _meminfo("MemAvailable") or _sysconf_pages("SC_AVPHYS_PAGES")
    room = _cgroup_room() if free is not None else None
    return free if room is None else min(free, room)


def uses_host_memory(device_type: str) -> bool:
    """Whether tensors on this torch device type live in the machine's RAM: the CPU, and Apple's MPS (unified
    memory), so available_memory() bounds them."""
    return device_type in ("cpu", "mps")


def _cpu_times() -> Optional[tuple[int, int]]:
    """(idle, total) CPU time since boot, all CPUs, in the platform's unit; None where unknown."""
    if is_windows():
        idle, kernel, user = (ctypes.c_uint64() for _ in range(3))  # FILETIMEs; kernel time includes idle
        try:
            if not _kernel32().GetSystemTimes(ctypes.byref(idle), ctypes.byref(kernel), ctypes.byref(user)):
                return None
        except (OSError, AttributeError):
            return None
        return idle.value, kernel.value + user.value
    text = _read(PROC / "stat")
    try:
        fields = [int(x) for x in (text or "").splitlines()[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total (jiffies)
    except (ValueError, IndexError):
        return None


def busy_cores(interval: float = 0.05) -> Optional[float]:
    """How many cores other processes keep busy right now (this one sleeps while it measures). Linux and
    Windows measure CPU time over `interval`; elsewhere (macOS) the 1-minute load average stands in; None
    where neither exists."""
    first = _cpu_times()
    if first is None:
        try:
            return min(os.getloadavg()[0], float(os.cpu_count() or 1))
        except (AttributeError, OSError):
            return None
    time.sleep(interval)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    return (1 - (second[0] - first[0]) / (second[1] - first[1])) * (os.cpu_count() or 1)


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
    rusage maximum), or None where it cannot be read."""
    status = _read(PROC / "self" / "status") or ""
    line = next((ln for ln in status.splitlines() if ln.startswith("VmHWM:")), None)
    if line is not None:
        return int(line.split()[1]) * 1024
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if is_macos() else None  # bytes on macOS


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
