"""Messages for people: every user mistake is reported as one line (what is wrong, how to fix it)."""
from __future__ import annotations


def one_line(message: object) -> str:
    """Any text or exception as one line: its non-empty lines joined by spaces (an exception with no text
    gives its type's name)."""
    text = str(message)
    if isinstance(message, BaseException) and not text.strip():
        return type(message).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def error_line(e: BaseException) -> str:
    """The one `error: ...` line a CLI prints for a user mistake (an OS error names its file)."""
    if isinstance(e, OSError) and e.strerror and e.filename:
        return f"error: {e.filename}: {e.strerror}"
    return "error: " + one_line(e)
