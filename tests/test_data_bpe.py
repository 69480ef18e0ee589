"""data/bpe.py: the own BPE is learnt from the train split's start, cached by that text (a second preparation
does not train), and a model trained with it samples, scores, exports and fine-tunes (or refuses) clearly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import eval as eval_cli
import export
import sample
from data import bpe, corpus, sources
from data.config import DataConfig, resolve
from data.loader import TokenFile
from data.prepare import prepare
from tests.helpers import REPO
from launch.config import register_configs
from launch.run import train

register_configs()
TINY = ["experiment=cpu", "train.device=cpu", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
        "model.block_size=16", "train.batch_size=4", "train.eval_iters=2", "train.log_interval=2",
        "train.eval_at_start=false", "optim.warmup_iters=2"]


def bpe_cfg(path, **kw) -> DataConfig:
    return DataConfig(**{"name": "text", "path": str(path), "tokenizer": "bpe", "vocab_size": 300, **kw})


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = bpe.train

    def counting(texts, vocab_size):
        calls.append(vocab_size)
        return real(texts, vocab_size)

    monkeypatch.setattr(bpe, "train", counting)
    return calls


def test_sample_is_the_start_of_the_train_split(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo wörld " * 100, encoding="utf-8")  # 1,200 characters, 1,400 bytes
    n, _, pieces = corpus.scan(resolve(DataConfig(name="text", path=str(f))), "strict", False, 10 ** 6)
    assert n == 1200 and "".join(pieces) == "héllo wörld " * 100  # the scan collects the sample: no read of its own
    assert "".join(bpe.sample(pieces, 1080, 10 ** 6)) == ("héllo wörld " * 90)  # val never seen
    capped = "".join(bpe.sample(pieces, 1080, 100))
    assert capped == ("héllo wörld " * 90).encode()[:99].decode() and len(capped.encode()) <= 100


def test_trained_once_then_cached(tiny_corpus, spy):
    text = tiny_corpus.read_text(encoding="utf-8")
    p = prepare(bpe_cfg(tiny_corpus), progress=False)
    assert spy == [300] and p.tokenizer.vocab_size == 300 and p.meta["tokenizer"]["type"] == "bpe"
    cached = list((sources.cache_dir() / "tokenizers").glob("bpe-300-*.json"))
    assert len(cached) == 1 and cached[0].read_text(encoding="utf-8") == p.tokenizer.json
    ids = np.concatenate([np.asarray(TokenFile(x).tokens) for x in (p.train_path, p.val_path)])
    assert p.tokenizer.decode(ids.tolist()) == text
    again = prepare(bpe_cfg(tiny_corpus, encoding_errors="replace"), progress=False)  # new data, same sample
    assert spy == [300] and not again.cached and again.tokenizer.to_dict() == p.tokenizer.to_dict()
    assert prepare(bpe_cfg(tiny_corpus), progress=False).cached and spy == [300]
    other = prepare(bpe_cfg(tiny_corpus, vocab_size=320), progress=False)
    assert spy == [300, 320] and other.tokenizer.vocab_size == 320 and other.dir != p.dir
    cached[0].write_text("{damaged", encoding="utf-8")
    notes = []
    pieces = corpus.scan(resolve(bpe_cfg(tiny_corpus)), "strict", False, 10 ** 8)[2]
    tok = bpe.tokenizer_for(pieces, bpe_cfg(tiny_corpus),
                            p.meta["split"]["train_chars"], notes.append)
    assert spy == [300, 320, 300] and any("is unreadable" in n for n in notes) and tok.vocab_size == 300


def test_documents_are_separated_by_end_of_text(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps({"text": f"document {i}: the king speaks"}) + "\n" for i in range(40)))
    p = prepare(bpe_cfg(f, vocab_size=260), progress=False)
    ids = np.asarray(TokenFile(p.train_path).tokens).tolist()
    assert ids.count(p.tokenizer.eot_id) >= 30 and p.meta["source"]["separator"] == "<|endoftext|>"


def test_cli_trains_then_finds_it(tiny_corpus, capsys, spy):
    assert bpe.main(["--path", str(tiny_corpus), "--vocab-size", "300"]) == 0
    assert bpe.main(["--path", str(tiny_corpus), "--vocab-size", "300"]) == 0
    out, err = capsys.readouterr()
    assert spy == [300] and out.count("own BPE (300 tokens) for ") == 2 and "training a 300-token BPE" in err
    assert bpe.main(["--path", str(tiny_corpus), "--vocab-size", "12"]) == 2
    assert "--vocab-size 12 is too small" in capsys.readouterr().err


@pytest.mark.slow  # four tiny training runs (~10 s)
def test_train_sample_eval_export_and_finetune(tmp_path, tiny_corpus, capsys):
    transformers = pytest.importorskip("transformers")

    def cfg(*overrides):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            return compose("config", overrides=[*TINY, "data=text", f"data.path={tiny_corpus}",
                                                "data.tokenizer=bpe", "data.vocab_size=300", *overrides])

    assert train(cfg("train.max_iters=4", "train.eval_interval=4"), tmp_path / "run").status == "completed"
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ckpt["tokenizer"]["type"] == "bpe" and ckpt["model_config"]["vocab_size"] == 300
    assert sample.main(["--run", str(tmp_path / "run"), "--prompt", "KING:", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("KING:")

    (tmp_path / "t.txt").write_text(tiny_corpus.read_text()[:600], encoding="utf-8")
    assert eval_cli.main(["--file", str(tmp_path / "t.txt"), "--run", str(tmp_path / "run"), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert export.main(["--hf", str(tmp_path / "hf"), "--run", str(tmp_path / "run")]) == 0
    assert "AutoTokenizer.from_pretrained(d)" in capsys.readouterr().out
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = tiny_corpus.read_text()[:600]
    from data.tokenizer import tokenizer_from_dict
    assert hf.encode(text) == tokenizer_from_dict(ckpt["tokenizer"]).encode(text)
    assert eval_cli.main(["--file", str(tmp_path / "t.txt"), "--hf", str(tmp_path / "hf"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bits_per_byte"] == pytest.approx(scored["bits_per_byte"], rel=1e-5)

    last = f"model.init_from={tmp_path / 'run' / 'last.pt'}"
    with pytest.raises(ValueError, match="has its own 300-token BPE but data.vocab_size=320: leave "
                                         "data.vocab_size out"):
        # (typed on the command line; else the source's size is set)
        train(cfg(last, "data.vocab_size=320", "train.max_iters=1"), tmp_path / "ft0",
              cli_overrides=["data.vocab_size=320"])
    # other text: encoded with the source's BPE (byte-level: any text), not one learnt from it
    other = tmp_path / "other.txt"
    other.write_text(tiny_corpus.read_text()[::-1] + " naïve 你好 😀", encoding="utf-8")
    # no data.tokenizer given
    plain = [*TINY, "data=text", f"data.path={other}", last, "train.max_iters=1"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        plain = compose("config", overrides=plain)
    assert train(plain, tmp_path / "ft1").status == "completed"
    tokenizer = torch.load(tmp_path / "ft1" / "last.pt", weights_only=True)["tokenizer"]
    assert tokenizer == ckpt["tokenizer"]
    # the same text too
    assert train(cfg(last, "train.max_iters=1"), tmp_path / "ft2").status == "completed"


def test_a_given_tokenizer_file_encodes_the_data(tmp_path, tiny_corpus):
    """data.tokenizer_file (an imported model's tokenizer.json): used as it is, never trained; keyed by its text."""
    tok = bpe.train([tiny_corpus.read_text()], 300)
    (tmp_path / "tokenizer.json").write_text(tok.json)
    p = prepare(bpe_cfg(tiny_corpus, vocab_size=None, tokenizer_file=str(tmp_path / "tokenizer.json")), progress=False)
    assert p.tokenizer.to_dict() == tok.to_dict() and not list((sources.cache_dir() / "tokenizers").glob("bpe-*"))
    first = TokenFile(p.train_paths[0]).tokens[:50].tolist()
    assert first == tok.encode_ordinary(tiny_corpus.read_text())[:50]
    with pytest.raises(ValueError, match="vocab_size=301 differs from the 300 tokens of tokenizer_file="):
        prepare(bpe_cfg(tiny_corpus, vocab_size=301, tokenizer_file=str(tmp_path / "tokenizer.json")), progress=False)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevel"}}))
    with pytest.raises(ValueError, match="is not a byte-level BPE with <.endoftext.>"):
        prepare(bpe_cfg(tiny_corpus, vocab_size=None, tokenizer_file=str(tmp_path / "tokenizer.json")), progress=False)


def test_cli_messages_and_text_key(tmp_path, capsys):
    """Argument errors say `python -m data.bpe` once; --text-key picks the field, as data.prepare's does."""
    assert bpe.main(["--vocab-size", "300"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(see python -m data.bpe --help)" in err and "python python" not in err
    rows = "".join(json.dumps({"body": f"line {i} of the body text"}) + "\n" for i in range(50))
    (tmp_path / "c.jsonl").write_text(rows, encoding="utf-8")
    assert bpe.main(["--path", str(tmp_path / "c.jsonl"), "--vocab-size", "270", "--text-key", "body"]) == 0
    assert bpe.main(["--path", str(tmp_path / "c.jsonl"), "--vocab-size", "270"]) == 2
    assert "has no text under 'text' (it has: body): set --text-key <" in capsys.readouterr().err
