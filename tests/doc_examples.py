"""The example output that README and docs/ show, in one place. Each example is rendered here by
the functions a run prints with (training.metrics.RunLog's lines, runtime.signals' closing lines,
launch.notes' CPU note), from the numbers a real run showed (its page says which run), into the
code block that follows its marker in a page:

    <!-- example: cpu-run (python -m tests.doc_examples) -->

tests/test_docs_examples.py fails when a block is not its rendering (a line's format changed and
the docs were not updated); `python -m tests.doc_examples` rewrites every block from the code.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

if __name__ == "__main__":  # (python -m tests.doc_examples, from anywhere)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import REPO

PAGES = ("README.md", "docs/training.md", "docs/distributed.md", "docs/faults.md",
         "docs/sampling.md", "BENCHMARKS.md")
MARKER = re.compile(r"^<!-- example: ([\w-]+) \(python -m tests\.doc_examples\) -->\n"
                    r"```\n(.*?)^```$", re.M | re.S)
# Tiny Shakespeare, characters: its tokenizer, train and val tokens, cache directory
SHAKESPEARE = ("char (65 characters)", 1_003_854, 111_540,
               "~/.cache/tinygpt/prepared/shakespeare_char-char-6f6a4e890b805290")


def _config(overrides: list[str]):
    from launch.config import compose, register_configs, to_dataclass
    register_configs()
    return to_dataclass(compose(overrides))


class Transcript:
    """A run's lines as it prints them, from explicit numbers: `overrides` as on train.py's command
    line; `processes` > 1 a torchrun job (`parallel` ddp or fsdp, over `backend`)."""

    def __init__(self, overrides: list[str], run_dir: str, processes: int = 1,
                 parallel: str = "ddp", backend: str = "gloo", device: str = "CPU, 2 threads"):
        from training.metrics import RunLog
        from training.state import TrainState
        self.overrides, self.run_dir, self.device = overrides, Path(run_dir), device
        self.config = _config(overrides)
        self.ranks = self._ranks(processes, parallel, backend)
        t, block = self.config.train, self.config.model.block_size
        self.state = TrainState(batch_tokens=t.batch_size * t.grad_accum_steps * processes * block)
        self.report, self.lines = RunLog(t.max_iters), []

    @staticmethod
    def _ranks(processes: int, parallel: str, backend: str):
        if processes == 1:
            from runtime.ranks import Ranks
            return Ranks()
        from runtime.distributed import ProcessGroup
        return ProcessGroup(0, processes, 0, processes, parallel, backend=backend)

    @contextlib.contextmanager
    def _printing(self):
        """RunLog's lines into self.lines, its files in a scratch directory, on the example's
        machine."""
        import launch.overrides
        import viz.loss_plot  # noqa: F401 - imported before the scratch directory is the cwd
        lines, handler = self.lines, logging.Handler(logging.INFO)
        handler.emit = lambda record: lines.append(record.getMessage())
        logger = logging.getLogger("training.metrics")
        level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        try:
            with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch), \
                    mock.patch("training.metrics.device_name", lambda device: self.device), \
                    mock.patch("training.metrics.script", lambda name: name), \
                    mock.patch("viz.loss_plot.plot_loss"):
                yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)

    def start(self, step: int = 0, resumed_from: str | None = None,
              best: tuple[float, int] | None = None,
              config_diff: tuple[str, ...] = ()) -> list[str]:
        """The opening lines; of a run resumed from `resumed_from` at `step` (with its best val loss
        and step), the settings `config_diff` changed."""
        import torch
        from model.gpt import GPT
        from training.precision import setup_precision
        st, since = self.state, len(self.lines)
        st.step, st.tokens = step, step * st.batch_tokens
        if best is not None:
            st.best_val_loss, st.best_step = best
        describe, train_tokens, val_tokens, cache = SHAKESPEARE
        data = types.SimpleNamespace(tokenizer=types.SimpleNamespace(describe=lambda: describe),
                                     dir=cache, token_files=lambda: (range(train_tokens),
                                                                     range(val_tokens)))
        torch.manual_seed(0)
        model = GPT(self.config.model.with_vocab(65))
        precision = setup_precision(torch.device("cpu"), "float32")
        with self._printing():
            self.report.start(self.config, self.run_dir, st, data=data, model=model,
                              precision=precision, compiled=False, ranks=self.ranks, source=None,
                              resumed_from=Path(resumed_from) if resumed_from else None,
                              config_diff=list(config_diff))
            self.report.file.close()
            self.report.file = open(os.devnull, "w")
        return self.lines[since:]

    def _started(self) -> None:
        if self.report.file is None:  # (its opening lines not shown)
            self.start()

    def train(self, step: int, loss: float, grad_norm: float, lr: float,
              tokens_per_s: float) -> str:
        """A train line (the progress bar's text; a line of its own without a terminal)."""
        self._started()
        with self._printing():
            self.report.log_train(step, {"loss": loss, "grad_norm": grad_norm}, lr,
                                  step * self.state.batch_tokens, 0.0, tokens_per_s)
        return self.lines[-1]

    def eval(self, step: int, train: float, val: float, elapsed: float, saved: bool = True) -> str:
        """An evaluation line: "(best)" when val improves on the best so far (never before the first
        step, an evaluation that saves nothing: `saved` False)."""
        self._started()
        st = self.state
        improved = saved and val < st.best_val_loss
        if improved:
            st.best_val_loss, st.best_step = val, step
        st.step, st.tokens = step, step * st.batch_tokens
        stats = self._evaluate(train, val)
        with self._printing():
            self.report.log_eval(step, stats, 0.0, st.tokens, elapsed, improved)
        return self.lines[-1]

    def _evaluate(self, train: float, val: float) -> dict[str, dict]:
        """The statistics training.loop.evaluate computes for a model whose loss is `train` on
        the train split and `val` on val: the code's names and formulas (a statistic added there
        shows here), the example's losses; one byte per token."""
        import torch
        from runtime.ranks import Ranks
        from training.hooks import Hooks
        from training.loop import evaluate

        class Fixed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight, self.loss = torch.nn.Parameter(torch.zeros(1)), 0.0

            def forward(self, x, y):
                return None, torch.tensor(self.loss)
        model = Fixed()

        def batch(split: str, i: int):
            model.loss = {"train": train, "val": val}[split]
            return torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)
        run = types.SimpleNamespace(
            config=self.config, ranks=Ranks(), step_model=model, token_bytes=torch.ones(65),
            loader=types.SimpleNamespace(eval_batch=batch),
            precision=types.SimpleNamespace(autocast=contextlib.nullcontext))
        return evaluate(run, Hooks())

    def done(self, wall: float, before: float = 0.0) -> str:
        """A completed run's closing line: `wall` this session's seconds, `before` earlier ones'."""
        st = self.state
        st.elapsed_s = before
        with self._printing():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.report.file = open(self.run_dir / "metrics.jsonl", "w")
            self.report.finish("completed", st, wall=wall, train_s=wall, session_tokens=st.tokens,
                               compiled=False, early_stopped=False)
        return self.lines[-1]

    def stopped(self, stop: str, step: int) -> str:
        """The closing line of a run that `stop` (a signal's name) stopped after `step`."""
        from runtime.signals import closing_line
        return closing_line(stop, step, self.run_dir, self.run_dir / "last.pt", step,
                            self.resume(), aborted=False)

    def interrupted(self, step: int, shown: list[str] | None = None) -> str:
        """The closing line of a run a second Ctrl-C aborted, its last.pt from `step`; `shown`: the
        overrides its resume command shows (["..."]: elided)."""
        from runtime.signals import interrupted_line
        return interrupted_line(self.run_dir, self.run_dir / "last.pt", step, self.resume(shown))

    def resume(self, shown: list[str] | None = None) -> str:
        from launch.overrides import resume_command
        with mock.patch("launch.overrides.script", lambda name: name):
            overrides = self.overrides if shown is None else shown
            return resume_command(self.run_dir, overrides, self.ranks)


