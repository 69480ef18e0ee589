"""A task that shows supervised fine-tuning teaching a model to answer, offline and checkable
exactly: seeded conversations that ask to spell a made-up word ("Spell brom." -> "b-r-o-m") or to
reverse it ("Reverse brom." -> "morb"), some under a system message. Words are random lowercase
letters; a tenth of all words (by a hash of the word) are held out, so the held-out file asks only
about words no training conversation has. Every character is one of Tiny Shakespeare's, so the CPU
preset's char-level model can be fine-tuned on it.

    python -m data.chat_tasks --out chat_task    # train.jsonl (20,000), heldout.jsonl (200)

`evals/chat_exact.py` (eval.py --chat-exact) scores the held-out answers by exact match.
"""
from __future__ import annotations

# first, so that a Ctrl-C during the imports below ends quietly too
if __name__ == "__main__":
    from common.interrupt import stop_quietly
    stop_quietly()

import json
import random
import string
import sys
import zlib
from pathlib import Path

from common.cli import ArgumentParser, cli_main
from common.files import write_text_atomic

TASKS = {
    "spell": (("Spell {w}.", "How do you spell {w}?"), lambda w: "-".join(w)),
    "reverse": (("Reverse {w}.", "What is {w} backwards?"), lambda w: w[::-1]),
}
# short: every conversation fits the CPU preset's 64 tokens
SYSTEMS = ("Be brief.", "Answer well.")
# letters per word, both included
LENGTHS = (3, 6)


def held_out(word: str) -> bool:
    """A tenth of all words, fixed by the word alone: never in train.jsonl, only in heldout.jsonl.
    """
    return zlib.crc32(word.encode()) % 10 == 0


def conversation(rng: random.Random, tasks: list[str], heldout: bool) -> dict:
    """One seeded conversation: a question about a word of the chosen split and its exact answer."""
    while True:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(*LENGTHS)))
        if held_out(word) == heldout:
            break
    phrasings, answer = TASKS[rng.choice(tasks)]
    messages = [{"role": "user", "content": rng.choice(phrasings).format(w=word)},
                {"role": "assistant", "content": answer(word)}]
    if rng.random() < 0.25:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    return {"messages": messages}


def generate(n: int, seed: int, tasks: list[str], heldout: bool) -> list[dict]:
    rng = random.Random(f"{seed}-{'heldout' if heldout else 'train'}")
    return [conversation(rng, tasks, heldout) for _ in range(n)]


def write(out: Path, n_train: int, n_heldout: int, seed: int, tasks: list[str]) -> list[Path]:
    """train.jsonl and heldout.jsonl in `out`."""
    paths = []
    for name, n, heldout in (("train.jsonl", n_train, False), ("heldout.jsonl", n_heldout, True)):
        rows = generate(n, seed, tasks, heldout)
        paths.append(write_text_atomic(out / name, "".join(json.dumps(r) + "\n" for r in rows)))
    return paths


def run(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="-m data.chat_tasks", description="Write a seeded spelling / reversing "
                                                              "task as chat conversations: "
                                                              "train.jsonl and heldout.jsonl "
                                                              "(words never seen in training).")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write train.jsonl and "
                                                               "heldout.jsonl")
    p.add_argument("--train", type=int, default=20_000, metavar="N", help="training conversations "
                                                                          "(default 20,000)")
    p.add_argument("--heldout", type=int, default=200, metavar="N", help="held-out conversations "
                                                                         "(default 200)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--tasks", default="spell,reverse", help="comma-separated, of "
                                                            f"{', '.join(TASKS)} (default both)")
    a = p.parse_args(argv)
    tasks = [t for t in a.tasks.split(",") if t]
    if not tasks or (bad := [t for t in tasks if t not in TASKS]):
        raise ValueError(f"--tasks {a.tasks!r} is not known: use a comma-separated list of "
                         f"{', '.join(TASKS)}")
    if a.train < 1 or a.heldout < 1:
        raise ValueError("--train and --heldout must be at least 1")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a directory")
    out.mkdir(parents=True, exist_ok=True)
    for path in write(out, a.train, a.heldout, a.seed, tasks):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(run, None))
