"""common.files: a file or directory is replaced whole or not at all; on Windows also while another program
briefly has the target open (simulated: os.replace raising PermissionError, as Windows does then); a written file
has the permissions open() would give it."""
import contextlib
import os
import stat
import sys

import platformdirs.macos
import platformdirs.unix
import platformdirs.windows
import pytest

from common import files
from common.files import atomic_write, open_mode, replace_dir, with_open_mode


def test_atomic_write_leaves_the_old_file_when_the_block_fails(tmp_path):
    tmp_path = tmp_path / "d"  # (tmp_path also holds the test's cache dir)
    tmp_path.mkdir()
    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(p, "w") as f:
            f.write("half")
            raise RuntimeError("killed")
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["f.txt"]
    with atomic_write(p, "w") as f:
        f.write("new")
    assert p.read_text() == "new" and sorted(x.name for x in tmp_path.iterdir()) == ["f.txt"]


def test_replace_dir_swaps_in_whole_and_puts_the_old_one_back_on_failure(tmp_path, monkeypatch):
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    out, tmp = tmp_path / "out", tmp_path / ".out.tmp"
    replace_dir(_dir(tmp, "a"), out)  # no old directory
    assert (out / "a").read_text() == "a" and not tmp.exists()
    replace_dir(_dir(tmp, "b"), out, tmp_path / ".out.old")
    assert [p.name for p in out.iterdir()] == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    real = os.replace

    def failing(src, dst):
        if str(src) == str(tmp):
            raise OSError("disk full")
        real(src, dst)
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk full"):
        replace_dir(_dir(tmp, "c"), out)
    assert [p.name for p in out.iterdir()] == ["b"]  # the old directory is back in place


@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def write_0600(path):
    """A library's writer (safetensors' save_file): a 0600 temp file renamed over `path`."""
    tmp = f"{path}.lib-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"data")
    os.close(fd)
    os.replace(tmp, path)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_a_new_file_follows_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path, mask):
    """As open(p, "w") would: new -> 0o666 less the umask; replaced -> its own bits, whatever the umask (was: the
    temp file's, so a chmod 0640 last.pt became 0644 at the next save)."""
    d = tmp_path / "d"
    d.mkdir()
    with umask(mask):
        with atomic_write(d / "new.txt", "w") as f:
            f.write("x")
        assert mode(d / "new.txt") == 0o666 & ~mask
        for kept in (0o640, 0o600, 0o664, 0o444):
            (d / "old.txt").write_text("old")
            os.chmod(d / "old.txt", kept)
            with atomic_write(d / "old.txt", "w") as f:
                f.write("new")
            assert (d / "old.txt").read_text() == "new" and mode(d / "old.txt") == kept, oct(kept)
        assert open_mode(d / "another.txt") == 0o666 & ~mask and open_mode(d / "old.txt") == 0o444
        replace_dir(_dir(tmp_path / ".out.tmp", "a"), d / "out")  # a directory: new, then replaced
        assert mode(d / "out") == 0o777 & ~mask
        os.chmod(d / "out", 0o750)
        replace_dir(_dir(tmp_path / ".out.tmp", "b"), d / "out")
        assert mode(d / "out") == 0o750 and (d / "out" / "b").is_file()
    assert sorted(p.name for p in d.iterdir()) == ["new.txt", "old.txt", "out"]  # the probe left nothing


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_a_file_a_library_writes_0600_gets_what_open_would_give(tmp_path):
    """safetensors' save_file wrote model.safetensors 0600 beside 0644 tokenizer files: with_open_mode undoes it."""
    with umask(0o022):
        write_0600(tmp_path / "plain")
        assert mode(tmp_path / "plain") == 0o600  # (what the library does on its own)
        with with_open_mode(tmp_path / "new"):
            write_0600(tmp_path / "new")
        assert mode(tmp_path / "new") == 0o644
        os.chmod(tmp_path / "plain", 0o640)
        with with_open_mode(tmp_path / "plain"):  # replaced: keeps its bits
            write_0600(tmp_path / "plain")
        assert mode(tmp_path / "plain") == 0o640


