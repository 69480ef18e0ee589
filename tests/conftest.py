"""Shared fixtures: every test is hermetic (own cache dir, own cwd, wandb off, no network).

Real data (Tiny Shakespeare, GPT-2 BPE ranks) comes from the shared data directory: `$TINYGPT_SHARED_DATA`,
else `../shared/data` beside the repo, else a cache that holds it (`$TINYGPT_CACHE`, `~/.cache/tinygpt`); tests
that need it skip when absent, saying where they looked.
"""
from __future__ import annotations

import functools
import multiprocessing.process
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

def _find_shared_data(environ=os.environ, repo: Path = REPO) -> Path | None:
    """`$TINYGPT_SHARED_DATA`, else `../shared/data` beside the repo (tinyshakespeare.txt, gpt2.tiktoken), else a
    cache that has them (tinyshakespeare/input.txt, tokenizers/gpt2.tiktoken): `$TINYGPT_CACHE` as the session
    began (the layout .ci/run seeds), else the default `~/.cache/tinygpt`, seen through a temporary directory."""
    candidates = [Path(environ["TINYGPT_SHARED_DATA"])] if environ.get("TINYGPT_SHARED_DATA") else []
    for c in [*candidates, repo.parent / "shared" / "data"]:
        if (c / "tinyshakespeare.txt").is_file():
            return c
    for cache in (environ.get("TINYGPT_CACHE"), "~/.cache/tinygpt"):
        c = Path(cache).expanduser() if cache else None
        if c is not None and (c / "tinyshakespeare" / "input.txt").is_file():
            d = Path(tempfile.mkdtemp(prefix="tinygpt-tests-data-"))
            for name, src in (("tinyshakespeare.txt", c / "tinyshakespeare" / "input.txt"),
                              ("gpt2.tiktoken", c / "tokenizers" / "gpt2.tiktoken")):
                if src.is_file():
                    (d / name).symlink_to(src.resolve())
            return d
    return None


SHARED_DATA = _find_shared_data()


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip (one reason, no error) on a machine without a CUDA GPU; pytest-xdist's workers
    list the slow tests first (see pytest_xdist_make_scheduler)."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # (stable: the files' order in each)
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent under -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's default (`--dist load`) hands each worker runs of consecutive tests fixed in advance (at first a
    quarter of its share): the slow ones of a run stay on their worker, the other may idle at the end, and a file's
    module-scoped fixture (test_runtime_distributed's torchrun runs: a minute) runs on both workers when its tests
    are split. Here the workers take the tests two or three at a time, slow ones first (so that the two finish
    together on the quick ones), and a file with a module-scoped fixture is one unit, run by one worker.
    (`--dist loadgroup` with xdist_group marks cannot do it under pytest 9.2 with pytest-xdist 3.8: the mark
    renames the test, and pytest 9 ignores the new name, so every group is silently split.)"""
    if config.getvalue("dist") != "load":  # another --dist asked for
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneAtATime(LoadScopeScheduling):  # its units in the order collected, the larger units first
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _has_module_fixture(path) else nodeid

    return OneAtATime(config, log)


@functools.cache
def _has_module_fixture(path: str) -> bool:
    """Whether the test file (relative to the repo) defines a fixture shared by several of its tests."""
    try:
        text = (REPO / path).read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r"scope=[\"'](module|class|package)[\"']", text) is not None


# ------------------------------------------------------------------ the quick set (-m "not slow") stays quick
# A child Python costs 1-3 s (torch's import) on 2 cores, so every test that starts one is marked `slow`.
# While an unmarked test sets up or runs, starting a Python process (subprocess, torchrun, multiprocessing)
# fails it at once with the fix; other programs (matplotlib's fc-list, mount) stay allowed.
_fast_test: str | None = None  # the node id of the unmarked test now running, else None
_PYTHON = re.compile(r"(python[0-9.]*|torchrun)$")


def _refuse_if_fast(what: str) -> None:
    if _fast_test is not None:
        pytest.fail(f"{_fast_test} starts a Python process ({what}): mark it @pytest.mark.slow "
                    "(the quick set, `python -m pytest -m 'not slow'`, starts none)", pytrace=False)


def _program(args, executable) -> str:
    if executable is None:
        if isinstance(args, (str, bytes)):
            args = args.split() or [""]
        executable = args if isinstance(args, os.PathLike) else list(args)[0]
    return os.fsdecode(executable)


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _guarded_popen_init(self, args, *rest, **kwargs):
    if _fast_test is not None:
        program = _program(args, kwargs.get("executable"))
        if _PYTHON.match(os.path.basename(program)) or os.path.realpath(program) == os.path.realpath(sys.executable):
            _refuse_if_fast(f"subprocess {program}")
    _popen_init(self, args, *rest, **kwargs)


def _guarded_process_start(self):
    _refuse_if_fast("multiprocessing")
    _process_start(self)


def pytest_configure(config):
    subprocess.Popen.__init__ = _guarded_popen_init
    multiprocessing.process.BaseProcess.start = _guarded_process_start


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init
    multiprocessing.process.BaseProcess.start = _process_start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _as_fast_test(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _as_fast_test(item))


def _as_fast_test(item):
    global _fast_test
    _fast_test = None if item.get_closest_marker("slow") else item.nodeid
    try:
        return (yield)
    finally:
        _fast_test = None


# Ctrl-C tests send SIGINT to CLI subprocesses, which inherit this process's disposition: a pytest started in
# the background by a non-interactive shell ignores SIGINT, and so would they (sample.py would never stop).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.pop("TINYGPT_TRACE", None)  # a developer's start-up trace (common/startup.py): not in the tests' output

# One matplotlib font cache for the whole session: CLI subprocesses would otherwise rebuild it under each
# test's fresh cache dir (~0.5 s per run), and it must never land in the user's HOME.
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="tinygpt-tests-mpl-"))


@pytest.fixture(autouse=True)
def _hermetic(tmp_path, monkeypatch):
    """Fresh cache dir and cwd per test; wandb can never reach the network."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TINYGPT_CACHE", str(cache))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture
