"""Conversations read for supervised fine-tuning (`data=chat`): JSONL lines in the OpenAI / Hugging
Face shape (`{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}`) or
Alpaca's (`{"instruction": ..., "input": ..., "output": ...}`), from a file or the .jsonl files
under a directory.

Every mistake is one line naming the file, the line number and what to fix; `check_messages` is the
one check of a message list, for the training data and the OpenAI endpoint's requests alike.
"""
from __future__ import annotations

import json
from pathlib import Path

ROLES = ("system", "user", "assistant")
SUFFIXES = (".jsonl",)


def check_messages(messages, where: str, *, answered: bool = True) -> list[dict]:
    """`messages` as a list of {"role", "content"} (a copy), or a one-line ValueError starting with
    `where`. A system message may come first only; `answered`: at least one assistant message
    (training needs an answer)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{\"role\": ..., "
                         "\"content\": ...} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"{where}: message {i} must be an object with 'role' and 'content', "
                             f"got {json.dumps(m)[:60]}")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ValueError(f"{where}: message {i} has role {role!r}: use one of "
                             f"{', '.join(ROLES)}")
        if role == "system" and i:
            raise ValueError(f"{where}: message {i} is a system message: a system message may only "
                             "come first")
        # OpenAI's content parts: their text pieces joined
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ValueError(f"{where}: message {i} has content parts other than text: only "
                                 "text is read")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise ValueError(f"{where}: message {i}'s 'content' must be a string, got "
                             f"{type(content).__name__}")
        out.append({"role": role, "content": content})
    if answered and not any(m["role"] == "assistant" for m in out):
        raise ValueError(f"{where}: the conversation has no assistant message: there is no answer "
                         "to learn")
    return out


def from_alpaca(row: dict, where: str) -> list[dict]:
    """Alpaca's instruction / input / output as a user message (instruction, a blank line, input)
    and the answer."""
    for key in ("instruction", "output"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"{where}: an Alpaca row needs a string {key!r} (and may have "
                             "'input')")
    extra = row.get("input") or ""
    if not isinstance(extra, str):
        raise ValueError(f"{where}: an Alpaca row's 'input' must be a string")
    user = row["instruction"] + (f"\n\n{extra}" if extra else "")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]


def conversation(line: str, where: str) -> list[dict]:
    """One JSONL line as a checked conversation."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno}): each line must "
                         "be one JSON object") from None
    if isinstance(row, dict) and "messages" in row:
        return check_messages(row["messages"], where)
    if isinstance(row, dict) and "instruction" in row:
        return from_alpaca(row, where)
    raise ValueError(f"{where}: expected an object with 'messages' (OpenAI / Hugging Face chat) or "
                     f"'instruction' and 'output' (Alpaca), got {line.strip()[:60]}")


def chat_files(given: list[str]) -> list[Path]:
    """The .jsonl files `given` names: files as they are, directories' .jsonl files sorted by
    relative path."""
    files = []
    for g in given:
        p = Path(g).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"data.path={g} does not exist: give a .jsonl file of "
                                    "conversations or a directory of them")
        found = [p] if not p.is_dir() else sorted(f for f in p.rglob("*")
                                                  if f.is_file() and f.suffix in SUFFIXES)
        if not found:
            raise ValueError(f"data.path={g} holds no .jsonl files: data=chat reads conversations "
                             "from .jsonl files")
        files += found
    return files


def read_conversations(files: list[Path]) -> list[tuple[str, list[dict]]]:
    """Every conversation of `files` in order, with where it is ("file:line"); blank lines are
    skipped."""
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text (byte {e.start:,}): save it as UTF-8") \
                from None
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                out.append((f"{path}:{n}", conversation(line, f"{path}:{n}")))
    if not out:
        raise ValueError(f"{', '.join(map(str, files))} holds no conversations: write one JSON "
                         "object per line")
    return out
