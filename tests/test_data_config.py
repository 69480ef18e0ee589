"""data/config.py: DataConfig's checks for the own BPE tokenizer (the others: tests/test_data_prepare.py)."""
from __future__ import annotations

import sys

import pytest

from data.config import DataConfig


def bpe(**kw) -> DataConfig:
    return DataConfig(**{"name": "text", "path": "a.txt", "tokenizer": "bpe", **kw})


@pytest.mark.parametrize("cfg, words", [
    (bpe(), "tokenizer=bpe needs the size of its vocabulary: add vocab_size=4096 (from 257 to 262,144 tokens)"),
    (bpe(vocab_size=100), "vocab_size=100 is too small: a byte-level BPE has 256 byte tokens and <|endoftext|>, so "
                          "use at least vocab_size=257"),
    (bpe(vocab_size=10 ** 7), "vocab_size=10000000 is too large: use at most vocab_size=262144"),
    (bpe(vocab_size="4k"), "vocab_size='4k' is not a whole number of tokens: e.g. vocab_size=4096"),
    (bpe(vocab_size=4096.5), "vocab_size=4096.5 is not a whole number of tokens"),
    (bpe(vocab_size=True), "vocab_size=True is not a whole number"),
    (bpe(vocab_size=4096, tokenizer_sample_mb=0), "tokenizer_sample_mb=0 must be a positive number of MB"),
    (DataConfig(name="text", path="a.txt", tokenizer="gpt2", vocab_size=4096),
     "vocab_size=4096 applies only to tokenizer=bpe (the gpt2 vocabulary is fixed)"),
    (DataConfig(tokenizer="bpe", vocab_size=4096), "name=shakespeare_char is char-level but tokenizer=bpe was given"),
    (DataConfig(name="text", path="a.txt", tokenizer_file="t.json"), "tokenizer_file=t.json applies only to "
                                                                      "tokenizer=bpe: add tokenizer=bpe"),
    (bpe(tokenizer_file="missing.json"), "tokenizer_file='missing.json' is not a file: give the path of a "
                                         "tokenizer.json"),
])
def test_bad_bpe_settings_are_one_line(cfg, words):
    with pytest.raises(ValueError) as e:
        cfg.validate()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bpe_settings_and_the_effective_tokenizer():
    assert bpe(vocab_size=257).validate() == "bpe"
    assert DataConfig(name="shakespeare", tokenizer="bpe", vocab_size=4096).validate() == "bpe"
    assert DataConfig(name="shakespeare", tokenizer="gpt2").validate() == "gpt2"
    assert DataConfig().validate() == "char"


def test_a_tokenizer_file_sets_the_size(tmp_path):
    (tmp_path / "t.json").write_text("{}")  # read when the data is prepared (tests/test_data_bpe.py)
    assert bpe(tokenizer_file=str(tmp_path / "t.json")).validate() == "bpe"
    assert bpe(tokenizer_file=str(tmp_path / "t.json"), vocab_size=300).validate() == "bpe"


def test_bpe_without_the_tokenizers_package_fails_at_validation(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ValueError, match="tokenizers package, which is not installed: pip install tokenizers"):
        bpe(vocab_size=4096).validate()
    assert DataConfig(name="text", path="a.txt", tokenizer="gpt2").validate() == "gpt2"  # only bpe needs it