def cpu_note(overrides: list[str]) -> str:
    """launch.notes' line for a machine without CUDA that got the CPU preset."""
    from launch.notes import cpu_note
    return cpu_note(_config(overrides))


def pick(lines: list[str], *starts: str) -> list[str]:
    """The lines that start with one of `starts`, in order."""
    return [line for line in lines if line.startswith(starts)]


# the examples, by the names the pages' markers give; each from a real run, as its page says

def cpu_run() -> list[str]:
    """README's and docs/training.md's "What you will see": `python train.py`, 2 idle cores."""
    run = Transcript(["experiment=cpu"], "outputs/2026-11-25/22-43-23")
    every = run.config.train.log_interval
    return [*run.start(), cpu_note(["experiment=cpu"]),
            f"...{' ' * 42}(a progress bar on a terminal; a line per {every} steps otherwise)",
            run.eval(180, train=1.6994, val=1.8555, elapsed=29), run.done(wall=31)]


def resume() -> list[str]:
    """docs/training.md's "Resuming": stopped by Ctrl-C after step 101, resumed to step 300."""
    overrides = ["experiment=cpu", "train.max_iters=300"]
    first, second = Transcript(overrides, "runs/demo"), Transcript(overrides, "runs/demo")
    return ["...", first.train(100, loss=1.9255, grad_norm=0.8102, lr=4.03e-3, tokens_per_s=2.6e3),
            first.stopped("SIGINT", 101), "...",
            *pick(second.start(101, resumed_from="runs/demo/last.pt"), "resumed from"), "...",
            second.eval(180, train=1.7203, val=1.8942, elapsed=168), "...",
            second.eval(300, train=1.5726, val=1.7541, elapsed=285),
            second.done(wall=215, before=71)]


