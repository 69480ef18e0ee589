"""How much of the project a newcomer follows for one small run: `python -m benchmarks.codepath [--nanogpt DIR]`.

coverage.py's executed lines of the project's own files (tests excluded) for the tiny CPU training run and for
sampling from it, with nanoGPT's figures for its own README commands beside them when a nanoGPT checkout is given
(its Shakespeare characters are prepared from tinygpt's cached copy: no download). docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = ["train.py", "model=tiny", "train.device=cpu", "train.max_iters=2", "train.eval_interval=1",
         "train.eval_iters=1"]
NANO_TRAIN = ["train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=1",
              "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
              "--max_iters=2", "--lr_decay_iters=2000", "--dropout=0.0",
              "--eval_interval=2", "--always_save_checkpoint=True"]  # (so that sample.py finds a checkpoint)
NANO_SAMPLE = ["sample.py", "--out_dir=out-shakespeare-char", "--device=cpu", "--start=ROMEO:", "--max_new_tokens=5",
               "--num_samples=1"]


def executed(root: Path, args: list[str], cwd: Path, work: Path) -> dict[str, int]:
    """{file relative to root: executed lines} of `python args...` run in cwd, tests excluded."""
    data, out = work / "cov", work / "cov.json"
    env = dict(os.environ, WANDB_MODE="disabled")
    r = subprocess.run([sys.executable, "-m", "coverage", "run", f"--data-file={data}", f"--source={root}", *args],
                       cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"error: {' '.join(args)} failed in {cwd}:\n{r.stderr[-2000:]}")
    subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", str(out)], cwd=cwd,
                   capture_output=True, check=True)
    report = json.loads(out.read_text())["files"]
    files = {os.path.relpath(f, root): len(v["executed_lines"]) for f, v in report.items()}
    return {f: n for f, n in files.items() if n and not f.startswith("tests")}


def report(label: str, files: dict[str, int], detail: bool) -> None:
    print(f"{label}: {sum(files.values())} lines in {len(files)} files")
    for f, n in sorted(files.items(), key=lambda kv: -kv[1]) if detail else ():
        print(f"   {n:5d} {f}")


def nanogpt(root: Path, work: Path) -> tuple[dict, dict]:
    prepared = root / "data" / "shakespeare_char"
    if not (prepared / "train.bin").is_file():  # its prepare.py downloads input.txt only when it is missing
        from common.files import cache_dir
        shutil.copyfile(cache_dir() / "tinyshakespeare" / "input.txt", prepared / "input.txt")
        subprocess.run([sys.executable, "prepare.py"], cwd=prepared, check=True, capture_output=True)
    return executed(root, NANO_TRAIN, root, work), executed(root, NANO_SAMPLE, root, work)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.codepath", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout, measured beside tinygpt")
    ap.add_argument("--files", action="store_true", help="also list each file's executed lines")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train = executed(REPO, [str(REPO / TRAIN[0]), *TRAIN[1:]], work, work)
        run_dir = work / "outputs" / "latest"
        sample = executed(REPO, [str(REPO / "sample.py"), "--run", str(run_dir), "--prompt", "ROMEO:",
                                 "--max-new-tokens", "5"], work, work)
        report("tinygpt train", train, args.files)
        report("tinygpt sample", sample, args.files)
        if args.nanogpt:
            nano_train, nano_sample = nanogpt(args.nanogpt.resolve(), work)
            report("nanoGPT train", nano_train, args.files)
            report("nanoGPT sample", nano_sample, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
