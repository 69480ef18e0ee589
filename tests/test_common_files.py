"""common.files: a file or directory is replaced whole or not at all."""
import os

import pytest

from common.files import atomic_write, replace_dir


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


def _dir(path, name):
    path.mkdir()
    (path / name).write_text(name)
    return path
