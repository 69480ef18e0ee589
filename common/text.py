"""Messages for people: every user mistake is reported as one line (what is wrong, how to fix it)."""
from __future__ import annotations

import contextlib
import string


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


def failure_reason(e: BaseException) -> str:
    """`Type: first line` of e, or of the exception it wraps when its own text is empty; after a header ending
    in ':' (torch 2.6's "backend='inductor' raised:") the next line, which already names its type."""
    for _ in range(10):  # a chain, never a cycle
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if lines or inner is None:
            break
        e = inner
    if len(lines) > 1 and lines[0].endswith(":"):
        return lines[1][:200]
    return (f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__)[:200]


class _Keys(dict):
    """{name}: the key of setting `name`; {name=}: that key before a value (key=, or a flag and a space: --path x)."""

    def __missing__(self, field: str) -> str:
        key = self.get(field.rstrip("="), field.rstrip("="))
        return key if not field.endswith("=") else key + (" " if key.startswith("-") else "=")


def setting_error(template: str, *values, cls: type[Exception] = ValueError, keys: dict | None = None):
    """A user mistake about settings, named as the raiser names them: `template` (str.format) writes a setting as
    {name} or {name=} and the values shown as {0}, {1}, ...; an edge with other names for them uses `in_keys`."""
    e = cls(string.Formatter().vformat(template, values, _Keys(keys or {})))
    e.setting_template = template, values
    return e


@contextlib.contextmanager
def in_keys(keys: dict[str, str]):
    """A `setting_error` raised inside comes out (same type) naming each setting by its key in `keys`."""
    try:
        yield
    except Exception as e:
        if not hasattr(e, "setting_template"):
            raise
        raise setting_error(e.setting_template[0], *e.setting_template[1], cls=type(e), keys=keys) from None
