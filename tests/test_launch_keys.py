"""launch/keys.py: docs/configuration.md's tables of keys and optimizers, written from the code
(issue 51): a field's comment trailing it or on the lines right above it, its default as the
command line writes it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest

from launch import keys


@dataclass
class Example:
    steps: int = 3  # a trailing comment
    # a comment above, over
    # two lines
    rate: float = 0.5
    # a section's comment, a blank line from the next field's

    # the field's own (the line above it)
    name: str = "a # not a comment"
    shape: tuple = (1,
                    2)  # a field over two lines


@dataclass
class Silent:
    told: int = 1  # told
    untold: Optional[int] = None


def test_a_field_s_comment_trails_it_or_sits_on_the_lines_above_it():
    """A trailing comment that makes its line too long moves onto the line above: read alike."""
    assert keys.field_comments(Example) == {
        "steps": "a trailing comment", "rate": "a comment above, over two lines",
        "name": "the field's own (the line above it)", "shape": "a field over two lines"}


def test_a_field_without_a_comment_names_itself_and_the_command():
    with pytest.raises(ValueError, match=r"tests/test_launch_keys.py: Silent.untold has no "
                                         r"comment: .* then run python -m launch.keys --write"):
        keys.field_comments(Silent)


def test_defaults_as_the_command_line_writes_them():
    assert [keys.shown(v) for v in (None, True, False, 2e-3, "auto", ["a", 1])] == [
        "null", "true", "false", "0.002", "auto", "[a, 1]"]
    assert keys.cell("a | b") == "a \\| b"  # a table cell keeps its column


def test_every_key_and_optimizer_has_its_row():
    from training.config import SCHEMA_KEYS
    from training.optim import OPTIMIZERS
    rows = "\n".join(keys.key_rows())
    assert all((f"| `{k}` |" in rows) == (k not in keys.LEFT_OUT) for k in SCHEMA_KEYS)
    # the default Config() has, and the field's comment
    assert "| `optim.lr` | `0.002` | peak learning rate" in rows
    optimizers = keys.optimizer_rows()
    assert [r.split("`")[1] for r in optimizers[2:]] == list(OPTIMIZERS)
    assert "`optim.muon_lr`" in optimizers[2 + list(OPTIMIZERS).index("muon")]


def test_a_stale_doc_is_told_with_the_command(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# x\n{keys.marker('keys')}\nstale row\n{keys.marker('keys', end=True)}\n"
                   f"{keys.marker('optimizers')}\n{keys.marker('optimizers', end=True)}\nafter\n")
    monkeypatch.setattr(keys, "DOC", doc)
    assert keys.main([]) == 1
    assert "stale: run python -m launch.keys --write" in capsys.readouterr().err
    assert keys.main(["--write"]) == 0 and keys.main(["--check"]) == 0
    text = doc.read_text()
    assert "stale row" not in text and "| `model.n_layer` |" in text and text.endswith("\nafter\n")
