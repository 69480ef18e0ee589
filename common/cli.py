"""The inference CLIs' argument parser: a usage mistake is one `error: ...` line, like every other mistake."""
from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument raises ValueError (the CLI's main() prints it as one line, exit 2)."""

    def error(self, message):
        raise ValueError(f"{message} (see python {self.prog} --help)")
