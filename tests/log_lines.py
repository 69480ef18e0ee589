"""A run's console lines read back as fields, so that tests check what each line says (its values),
not its exact text:

    fields("step 4/4: train loss 3.0000 | val loss 3.2500, bpb 2.0000 (best) | 1.00K tokens | 2s")
    == {"step": 4, "max_iters": 4, "train_loss": 3.0, "val_loss": 3.25, "val_bpb": 2.0,
        "best": True, "tokens": "1.00K", "elapsed": "2s"}

and a train line gives "loss", "grad_norm", "lr", "tok/s" (and "mfu")."""
from __future__ import annotations

import re
import shlex

SPLITS = ("train", "val")


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def fields(line: str) -> dict:
    """The fields of a step line (a train or an evaluation line); ValueError if it is not one."""
    head = re.match(r"step (\d+)/(\d+): ", line)
    if head is None:
        raise ValueError(f"not a step line: {line!r}")
    out: dict = {"step": int(head[1]), "max_iters": int(head[2])}
    for part in line[head.end():].split(" | "):
        if part.endswith(" (best)"):
            out["best"], part = True, part[:-len(" (best)")]
        words = part.replace(",", "").split()
        if len(words) == 1:
            out["elapsed"] = words[0]
        elif words[-1] in ("tokens", "tok/s"):
            out[words[-1]] = words[0]
        else:
            # an evaluation's split ("val loss 3.2500, bpb 2.0000"), a train metric ("lr 1.00e-03")
            prefix = f"{words.pop(0)}_" if words[0] in SPLITS else ""
            pairs = zip(words[::2], words[1::2])
            out.update({prefix + name: _number(value) for name, value in pairs})
    return out


def step_lines(messages: list[str]) -> list[dict]:
    """The fields of every step line among `messages` (a caplog's, a stdout's lines)."""
    return [fields(m) for m in messages if re.match(r"step \d+/\d+: ", m) and " took " not in m]


def eval_lines(messages: list[str]) -> list[dict]:
    """The fields of every evaluation line among `messages`."""
    return [f for f in step_lines(messages) if "val_loss" in f]


DONE = re.compile(r"done: (?P<steps>\d+) steps, (?P<tokens>\S+) tokens in (?P<time>\S+)"
                  r"(?: \((?P<session>\S+) this session\))?, "
                  r"(?:best val loss (?P<best_val_loss>\S+) at step (?P<best_step>\d+)"
                  r"|no evaluation); "
                  r"sample with: (?P<sample>.+)")


def done_fields(line: str) -> dict:
    """The closing line's fields: steps, tokens, time, session (a resumed run's), best_val_loss and
    best_step (None without an evaluation), sample (the command that samples from the run)."""
    m = DONE.fullmatch(line)
    if m is None:
        raise ValueError(f"not a done line: {line!r}")
    out = m.groupdict()
    out["steps"] = int(out["steps"])
    out["best_step"] = int(out["best_step"]) if out["best_step"] else None
    out["best_val_loss"] = float(out["best_val_loss"]) if out["best_val_loss"] else None
    return out


def resume_with(line: str) -> list[str]:
    """The command a closing line gives after "resume with: ", as argv."""
    assert "resume with: " in line, line
    return shlex.split(line.split("resume with: ", 1)[1])
