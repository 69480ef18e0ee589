"""data/sources.py: cache location; Tiny Shakespeare and GPT-2 ranks from the cache, a (simulated) download, offline."""
from __future__ import annotations

import hashlib
import io
import os
import urllib.error
import urllib.request
from pathlib import Path

import platformdirs
import pytest

from data import sources
from data.tokenizer import GPT2Tokenizer


def _offline(monkeypatch):
    calls = []

    def urlopen(url, *a, **kw):
        calls.append(url)
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


class _FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(monkeypatch, payload: bytes):
    calls = []

    def urlopen(url, *a, timeout=None, **kw):
        calls.append((url, timeout))
        return _FakeResponse(payload)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "c"))
    assert sources.cache_dir() == tmp_path / "c"
    assert sources.shakespeare_cache_path() == tmp_path / "c" / "tinyshakespeare" / "input.txt"
    assert sources.gpt2_ranks_cache_path() == tmp_path / "c" / "tokenizers" / "gpt2.tiktoken"
    monkeypatch.delenv("TINYGPT_CACHE")  # the OS's (each OS's rule: tests/test_common_files.py)
    assert sources.cache_dir() in (Path(platformdirs.user_cache_dir("tinygpt", appauthor=False)),
                                   Path.home() / ".cache" / "tinygpt")


def test_shakespeare_cache_hit_needs_no_network(cache_with_shakespeare, monkeypatch):
    calls = _offline(monkeypatch)
    p = sources.shakespeare_path()
    assert p == cache_with_shakespeare / "tinyshakespeare" / "input.txt"
    assert p.stat().st_size == sources.SHAKESPEARE_SIZE
    assert calls == []


def test_shakespeare_offline_error_names_exact_path(monkeypatch):
    calls = _offline(monkeypatch)
    with pytest.raises(FileNotFoundError) as ei:
        sources.shakespeare_path()
    msg = str(ei.value)
    assert "\n" not in msg
    assert str(sources.shakespeare_cache_path()) in msg
    assert "or pass path=<your copy>" in msg and "name resolution" in msg
    assert calls == [sources.SHAKESPEARE_URL]
    assert not sources.shakespeare_cache_path().exists()
    assert list(sources.shakespeare_cache_path().parent.iterdir()) == []  # no partial file left


def test_shakespeare_download_verifies_and_renames(shared_data_dir, monkeypatch):
    payload = (shared_data_dir / "tinyshakespeare.txt").read_bytes()
    calls = _serve(monkeypatch, payload)
    p = sources.shakespeare_path()
    assert p.read_bytes() == payload
    assert calls[0][0] == sources.SHAKESPEARE_URL and 0 < calls[0][1] <= 60
    assert [f.name for f in p.parent.iterdir()] == ["input.txt"]
    _offline(monkeypatch)  # second call: from the cache
    assert sources.shakespeare_path() == p


def test_corrupt_download_leaves_nothing(monkeypatch):
    _serve(monkeypatch, b"<html>captive portal</html>")
    with pytest.raises(ValueError, match="incomplete or wrong"):
        sources.shakespeare_path()
    assert list(sources.shakespeare_cache_path().parent.iterdir()) == []


def test_download_checks_sha256(tmp_path, monkeypatch):
    _serve(monkeypatch, b"hello")
    dest = tmp_path / "d" / "f.txt"
    with pytest.raises(ValueError, match="sha256"):
        sources.download("https://example.invalid/f", dest, size=5, sha256="0" * 64)
    assert not dest.exists() and os.listdir(dest.parent) == []
    good = hashlib.sha256(b"hello").hexdigest()
    assert sources.download("https://example.invalid/f", dest, size=5, sha256=good).read_bytes() == b"hello"


def test_wrong_file_in_cache_is_refused(monkeypatch):
    dest = sources.shakespeare_cache_path()
    dest.parent.mkdir(parents=True)
    dest.write_text("not shakespeare")
    with pytest.raises(ValueError) as ei:
        sources.shakespeare_path()
    assert str(dest) in str(ei.value) and "with name=text path=<file>" in str(ei.value)


def test_gpt2_ranks_path(cache_with_gpt2):
    assert sources.gpt2_ranks_path() == cache_with_gpt2 / "tokenizers" / "gpt2.tiktoken"


def test_gpt2_ranks_path_absent():
    assert sources.gpt2_ranks_path() is None


