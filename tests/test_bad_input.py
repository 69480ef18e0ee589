"""The bad-input table: user mistakes across train.py, sample.py, eval.py, export.py and `python -m data.prepare`.

Every row runs the real script in a subprocess and asserts what issue 7 promises for a mistake:
exit code 2 (never 0), stderr's last non-empty line is the one `error: ...` line and it names the
problem and the fix (key words per row), no Python traceback anywhere, and no existing file damaged:
the sha256 of every file of a real training run (last.pt, best.pt, metrics.jsonl, loss.png, .hydra/,
train.log), of the inputs and of the prepared-data cache is the same after the row, and the run
directory gains no files. The run is made once per module with train() and its prepared data is
reused by every row through TINYGPT_CACHE, so no row prepares data twice.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
        "train.batch_size=8", "train.eval_iters=2", "optim.warmup_iters=2", "train.eval_interval=2"]
BAD_BYTE_AT = 1234  # the non-UTF-8 corpus has byte 0xff here


def _corpus(n_chars: int = 20_000) -> str:
    rng = random.Random(7)
    words = ["the", "king", "queen", "sword", "love", "night", "day", "speak", "thou", "art", "my", "lord"]
    lines = []
    while sum(len(s) for s in lines) < n_chars:
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        lines.append(f"{rng.choice(['ROMEO', 'JULIET', 'KING'])}:\n{sent.capitalize()}.\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project dir with inputs/ (good and bad corpora, bad checkpoints), cache/, run/ (a real run), export/ (its
    HF export) and busy/ (a run directory this process holds the lock of)."""
    import torch
    from hydra import compose, initialize_config_dir

    from launch.config import register_configs
    from launch.run import train

    p = tmp_path_factory.mktemp("bad_input")
    inputs, cache = p / "inputs", p / "cache"
    inputs.mkdir()
    cache.mkdir()
    (inputs / "corpus.txt").write_text(_corpus(), encoding="utf-8")
    (inputs / "empty.txt").write_bytes(b"")
    (inputs / "short.txt").write_text("to be or not\n", encoding="utf-8")  # 13 chars: splits << block_size+1
    good = _corpus(3000).encode()
    (inputs / "latin1.txt").write_bytes(good[:BAD_BYTE_AT] + b"\xff" + good[BAD_BYTE_AT:])
    (inputs / "garbage.pt").write_bytes(random.Random(3).randbytes(50_000))
    (inputs / "no_wandb" / "wandb").mkdir(parents=True)  # first on PYTHONPATH: wandb "not installed"
    (inputs / "no_wandb" / "wandb" / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    _columnar_inputs(inputs)

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[*TINY, "data=text", f"data.path={inputs / 'corpus.txt'}",
                                           "train.max_iters=2"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYGPT_CACHE", str(cache))
        mp.setenv("WANDB_MODE", "disabled")
        mp.setenv("MPLCONFIGDIR", str(p / "mpl"))
        train(cfg, p / "run")
    torch.set_num_threads(threads)
    (p / "run" / ".hydra").mkdir()  # what a CLI run also has
    (p / "run" / ".hydra" / "config.yaml").write_text("# the run's config\n")
    (p / "run" / "train.log").write_text("[..][INFO] step 2/2: ...\n")
    last = (p / "run" / "last.pt").read_bytes()
    (inputs / "half.pt").write_bytes(last[: len(last) // 2])
    (inputs / "kept").mkdir()  # a trained model kept without its last.pt: a new run must not overwrite it
    (inputs / "kept" / "best.pt").write_bytes((p / "run" / "best.pt").read_bytes())
    assert {"last.pt", "best.pt", "metrics.jsonl", "loss.png"} <= {f.name for f in (p / "run").iterdir()}
    import export
    assert export.main(["--hf", str(p / "export"), "--run", str(p / "run")]) == 0  # an HF export of the run
    from common import run_lock
    run_lock.acquire(p / "busy")  # a run directory in use (by this process): resuming into it is refused
    yield p
    run_lock.release(p / "busy")


def _snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> digest); scratch/ (the rows' cwds) excluded."""
    out = {}
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.is_file() and not rel.startswith("scratch/"):
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


TRAIN = ["train.py", *TINY, "data=text", "data.path={inputs}/corpus.txt"]
SAMPLE = ["sample.py", "--run", "{run}", "--max-new-tokens", "5"]
PREPARE = ["-m", "data.prepare", "--data", "text", "--quiet"]

# (id, argv, key words the error line must contain, extra env, env vars to remove)
ROWS = [
    # --- data preparation
    ("prepare-missing-corpus", [*PREPARE, "--path", "{inputs}/missing.txt"],
     ["--path {inputs}/missing.txt does not exist", "give an existing text file"], {}, []),
    ("prepare-empty-corpus", [*PREPARE, "--path", "{inputs}/empty.txt"],
     ["{inputs}/empty.txt is empty", "give a text file with some content"], {}, []),
    ("prepare-non-utf8-corpus", [*PREPARE, "--path", "{inputs}/latin1.txt"],
     ["latin1.txt is not valid UTF-8", f"byte 0xff at byte offset {BAD_BYTE_AT:,}", "re-save the file as UTF-8",
      "--encoding-errors replace"], {}, []),
    # --- training: corpus
    ("train-missing-corpus", ["train.py", *TINY, "data=text", "data.path={inputs}/missing.txt"],
     ["data.path={inputs}/missing.txt does not exist", "give an existing text file"], {}, []),
    ("train-too-short-corpus", ["train.py", *TINY, "data=text", "data.path={inputs}/short.txt"],
     ["the text is too small to train on: the train split has only 11 tokens and the val split has only 2 tokens",
      "model.block_size=32 needs at least 33 in each split", "use a longer text (at least 330 tokens with "
      "data.val_fraction=0.1; the text: {inputs}/short.txt)"], {}, []),
    # --- training: configuration
    ("train-unknown-key", [*TRAIN, "train.max_iter=5"],
     ["unknown config key 'train.max_iter'", "did you mean train.max_iters?"], {}, []),
    ("train-wrong-type", [*TRAIN, "train.max_iters=abc"],
     ["cannot set train.max_iters=abc", "give a value of the right type"], {}, []),
    ("train-n_embd-not-divisible", [*TRAIN, "model.n_embd=33"],
     ["model.n_embd=33 is not divisible by model.n_head=2",
      "choose n_embd as a multiple of 2 x n_head", "(e.g. model.n_embd=32)"], {}, []),
    ("train-negative-lr", [*TRAIN, "optim.lr=-0.001"],
     ["optim.lr=-0.001 must be a positive number", "e.g. optim.lr=1e-3"], {}, []),
    ("train-seed-too-large", [*TRAIN, "train.seed=99999999999999999999"],
     ["train.seed=99999999999999999999 is too large", "from 0 to 4294967295", "e.g. train.seed=1337"], {}, []),
    ("train-unquoted-tilde", ["train.py", *TINY, "data=text", "data.path=~/corpus.txt"],
     ["cannot read the override data.path=~/corpus.txt", "write \"data.path='~/corpus.txt'\"",
      "data.path=$HOME/corpus.txt"], {}, []),
    # --- training: memory (refused before anything is allocated)
    ("train-batch-far-too-large", [*TRAIN, "train.batch_size=100000000"],
     ["train.batch_size=100000000 with model.block_size=32 needs about", "TiB of memory for one training step "
      "(estimate, for up to 256 distinct characters), but", "is available: lower train.batch_size to at most",
      "raise train.grad_accum_steps"], {}, []),
    ("train-model-too-large", [*TRAIN, "model=tiny", "model.n_embd=65536", "model.n_head=1"],
     ["the model (model.n_layer=2, model.n_embd=65536: 103.10B parameters) needs about 1.1 TiB of memory",
      "(estimate, for up to 256 distinct characters), but", "use a smaller model (lower model.n_embd or "
      "model.n_layer)"], {}, []),
    ("train-batch-too-large", [*TRAIN, "model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=64",
                               "train.batch_size=200000"],
     ["train.batch_size=200000 with model.block_size=64 needs about", "GiB of memory for one training step "
      "(estimate, for up to 256 distinct characters), but", "lower train.batch_size to at most",
      "or use a smaller model"], {}, []),
    # --- training: the run directory
    ("train-run-dir-under-a-file", [*TRAIN, "hydra.run.dir={inputs}/corpus.txt/run"],
     ["hydra.run.dir={inputs}/corpus.txt/run cannot be created", "{inputs}/corpus.txt is a file",
      "choose another hydra.run.dir"], {}, []),
    ("train-existing-run-without-resume", [*TRAIN, "hydra.run.dir={run}"],
     ["{run} already holds last.pt", "continue it with train.resume=true", "choose another hydra.run.dir"], {}, []),
    ("train-run-dir-with-only-best-pt", [*TRAIN, "hydra.run.dir={inputs}/kept"],
     ["{inputs}/kept already holds best.pt from an earlier run, which a new run would overwrite: choose another "
      "hydra.run.dir (to train on from it: train.resume={inputs}/kept/best.pt), or move it out of {inputs}/kept "
      "(nothing was overwritten)"], {}, []),
    ("train-run-dir-in-use", [*TRAIN, "hydra.run.dir={busy}", "train.resume=true"],
     ["hydra.run.dir={busy} is in use by another training run (pid {pid} on host", "wait for it to finish",
      "choose another hydra.run.dir"], {}, []),
    ("train-run-dir-is-cwd", [*TRAIN, "hydra.run.dir="],
     ["hydra.run.dir='' is the current directory", "give the run a directory of its own", "hydra.run.dir=runs/demo"],
     {}, []),
    # --- training: resuming
    ("train-resume-other-shape", [*TRAIN, "model.n_layer=3", "train.resume={run}/last.pt"],
     ["the model does not match the checkpoint", "n_layer=3", "resume with the checkpoint's model settings",
      "model.n_layer=2"], {}, []),
    ("train-resume-corrupt", [*TRAIN, "train.resume={inputs}/garbage.pt"],
     ["garbage.pt is not a PyTorch checkpoint", "use a last.pt or best.pt written by train.py"], {}, []),
    ("train-resume-truncated", [*TRAIN, "train.resume={inputs}/half.pt"],
     ["checkpoint {inputs}/half.pt is truncated", "use another checkpoint"], {}, []),
    ("train-wandb-online-without-key", [*TRAIN, "logger=wandb", "logger.mode=online"],
     ["logger.mode=online needs a W&B API key", "add logger.mode=offline"], {"HOME": "{cwd}"},
     ["WANDB_MODE", "WANDB_API_KEY"]),
    ("train-wandb-not-installed", [*TRAIN, "logger=wandb", "logger.mode=offline"],
     ["logger=wandb needs the wandb package, which is not installed", "pip install wandb"],
     {"PYTHONPATH": "{inputs}/no_wandb" + os.pathsep + str(REPO)}, []),
    # --- sampling
    ("sample-corrupt-checkpoint", ["sample.py", "--checkpoint", "{inputs}/garbage.pt"],
     ["garbage.pt is not a PyTorch checkpoint", "use a last.pt or best.pt"], {}, []),
    ("sample-truncated-checkpoint", ["sample.py", "--checkpoint", "{inputs}/half.pt"],
     ["{inputs}/half.pt is truncated", "use another checkpoint"], {}, []),
    ("sample-prompt-outside-vocab", [*SAMPLE, "--prompt", "Zed ñ"],
     ["2 character(s) outside the model's vocabulary: 'Z', 'ñ'", "only the characters of its training text"],
     {}, []),
    ("sample-negative-temperature", [*SAMPLE, "--temperature", "-0.5"],
     ["--temperature -0.5 is invalid", "use 0 (greedy) or a positive number"], {}, []),
    ("sample-top-p-zero", [*SAMPLE, "--top-p", "0"], ["--top-p 0.0 is outside (0, 1]", "e.g. --top-p 0.9"], {}, []),
    ("sample-top-k-negative", [*SAMPLE, "--top-k", "-1"], ["--top-k -1 is invalid", "whole number >= 0"],
     {}, []),
    ("sample-seed-too-large", [*SAMPLE, "--seed", "99999999999999999999"],
     ["--seed 99999999999999999999 is out of range", "use a whole number from 0 to"], {}, []),
    ("sample-attention-map-is-a-directory", [*SAMPLE, "--attention-map", "{inputs}"],
     ["--attention-map {inputs} is a directory", "give a file name"], {}, []),
    ("sample-negative-max-new-tokens", [*SAMPLE, "--max-new-tokens", "-3"],
     ["--max-new-tokens -3 is negative", "use 0 or more"], {}, []),
    ("sample-zero-samples", [*SAMPLE, "--num-samples", "0"], ["--num-samples 0 is invalid", "use 1 or more"], {}, []),
    ("sample-no-run", ["sample.py", "--prompt", "KING:"],
     ["no trained model found under ./outputs or ./multirun", "train one with `python ", "train.py`, or pass"], {},
     []),  # (train.py by a path that runs from {cwd})
    # --- columnar and jsonl sources (issue 22): inputs made by _columnar_inputs
    ("prepare-parquet-missing-column", [*PREPARE, "--path", "{inputs}/columns.parquet"],
     ["columns.parquet has no column 'text' (it has: body, n)", "set --text-key <the column that holds the text>"],
     {}, []),
    ("prepare-parquet-column-not-strings", [*PREPARE, "--path", "{inputs}/columns.parquet", "--text-key", "n"],
     ["columns.parquet: its column 'n' holds int64, not strings", "set --text-key <a column of strings>"], {}, []),
    ("prepare-corrupt-parquet", [*PREPARE, "--path", "{inputs}/shards"],
     ["{inputs}/shards/001.parquet is not a readable parquet file", "download or write it again"], {}, []),
    ("prepare-empty-parquet", [*PREPARE, "--path", "{inputs}/empty.parquet"],
     ["{inputs}/empty.parquet is empty (no rows)", "give a text file with some content"], {}, []),
    ("prepare-jsonl-text-not-a-string", [*PREPARE, "--path", "{inputs}/number.jsonl"],
     ["number.jsonl line 2: its 'text' is a number (int), not a string", "set --text-key <the field"], {}, []),
    ("prepare-directory-of-compressed-files", [*PREPARE, "--path", "{inputs}/gz"],
     ["has no .txt files (nor .jsonl, .json, .csv, .parquet, .arrow or a datasets save_to_disk directory; it has "
      "2 .gz)", "decompress them first (.gz files are compressed)"], {}, []),
    ("prepare-pyarrow-not-installed", [*PREPARE, "--path", "{inputs}/good.parquet"],
     ["good.parquet is a parquet file: reading it needs pyarrow, which is not installed: pip install pyarrow"],
     {"PYTHONPATH": "{inputs}/no_pyarrow" + os.pathsep + str(REPO)}, []),
    ("train-parquet-missing-column", ["train.py", *TINY, "data=text", "data.path={inputs}/columns.parquet"],
     ["columns.parquet has no column 'text' (it has: body, n)", "set data.text_key=<the column"], {}, []),
    # --- own BPE tokenizer (data.tokenizer=bpe)
    ("bpe-no-vocab-size", [*TRAIN, "data.tokenizer=bpe"],
     ["data.tokenizer=bpe needs the size of its vocabulary", "add data.vocab_size=4096"], {}, []),
    ("bpe-vocab-too-small", [*TRAIN, "data.tokenizer=bpe", "data.vocab_size=100"],
     ["data.vocab_size=100 is too small", "use at least data.vocab_size=257"], {}, []),
    ("bpe-vocab-too-large", [*TRAIN, "data.tokenizer=bpe", "data.vocab_size=10000000"],
     ["data.vocab_size=10000000 is too large", "use at most data.vocab_size=262144"], {}, []),
    ("bpe-vocab-not-an-int", [*TRAIN, "data.tokenizer=bpe", "data.vocab_size=4k"],
     ["cannot set data.vocab_size=4k", "give a value of the right type"], {}, []),
    ("bpe-tokenizers-missing", ["-c", "import runpy, sys; sys.modules['tokenizers'] = None; sys.argv = sys.argv[1:]; "
                                "runpy.run_path(sys.argv[0], run_name='__main__')", str(REPO / "train.py"),
                                *TRAIN[1:], "data.tokenizer=bpe", "data.vocab_size=4096"],
     ["tokenizers package, which is not installed: pip install tokenizers"], {}, []),
    ("sample-init-given-a-run", ["sample.py", "--init", "{run}"],
     ["--init {run} is a tinygpt training run, not a Hugging Face directory", "use --run {run}"], {}, []),
    ("sample-run-given-an-export", ["sample.py", "--run", "{export}"],
     ["run directory {export} is a Hugging Face directory", "not a training run", "use --init {export}"], {}, []),
    # --- eval and export
    ("eval-hf-given-a-run", ["eval.py", "--file", "{inputs}/corpus.txt", "--hf", "{run}"],
     ["--hf {run} is a tinygpt training run", "use --run {run}"], {}, []),
    ("eval-run-given-an-export", ["eval.py", "--file", "{inputs}/corpus.txt", "--run", "{export}"],
     ["run directory {export} is a Hugging Face directory", "use --hf {export}"], {}, []),
    ("export-force-over-other-files", ["export.py", "--hf", "{inputs}", "--run", "{run}", "--force"],
     ["--hf {inputs} is not an earlier export, and --force would delete its", "garbage.pt",
      "--force replaces only a directory export.py wrote", "choose a new directory"], {}, []),
    # issue 24, the training CLI's side (a refused resume in the run dir itself: .hydra/ and train.log unchanged)
    ("train-resume-refused-in-its-run-dir", [*TRAIN, "hydra.run.dir={run}", "train.resume=true", "model.n_layer=3"],
     ["the model does not match the checkpoint", "model.n_layer=2"], {}, []),
    ("train-resume-adamw-on-muon", [*TRAIN, "hydra.run.dir={run}", "train.resume=true", "optim=adamw"],
     ["does not fit this model", "resume with the settings it was trained with"], {}, []),
    ("train-nanogpt-flag", ["train.py", "--batch_size=32"], ["--batch_size=32 is a --flag", "write train.batch_size=32"],
     {}, []),
    ("train-nanogpt-config-file", ["train.py", "config/train_shakespeare_char.py"],
     ["is a Python config file", "use experiment=shakespeare_char"], {}, []),
    ("train-unquoted-non-ascii", [*TRAIN, "hydra.run.dir=runs/é"],
     ["Hydra needs quotes", "write \"hydra.run.dir='runs/é'\""], {}, []),
    ("train-path-split-at-a-space", [*TRAIN, "hydra.run.dir=my", "runs/a"],
     ["runs/a is not an override", "\"hydra.run.dir='my runs/a'\""], {}, []),
    ("train-misspelt-group", [*TRAIN, "optimizer=adamw"], ["unknown config key 'optimizer'", "optim=adamw",
                                                          "optim.name=adamw"], {}, []),
    ("train-logger-mode-without-wandb", [*TRAIN, "logger.mode=offline"],
     ["logger.mode=offline has no effect without logger=wandb", "add logger=wandb"], {}, []),
]


def _columnar_inputs(inputs: Path) -> None:
    """Parquet files with a wrong column, a cut-short shard, no rows; a jsonl with a number; gzip files; no pyarrow."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["some text"], "n": [5]}), inputs / "columns.parquet")
    pq.write_table(pa.table({"text": [_corpus(3000)]}), inputs / "good.parquet")
    (inputs / "shards").mkdir()
    pq.write_table(pa.table({"text": [_corpus(3000)]}), inputs / "shards" / "000.parquet")
    good = (inputs / "good.parquet").read_bytes()
    (inputs / "shards" / "001.parquet").write_bytes(good[: len(good) // 2])
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), inputs / "empty.parquet")
    (inputs / "number.jsonl").write_text('{"text": "fine"}\n{"text": 5}\n')
    (inputs / "gz").mkdir()
    for name in ("a.txt.gz", "b.txt.gz"):
        (inputs / "gz" / name).write_bytes(gzip.compress(b"hello\n"))
    (inputs / "no_pyarrow" / "pyarrow").mkdir(parents=True)
    (inputs / "no_pyarrow" / "pyarrow" / "__init__.py").write_text("raise ImportError(\"No module named 'pyarrow'\")\n")


@pytest.mark.slow
@pytest.mark.parametrize("row_id, argv, words, env_extra, env_unset", ROWS, ids=[r[0] for r in ROWS])
def test_mistake_gives_one_error_line_and_damages_nothing(project, row_id, argv, words, env_extra, env_unset):
    if row_id.endswith("too-large") and not Path("/proc/meminfo").exists():
        pytest.skip("the memory check needs Linux's MemAvailable (elsewhere these rows would really allocate)")
    cwd = project / "scratch" / row_id  # an empty directory (sample-no-run relies on it)
    cwd.mkdir(parents=True)
    fill = {"inputs": str(project / "inputs"), "run": str(project / "run"), "cwd": str(cwd),
            "busy": str(project / "busy"), "pid": str(os.getpid()), "export": str(project / "export")}
    argv = [a.format(**fill) for a in argv]
    words = [w.format(**fill) for w in words]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               TINYGPT_CACHE=str(project / "cache"), WANDB_MODE="disabled", MPLCONFIGDIR=str(project / "mpl"),
               HOME=str(cwd))
    env.update({k: v.format(**fill) for k, v in env_extra.items()})
    for k in env_unset:
        env.pop(k, None)
    if argv[0].endswith(".py"):
        argv = [str(REPO / argv[0]), *argv[1:]]
    before = _snapshot(project)
    run_files = sorted(f.name for f in (project / "run").iterdir())

    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), proc.stderr
    assert sum(ln.startswith("error:") for ln in lines) == 1, proc.stderr
    for w in words:
        assert w in lines[-1], f"{w!r} not in {lines[-1]!r}"
    after = _snapshot(project)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert changed == [], f"files damaged or removed: {changed}"
    assert sorted(f.name for f in (project / "run").iterdir()) == run_files