def environ_restored():
    """For a test that runs an entry point's main() in this process (train.main, cheaper than a child Python): what
    it sets in os.environ (the compile caches under this test's cache dir, the OpenMP wait policy) is undone."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _one_thread():
    """In-process tests use tiny tensors: threads only add OpenMP waits (10-50x slower on a busy 2-core box)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def shared_data_dir() -> Path:
    if SHARED_DATA is None:
        pytest.skip("Tiny Shakespeare not found (looked in $TINYGPT_SHARED_DATA, ../shared/data, $TINYGPT_CACHE and "
                    "~/.cache/tinygpt): set TINYGPT_SHARED_DATA to a directory with tinyshakespeare.txt")
    return SHARED_DATA


def _seed(dest: Path, src: Path) -> Path:
    if not src.is_file():
        pytest.skip(f"{src} not available")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.symlink_to(src)
    return dest


@pytest.fixture
def cache_with_shakespeare(shared_data_dir) -> Path:
    """The per-test cache seeded with Tiny Shakespeare where the download code looks first."""
    cache = Path(os.environ["TINYGPT_CACHE"])
    _seed(cache / "tinyshakespeare" / "input.txt", shared_data_dir / "tinyshakespeare.txt")
    return cache


@pytest.fixture
def cache_with_gpt2(shared_data_dir) -> Path:
    """The per-test cache seeded with the GPT-2 BPE ranks file (tiktoken format)."""
    cache = Path(os.environ["TINYGPT_CACHE"])
    _seed(cache / "tokenizers" / "gpt2.tiktoken", shared_data_dir / "gpt2.tiktoken")
    return cache


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    """~20 KB of deterministic pseudo-English made of a few dozen distinct characters."""
    rng = random.Random(1234)
    words = ["the", "king", "queen", "sword", "love", "night", "day", "speak", "thou", "art",
             "my", "lord", "good", "fair", "what", "is", "this", "come", "go", "away"]
    lines = []
    while sum(len(l) + 1 for l in lines) < 20_000:
        speaker = rng.choice(["ROMEO", "JULIET", "KING", "NURSE"])
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        lines.append(f"{speaker}:\n{sent.capitalize()}{rng.choice('.!?,;')}\n")
    path = tmp_path / "tiny.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def tiny_gpt_config():
    from model.config import GPTConfig
    return GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)
