"""Messages for people: a setting error says its settings in the raiser's names until an edge renames them."""
from __future__ import annotations

import pytest

from common.text import in_keys, setting_error


def test_setting_error_names_its_settings_and_keeps_its_type():
    e = setting_error("{path=}{0} does not exist: point {path} at a file ({1!r})", "a{b}.txt", 1,
                      cls=FileNotFoundError)
    assert type(e) is FileNotFoundError and str(e) == "path=a{b}.txt does not exist: point path at a file (1)"
    for keys, said in (({"path": "data.path"}, "data.path=a{b}.txt does not exist: point data.path at a file (1)"),
                       ({"path": "--path"}, "--path a{b}.txt does not exist: point --path at a file (1)")):
        with pytest.raises(FileNotFoundError) as info, in_keys(keys):
            raise e
        assert str(info.value) == said


def test_in_keys_passes_other_errors_through_and_decorates():
    plain = ValueError("path=x is wrong")
    with pytest.raises(ValueError) as info, in_keys({"path": "data.path"}):
        raise plain
    assert info.value is plain

    @in_keys({"n": "model.n"})
    def build(n):
        raise setting_error("{n=}{0} must be positive", n)

    with pytest.raises(ValueError, match="^model.n=0 must be positive$"):
        build(0)