def train_further() -> list[str]:
    """docs/training.md: `train.resume=runs/demo/last.pt` with train.max_iters=400."""
    run = Transcript(["experiment=cpu", "train.max_iters=400"], "outputs/2026-11-25/23-01-00")
    lines = run.start(300, resumed_from="runs/demo/last.pt", best=(1.7541, 300),
                      config_diff=("train.max_iters 300 -> 400",))
    return pick(lines, "resumed from", "resuming with")


def interrupted() -> list[str]:
    """docs/training.md: a second Ctrl-C (the run's overrides elided)."""
    return [Transcript(["experiment=cpu"], "runs/demo").interrupted(100, ["..."])]


def interrupted_faults() -> list[str]:
    """docs/faults.md: a second Ctrl-C (the run's overrides and directory elided)."""
    return [Transcript(["experiment=cpu"], "...").interrupted(20, ["..."])]


def ddp_banner() -> list[str]:
    """docs/distributed.md: the start of an 8-GPU run of experiment=shakespeare_char."""
    run = Transcript(["experiment=shakespeare_char"], "outputs/run", processes=8, backend="nccl")
    return pick(run.start(), "parallel", "global batch")


CPU_JOB = ["experiment=cpu_nanogpt", "train.device=cpu", "train.batch_size=6",
           "train.eval_interval=50"]


def ddp_cpu() -> list[str]:
    """docs/distributed.md's "Try it on a CPU": DDP over 2 processes."""
    run = Transcript([*CPU_JOB, "train.max_iters=100"], "runs/ddp", processes=2)
    return [*pick(run.start(), "parallel", "global batch"),
            run.eval(0, train=4.1720, val=4.1624, elapsed=1, saved=False),
            run.eval(50, train=2.9060, val=2.9433, elapsed=7),
            run.eval(100, train=2.5968, val=2.6413, elapsed=13), run.done(wall=17)]


def fsdp_cpu() -> list[str]:
    """docs/distributed.md: the same run under FSDP2, resumed to step 150, exported."""
    fsdp = ["train.parallel=fsdp"]
    first = Transcript([*CPU_JOB, "train.max_iters=100", *fsdp], "runs/fsdp", 2, "fsdp")
    second = Transcript([*CPU_JOB, "train.max_iters=150", *fsdp], "runs/fsdp", 2, "fsdp")
    resumed = second.start(100, resumed_from="runs/fsdp/last_dcp", best=(2.6413, 100))
    return [*pick(first.start(), "parallel"), "...",
            first.eval(100, train=2.5968, val=2.6413, elapsed=28), "...",
            *pick(resumed, "resumed from"), second.eval(150, train=2.4969, val=2.5409, elapsed=34),
            "wrote runs/fsdp/last_full.pt"]  # (export.py's line)


def two_nodes() -> list[str]:
    """docs/distributed.md: two machines of one process each, simulated on one."""
    run = Transcript(["experiment=cpu_nanogpt", "train.device=cpu", "train.max_iters=100"],
                     "runs/two_nodes", processes=2)
    return [*pick(run.start(), "parallel", "global batch"), "...",
            run.eval(100, train=2.5513, val=2.5635, elapsed=23)]


EXAMPLES = {"cpu-run": cpu_run, "resume": resume, "train-further": train_further,
            "interrupted": interrupted, "interrupted-faults": interrupted_faults,
            "ddp-banner": ddp_banner, "ddp-cpu": ddp_cpu, "fsdp-cpu": fsdp_cpu,
            "two-nodes": two_nodes}


def rendered(pages=PAGES) -> dict[str, tuple[str, str]]:
    """Each page's text as it is, and as it should be: every marked block its example's lines."""
    done: dict[str, str] = {}

    def block(m: re.Match) -> str:
        name = m[1]
        if name not in EXAMPLES:
            raise KeyError(f"no example {name!r} in tests/doc_examples.py: {', '.join(EXAMPLES)}")
        if name not in done:
            done[name] = "\n".join(EXAMPLES[name]()) + "\n"
        return m[0][:m.start(2) - m.start()] + done[name] + "```"
    texts = {page: (REPO / page).read_text(encoding="utf-8") for page in pages}
    return {page: (text, MARKER.sub(block, text)) for page, text in texts.items()}


if __name__ == "__main__":
    for page, (text, fresh) in rendered().items():
        if fresh != text:
            (REPO / page).write_text(fresh, encoding="utf-8")
            print(f"rewrote the example output in {page}")