def _no_tiktoken_download(monkeypatch):
    import tiktoken

    def boom(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", boom)


def test_gpt2_online_fallback_seeds_the_cache(shared_data_dir, monkeypatch):
    """No local file, tiktoken works (simulated): its ranks are saved for later offline runs."""
    import tiktoken
    ranks = sources.load_ranks(shared_data_dir / "gpt2.tiktoken")
    enc = tiktoken.Encoding(name="gpt2", pat_str=sources.GPT2_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    assert GPT2Tokenizer().encode("Hello world") == [15496, 995]
    saved = sources.gpt2_ranks_cache_path()
    assert saved.is_file() and sources.load_ranks(saved) == ranks
    _no_tiktoken_download(monkeypatch)
    assert GPT2Tokenizer().encode("Hello world") == [15496, 995]


def test_gpt2_ranks_from_the_cache_or_tiktoken(shared_data_dir, monkeypatch):
    """gpt2_ranks() (the HF export's input) reads the cached file, else takes tiktoken's (and caches them)."""
    import tiktoken
    ranks = sources.load_ranks(shared_data_dir / "gpt2.tiktoken")
    enc = tiktoken.Encoding(name="gpt2", pat_str=sources.GPT2_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    assert sources.gpt2_ranks() == ranks and sources.gpt2_ranks_path() is not None
    monkeypatch.setattr(sources, "_save_ranks", lambda *a: None)  # an unwritable cache: tiktoken's ranks still
    sources.gpt2_ranks_path().unlink()
    assert sources.gpt2_ranks() == ranks and len(ranks) == 50256 and ranks[b"Hello"] == 15496


def test_gpt2_bad_ranks_file(monkeypatch):
    _no_tiktoken_download(monkeypatch)
    p = sources.gpt2_ranks_cache_path()
    p.parent.mkdir(parents=True)
    p.write_text("this is not base64 at all\n")
    with pytest.raises(ValueError, match="not a tiktoken ranks file") as ei:
        GPT2Tokenizer()
    assert str(p) in str(ei.value)
    p.write_text("SGVsbG8= 15496\n")
    with pytest.raises(ValueError, match="does not hold the GPT-2 BPE ranks"):
        GPT2Tokenizer()


def test_sources_cli_offline_reports_both_paths(monkeypatch, capsys):
    import tiktoken
    _offline(monkeypatch)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(OSError("no network")))
    assert sources.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    assert str(sources.shakespeare_cache_path()) in err[0] and str(sources.gpt2_ranks_cache_path()) in err[1]


def test_sources_cli_with_seeded_cache(cache_with_shakespeare, cache_with_gpt2, monkeypatch, capsys):
    _offline(monkeypatch)
    assert sources.main([]) == 0
    out = capsys.readouterr().out
    assert str(sources.shakespeare_cache_path()) in out and str(sources.gpt2_ranks_cache_path()) in out


def test_sources_cli_help_fetches_nothing(monkeypatch, capsys):
    monkeypatch.setattr(sources, "shakespeare_path", lambda: pytest.fail("--help must not fetch anything"))
    with pytest.raises(SystemExit) as ei:
        sources.main(["--help"])
    assert ei.value.code == 0 and "usage: python -m data.sources" in capsys.readouterr().out


def test_tests_find_the_data_in_the_default_cache(tmp_path, monkeypatch):
    """Data kept only in ~/.cache/tinygpt (as the docs' offline setup leaves it) is found, not silently skipped."""
    from tests.conftest import _find_shared_data
    cache = tmp_path / "home" / ".cache" / "tinygpt"
    (cache / "tinyshakespeare").mkdir(parents=True)
    (cache / "tokenizers").mkdir()
    (cache / "tinyshakespeare" / "input.txt").write_text("First Citizen:\n")
    (cache / "tokenizers" / "gpt2.tiktoken").write_text("ranks\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    found = _find_shared_data({}, repo=tmp_path / "elsewhere" / "repo")
    assert (found / "tinyshakespeare.txt").read_text() == "First Citizen:\n"
    assert (found / "gpt2.tiktoken").read_text() == "ranks\n"
    assert _find_shared_data({}, repo=tmp_path / "elsewhere" / "repo") is not None
    monkeypatch.setenv("HOME", str(tmp_path / "nobody"))
    assert _find_shared_data({}, repo=tmp_path / "elsewhere" / "repo") is None


def test_prepare_refuses_a_cached_file_that_is_not_tiny_shakespeare():
    from data.config import DataConfig
    from data.prepare import prepare
    sources.shakespeare_cache_path().parent.mkdir(parents=True)
    sources.shakespeare_cache_path().write_text("not the play\n")
    with pytest.raises(ValueError, match="is not Tiny Shakespeare .13 bytes; expected 1,115,394 bytes"):
        prepare(DataConfig(), progress=False)
