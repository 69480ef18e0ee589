"""How tinygpt talks to people: every user mistake is one line (what is wrong, how to fix it), and a command
prints it as one `error: ...` line on stderr with exit code 2, whether argparse, a file or the model found it; a
reader that leaves (`| head`) ends the command quietly. Standard library only: model/ and data/ use it too."""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import string
import sys
from pathlib import Path
from typing import Any, Callable

from common.interrupt import EXIT_INTERRUPTED


def count(n: int, noun: str) -> str:
    """'1 layer', '2 layers': a number and its noun, for messages."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what the shell reports for `seq 1000000 | head -1`, so pipefail sees it too


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument raises ValueError (the CLI's main() prints it as one line, exit 2); an unknown
    --flag that is another spelling of one of ours is told the one to write: nanoGPT's or another tinygpt CLI's
    (`spellings`: its name -> our flag, which takes the value, or a function of the value -> what to write), or ours
    with underscores (--max_new_tokens), as train.py translates nanoGPT's --key=value (launch/overrides.py); before
    any other error, so that the hint is what a mistyped command gets."""

    def __init__(self, *args, spellings: dict[str, str | Callable[[str | None], str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.spellings, self._given = spellings or {}, []

    def parse_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def _habit(self, extras: list[str]) -> str | None:
        """The first unknown `--name[=value]` (or `--name value`) we have another spelling of, and that spelling."""
        from common.platform import command_line
        for i, arg in enumerate(extras):
            name, eq, value = arg.partition("=")
            if not name.startswith("--") or name in self._option_string_actions:
                continue
            if not eq and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
                value, arg = extras[i + 1], f"{arg} {extras[i + 1]}"
            ours, value = self.spellings.get(name[2:]), value if eq or value else None
            if ours is None and name.replace("_", "-") in self._option_string_actions:
                ours = name.replace("_", "-")
            if callable(ours):
                return f"{self.prog} takes {ours(value)}, not {arg}"
            if ours is not None:
                nargs = self._option_string_actions[ours].nargs if ours in self._option_string_actions else None
                return f"{self.prog} takes {command_line([ours, *[value] * (value is not None and nargs != 0)])}, " \
                       f"not {arg}"
        return None

    def error(self, message):
        if m := re.fullmatch(r"argument (?:\S+/)?(\S+): ignored explicit argument '(.*)'", message):  # --compile=False
            message = f"{m[1]}={m[2]}: {m[1]} takes no value: write {m[1]} alone, or leave it out"
        message = self._habit(self._given) or message  # (a required flag missing: the other spelling is why)
        from common.platform import script
        prog = script(self.prog) if self.prog.endswith(".py") else self.prog  # (runs from where the user is)
        raise ValueError(f"{message} (see python {prog} --help)")


def nanogpt_init_from(option: str) -> Callable[[str | None], str]:
    """nanoGPT's --init_from for an inference CLI: 'resume' means its out_dir (our --run DIR), a model name our
    `option` for a local Hugging Face directory (--init, --hf)."""
    return lambda value: "--run DIR (the run directory: nanoGPT's out_dir)" if value in (None, "resume") else \
        f"{option} {value} (a local Hugging Face directory)"


def read_text_file(path: str, option: str) -> str:
    """The UTF-8 text of the file `path` (- = stdin) given with `option`; one-line errors that name the option."""
    try:
        return (sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()).decode("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{option} {path} does not exist: check the path") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{option} {path} is a directory: give a text file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{option} {path} is not UTF-8 text (invalid byte at offset {e.start}): "
                         "save it as UTF-8") from None


def exit_quietly_on_broken_pipe(main: Callable[[], Any]) -> Any:
    """main()'s exit code, its output flushed; when the reader of stdout has left (`| head -3`): no traceback,
    no "Exception ignored" at exit (stdout is pointed at devnull, as the Python docs on SIGPIPE advise), and
    EXIT_BROKEN_PIPE. An argparse SystemExit (--help) is flushed the same way."""
    try:
        try:
            code = main()
        except SystemExit as e:
            code = e.code
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, ValueError, OSError):  # a replaced stdout (tests, IDEs): nothing to redirect
            return EXIT_BROKEN_PIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)  # what is still buffered is flushed there at exit
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def cli_main(run, argv: list[str] | None, oom_hint: str | None = None) -> int:
    """run(argv) as a command: ValueError/OSError (user mistakes) as one line and exit 2, Ctrl-C as exit 130,
    a closed pipe (`| head`) quietly; with `oom_hint`, running out of memory (a resource problem) as one line."""
    return exit_quietly_on_broken_pipe(lambda: _run(run, argv, oom_hint))


def _run(run, argv: list[str] | None, oom_hint: str | None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:
        print(flush=True)  # end the half-printed line
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # an OSError, but no user mistake: exit_quietly_on_broken_pipe's
    except (ValueError, OSError) as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:
        if oom_hint is None or not re.search(r"out of memory|can't allocate memory", str(e), re.IGNORECASE):
            raise
        print(f"error: out of memory {oom_hint}", file=sys.stderr)
        return 1
