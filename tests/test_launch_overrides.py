"""launch/overrides.py (and launch/config.py's quoting): values quoted for Hydra's grammar read back unchanged;
arguments that are not overrides (nanoGPT's --flags and config files, a value the shell split, an unquoted non-ASCII
value) get the fix."""
from __future__ import annotations

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from launch.config import lexer_hint, quote
from launch.overrides import data_path_note, flag_hint, override, word_hint
from tests.helpers import REPO


@pytest.mark.parametrize("value", ["outputs/2026-01-01/10-00-00", "my runs/a b", "é/ü 中", "it's", 'say "hi"',
                                   "a\\", "a\\'b", "C:\\Users\\me\\runs", "true", "1e3", "x=y,z", "${oops}", "~/r"])
def test_a_quoted_value_reads_back_unchanged(value):
    parsed = OverridesParser.create().parse_overrides([override("hydra.run.dir", value)])[0]
    assert parsed.value() == value
    assert quote("outputs/run-1") == "outputs/run-1"  # plain values stay as they are


def test_nanogpt_flags_and_config_files_get_the_override_to_write():
    assert "write train.batch_size=32" in flag_hint("--batch_size=32")
    assert "write optim.lr=3e-4" in flag_hint("--learning_rate=3e-4")
    assert "write model.n_layer=..." in flag_hint("--n_layer")
    assert flag_hint("--cfg") is None and flag_hint("-m") is None
    assert "use experiment=shakespeare_char" in word_hint("config/train_shakespeare_char.py", None)
    assert "an experiment preset (cpu" in word_hint("config/train_gpt2.py", None)
    assert word_hint("a=1", None) is None


def test_a_value_split_by_the_shell_or_refused_by_the_lexer_gets_quotes():
    assert "\"hydra.run.dir='my runs/a'\"" in word_hint("runs/a", "hydra.run.dir=my")
    assert "not an override: write key=value" in word_hint("foo", None)
    assert "write \"hydra.run.dir='runs/é'\"" in lexer_hint("hydra.run.dir=runs/é")
    assert lexer_hint("no-equals-sign") is None


def test_data_path_without_a_data_group_is_noted():
    assert "add data=text" in data_path_note("shakespeare_char", "book.txt", ["data.path=book.txt"])
    assert data_path_note("text", "book.txt", ["data=text", "data.path=book.txt"]) is None
    assert data_path_note("shakespeare_char", "input.txt", ["data=shakespeare_char", "data.path=input.txt"]) is None
    assert data_path_note("shakespeare_char", None, []) is None


def test_printed_commands_name_the_script_by_a_path_that_runs_from_the_current_directory(monkeypatch):
    """Issue 43: `python train.py ...` printed by a run started from another directory did not run from there."""
    from common.platform import script
    from launch.overrides import resume_command
    monkeypatch.chdir(REPO)
    assert script("train.py") == "train.py" and resume_command("runs/a", []).startswith("python train.py ")
    monkeypatch.chdir(REPO / "docs")  # inside the repo, but not where train.py is: absolute
    assert script("sample.py") == str(REPO / "sample.py")
    assert resume_command("runs/a", []) == f"python {REPO / 'train.py'} hydra.run.dir=runs/a train.resume=true"


def test_the_resume_command_pastes_back_for_any_run_dir():
    """Quoted for Hydra's grammar and for the shell: the run dir comes back exactly, whatever its characters."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from launch.overrides import resume_command
    for run in ("outputs/2026-01-01/10-00-00", "my runs/é a", "it's here", 'a "b"'):
        parts = shlex.split(resume_command(run, ["model.n_layer=2", "data.path='my book.txt'"]))
        assert parts[:2] == ["python", str(REPO / "train.py")] and parts[-1] == "train.resume=true"  # (cwd: a tmp dir)
        parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(parts[2:])}
        assert parsed["hydra.run.dir"] == run and parsed["data.path"] == "my book.txt"
