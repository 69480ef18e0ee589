"""common/startup.py: the trace's lines, in order and only when asked for (a mistyped switch: one warning line); and
train.py's and sample.py's phases, as a user sees them, with their times from the process's start."""
from __future__ import annotations

import gc
import sys

import pytest

from common import startup
from common.startup import Trace, parse
from tests.helpers import run_cli

TRAIN = ["python start-up", "torch import", "imports (Hydra, tinygpt)", "CUDA check", "config composed (Hydra)",
         "config checked", "device resolved", "memory check (on CUDA: its context made)",
         "run dir claimed, logging, notes", "data, model and optimizer built", "resume, compile set-up",
         "config printed", "before step 1 (a step-0 probe or evaluation)",
         "first step", "first logged step"]
SAMPLE = ["python start-up", "imports", "arguments checked", "torch import", "model loaded", "decode step",
          "first token"]
TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_kv_head=2",
        "model.n_embd=32", "model.block_size=16", "train.batch_size=4", "train.eval_iters=1", "train.max_iters=2"]


def in_order(trace: list[tuple[str, float, float]]) -> None:
    times = [at for _, at, _ in trace]
    assert times == sorted(times) and all(own >= 0 for _, _, own in trace), trace
    assert all(abs(at - before - own) < 0.02 for (_, before, _), (_, at, own) in zip(trace, trace[1:])), trace


def test_off_it_prints_nothing_and_leaves_the_items_alone(capsys):
    trace, items = Trace(""), iter([1, 2])
    trace.mark("a", wait=lambda: pytest.fail("waited while off"))
    assert trace.first(items, "first") is items
    assert capsys.readouterr() == ("", "")


def test_each_phase_is_a_line_in_order_until_the_last(capsys):
    trace = Trace(" startup ")
    for phase in ("one", "two"):
        trace.mark(phase)
    trace.mark("three", end=True)
    trace.mark("after the end")
    out, err = capsys.readouterr()
    lines = parse(err)
    assert out == "" and [p for p, _, _ in lines] == ["one", "two", "three"] and len(err.splitlines()) == 3
    in_order(lines)
    assert lines[0][1] == lines[0][2] > 0  # the first phase: the process's age (pytest's start-up included)


def test_a_device_is_waited_for_before_its_phase_ends(capsys):
    waited = []
    Trace("startup").mark("first step", wait=lambda: waited.append(True))
    assert waited == [True] and parse(capsys.readouterr().err)[0][0] == "first step"


@pytest.mark.parametrize("value", ["1", "on", "Startup"])
def test_an_unknown_value_is_one_warning_line_and_no_trace(value, capsys):
    trace = Trace(value)
    items = iter([1])
    trace.mark("a")
    trace.mark("b", end=True)
    assert trace.first(items, "first") is items
    err = capsys.readouterr().err
    assert err.splitlines() == [f"warning: TINYGPT_TRACE={value} is not a trace tinygpt has: set "
                                "TINYGPT_TRACE=startup (each start-up phase's seconds on stderr) or unset it"]


def test_the_first_item_is_marked_once_it_has_been_used(capsys):
    trace = Trace("startup")
    items = trace.first(iter("abc"), "first token")
    assert next(items) == "a" and capsys.readouterr().err == ""  # handed on: not yet used
    assert list(items) == ["b", "c"]
    assert [p for p, _, _ in parse(capsys.readouterr().err)] == ["first token"]
    assert list(Trace("startup").first([], "none")) == []  # (nothing to use: marked when asked)
    assert [p for p, _, _ in parse(capsys.readouterr().err)] == ["none"]


def test_the_collector_is_paused_around_torchs_import_only(monkeypatch):
    with startup.gc_paused():
        assert gc.isenabled()  # torch is in already (this process): nothing to pause for
    monkeypatch.delitem(sys.modules, "torch")
    frozen = gc.get_freeze_count()
    try:
        with startup.gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        with pytest.raises(ImportError), startup.gc_paused():
            raise ImportError("a failed import")
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_the_module_reads_the_switch_once_into_its_one_trace():
    assert (startup.mark, startup.first) == (startup._trace.mark, startup._trace.first)
    assert startup.SWITCH == "TINYGPT_TRACE" and startup.VALUE == "startup"


@pytest.mark.slow  # two training runs and two samples, each its own process
def test_train_and_sample_print_their_phases_in_order_only_when_asked(tmp_path, tiny_corpus):
    run = ["train.py", *TINY, "data=text", f"data.path={tiny_corpus}", "hydra.run.dir=run"]
    proc = run_cli(run, cwd=tmp_path, env={"TINYGPT_TRACE": "startup"}, check=True)
    trace = parse(proc.stderr)
    assert [p for p, _, _ in trace] == TRAIN and not parse(proc.stdout), proc.stderr
    in_order(trace)
    proc = run_cli(["sample.py", "--run", "run", "--max-new-tokens", "5", "--seed", "0"], cwd=tmp_path,
                   env={"TINYGPT_TRACE": "startup"}, check=True)
    trace = parse(proc.stderr)
    assert [p for p, _, _ in trace] == SAMPLE, proc.stderr
    in_order(trace)

    proc = run_cli([*run[:-1], "hydra.run.dir=run2"], cwd=tmp_path, env={"TINYGPT_TRACE": "yes"}, check=True)
    warnings = [line for line in proc.stderr.splitlines() if "TINYGPT_TRACE" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: TINYGPT_TRACE=yes") and not parse(proc.stderr)
    proc = run_cli(["sample.py", "--run", "run2", "--max-new-tokens", "5"], cwd=tmp_path, env={"TINYGPT_TRACE": ""},
                   check=True)
    assert not parse(proc.stderr) and "TINYGPT_TRACE" not in proc.stderr


@pytest.mark.slow  # a child Python (no torch)
def test_off_the_trace_imports_nothing(tmp_path):
    code = ("import sys; from common import startup; startup.mark('x'); "
            "print(sorted(m for m in ('psutil', 'common.platform', 're', 'typing') if m in sys.modules))")
    proc = run_cli(["-c", code], cwd=tmp_path, env={"TINYGPT_TRACE": ""}, check=True)
    assert proc.stdout.strip() == "[]" and proc.stderr == ""