@pytest.fixture
def windows(monkeypatch):
    """is_windows() true, and os.replace failing with PermissionError `fail[0]` more times (a reader that holds
    the file open for a while); returns (fail, waits slept)."""
    fail, waits, real = [0], [], os.replace

    def replace(src, dst):
        if fail[0]:
            fail[0] -= 1
            raise PermissionError(13, "Access is denied")
        real(src, dst)
    monkeypatch.setattr(files, "is_windows", lambda: True)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(files.time, "sleep", waits.append)
    return fail, waits


def test_a_file_open_elsewhere_on_windows_is_replaced_once_it_is_closed(tmp_path, windows):
    fail, waits = windows
    p = tmp_path / "last.pt"
    fail[0] = 3
    with atomic_write(p, "w") as f:
        f.write("new")
    assert p.read_text() == "new" and waits == list(files.REPLACE_WAITS[:3])
    fail[0] = 2  # directories too (an HF export another program is reading)
    replace_dir(_dir(tmp_path / ".out.tmp", "a"), tmp_path / "out")
    assert (tmp_path / "out" / "a").is_file()


def test_a_file_that_stays_open_on_windows_is_one_clear_line_after_a_bounded_wait(tmp_path, windows):
    fail, waits = windows
    fail[0] = 10 ** 6
    target = r"C:\Users\me\runs\my run\last.pt"  # printed as the user wrote it: no doubled backslashes
    with pytest.raises(PermissionError) as info:
        files.replace(tmp_path / "x", target)
    assert str(info.value) == (f"[Errno 13] {target} stayed open in another program for 5 s (a viewer, an editor, "
                               f"a virus scanner?): close it and run again")
    assert waits == list(files.REPLACE_WAITS) and sum(waits) < 6


def test_posix_reports_a_refused_rename_at_once(tmp_path, windows, monkeypatch):
    fail, waits = windows
    monkeypatch.setattr(files, "is_windows", lambda: False)
    fail[0] = 1
    with pytest.raises(PermissionError, match="Access is denied"):
        files.replace(tmp_path / "x", tmp_path / "y")
    assert waits == []


def _dir(path, name):
    path.mkdir()
    (path / name).write_text(name)
    return path


def test_the_cache_is_tinygpt_cache_else_the_oss_else_an_earlier_one(tmp_path, monkeypatch):
    """$TINYGPT_CACHE wins; else platformdirs' directory for the OS (each OS's class, so all three run here), except
    that a ~/.cache/tinygpt an earlier tinygpt filled is kept while the OS's directory does not exist."""
    home, legacy = tmp_path / "home", tmp_path / "home" / ".cache" / "tinygpt"
    for var in ("HOME", "USERPROFILE"):  # (what expanduser reads on POSIX / on Windows)
        monkeypatch.setenv(var, str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "mine"))
    assert files.cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("TINYGPT_CACHE", "")  # set but empty: the default
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.unix.Unix)
    assert files.cache_dir() == legacy  # Linux: the same place as before
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.windows.Windows)
    monkeypatch.setenv("WIN_PD_OVERRIDE_LOCAL_APPDATA", r"C:\Users\me\AppData\Local")  # %LOCALAPPDATA%
    assert str(files.cache_dir()).replace("\\", "/") == "C:/Users/me/AppData/Local/tinygpt/Cache"
    monkeypatch.setattr(platformdirs, "PlatformDirs", platformdirs.macos.MacOS)
    assert files.cache_dir() == home / "Library" / "Caches" / "tinygpt"
    legacy.mkdir(parents=True)
    assert files.cache_dir() == legacy  # an earlier tinygpt's, on macOS (and Windows)
    (home / "Library" / "Caches" / "tinygpt").mkdir(parents=True)
    assert files.cache_dir() == home / "Library" / "Caches" / "tinygpt"  # once the OS's exists, it is used
