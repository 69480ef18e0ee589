"""bench.py's `prep` section: `python -m data.prepare` as a user runs it, on a generated corpus as text, jsonl and
(with pyarrow) parquet: MB/s and the peak memory (RSS) of each run, in its own process so each peak is its own."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import REPO, load_avg, run_child, say


def _write_corpus(kind: str, text: str, copies: int, path: Path) -> Path:
    """`copies` documents of `text` as one .txt file, a .jsonl file or a .parquet file."""
    if kind == "text":
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(copies):
                f.write(text)
    elif kind == "jsonl":
        line = json.dumps({"text": text}) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            for _ in range(copies):
                f.write(line)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": [text] * copies}), path, row_group_size=16)
    return path


BPE_VOCAB = 4096  # the own BPE's size in the rows that train one


# The child reports its own peak memory as it exits: wait4's ru_maxrss would also count what this (torch-loaded)
# process held when it forked the child, which Linux carries across exec.
_CHILD = """import atexit, os, runpy, sys
from common.platform import peak_rss
def report():
    with open(os.environ["TINYGPT_BENCH_PEAK"], "w") as f:
        f.write(str(peak_rss() or ""))
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _run(path: Path, tokenizer: str, env: dict, text_bytes: int) -> dict:
    """One preparation (tokenizer "bpe-train": only training the own BPE, `python -m data.bpe`) in a child process:
    wall seconds, MB/s of text (`text_bytes`, whatever the file's format) and the child's peak RSS."""
    if tokenizer == "bpe-train":
        args = ["data.bpe", "--path", str(path), "--vocab-size", str(BPE_VOCAB)]
    else:
        args = ["data.prepare", "--data", "text", "--path", str(path), "--tokenizer", tokenizer, "--quiet",
                *(["--vocab-size", str(BPE_VOCAB)] if tokenizer == "bpe" else [])]
    peak_file = path.with_name("peak.txt")
    t0 = time.perf_counter()
    proc = run_child([sys.executable, "-c", _CHILD, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, text=True, env={**env, "TINYGPT_BENCH_PEAK": str(peak_file)})
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]}
    peak = peak_file.read_text() if peak_file.is_file() else ""
    return {"seconds": round(secs, 2), "mb_per_s": round(text_bytes / 1e6 / secs, 2),
            "peak_rss_mib": round(int(peak) / 2**20, 1) if peak else None}


def section_prep(args, precision) -> dict:
    from data import sources
    from data.encode import threads
    text, ranks = sources.shakespeare_path().read_text(encoding="utf-8"), sources.gpt2_ranks_path()
    copies = math.ceil(args.prep_mb * 1e6 / len(text.encode()))
    kinds = [("text", "gpt2"), ("text", "char"), ("jsonl", "gpt2")]
    notes = []
    if importlib.util.find_spec("pyarrow") is not None:
        kinds.append(("parquet", "gpt2"))
    else:
        notes.append("parquet skipped: pyarrow is not installed (pip install pyarrow)")
    if importlib.util.find_spec("tokenizers") is not None:  # the own BPE: training alone, then a whole preparation
        kinds += [("text", "bpe-train"), ("text", "bpe")]
    else:
        notes.append("own-BPE rows skipped: tokenizers is not installed (pip install tokenizers)")
    res = {"copies": copies, "threads": threads(), "rows": [], "notes": notes, "load_avg_before": load_avg()}
    with tempfile.TemporaryDirectory(prefix="tinygpt-bench-prep-") as tmp:
        cache = Path(tmp) / "cache"
        if ranks is not None:  # the GPT-2 ranks, found where the user keeps them
            (cache / "tokenizers").mkdir(parents=True)
            os.symlink(ranks, cache / "tokenizers" / "gpt2.tiktoken")
        env = {**os.environ, "TINYGPT_CACHE": str(cache)}
        for kind, tok in kinds:
            path = _write_corpus(kind, text, copies, Path(tmp) / f"corpus.{'txt' if kind == 'text' else kind}")
            say("prep", f"{kind}, {tok}, {len(text.encode()) * copies / 1e6:.1f} MB of text ({copies} x Tiny "
                        f"Shakespeare)")
            text_bytes = len(text.encode()) * copies  # MB/s of text: a parquet file is compressed
            row = {"source": kind, "tokenizer": tok, "bytes": text_bytes, "file_bytes": path.stat().st_size,
                   **_run(path, tok, env, text_bytes)}
            res["rows"].append(row)
            path.unlink()
    return {**res, "load_avg_after": load_avg()}


def print_prep(p: dict, w) -> None:
    w(f"\n== data preparation (python -m data.prepare, {p['copies']} x Tiny Shakespeare, {p['threads']} "
      f"encoder thread{'s' * (p['threads'] != 1)}) ==")
    for r in p["rows"]:
        head = f"  {r['source']:8} {r['tokenizer']:9} {r['bytes'] / 1e6:8.1f} MB  "
        w(head + (f"error: {r['error']}" if "error" in r else
                  f"{r['mb_per_s']:8.2f} MB/s  ({r['seconds']:.1f} s; peak RSS "
                  + ("-" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:,.0f} MiB") + ")"))
    w(f"  (bpe-train: training a {BPE_VOCAB}-token BPE alone, python -m data.bpe; bpe: the preparation, with the "
      f"tokenizer that row cached; MB/s: of text, also for compressed parquet)",
      *(f"  note: {n}" for n in p.get("notes", [])))
