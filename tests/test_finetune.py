"""Fine-tuning (`model.init_from`, training/init_from.py): from a tiny random Hugging Face GPT-2 saved by
transformers (the step-0 loss is transformers' loss on the same batch) or from a tinygpt run; the shape comes
from the source, a smaller block_size crops it; every bad input is one line; HF -> fine-tune -> export.py ->
eval.py round trip."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from checkpoint import file as ck
from tests.helpers import REPO, approx_record, run_cli
from tests.test_checkpoint_manager import FORMAT_1
from training import init_from
from launch.config import register_configs, to_dataclass
from training.config import Config
from launch.run import train

register_configs()

# the automatic CPU preset, as `python train.py` on a CPU applies it: its tiny shape is overruled by the source
BASE = ["experiment=cpu", "train.device=cpu", "train.eval_iters=2", "train.log_interval=1", "optim=adamw",
        "optim.warmup_iters=0", "optim.schedule=constant", "optim.min_lr=0"]
GPT2_DATA = ["data=text", "data.tokenizer=gpt2"]


def make_cfg(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=[*BASE, *overrides])


def records(run, kind):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


@pytest.fixture
def tiny_hf(tmp_path):
    """(directory, model) of a random GPT-2 with the real vocabulary: 2 layers, 2 heads, 64 wide, context 128."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=128,
                                                                 vocab_size=50257))
    model.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf", model.eval()


def hf_loss(model, x, y) -> float:
    with torch.no_grad():
        return F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten()).item()


@pytest.mark.slow
def test_from_hugging_face_the_step_0_loss_is_transformers_and_falls(tmp_path, tiny_hf, cache_with_gpt2,
                                                                     tiny_corpus, monkeypatch):
    from data.loader import BatchLoader
    from data.tokenizer import GPT2Tokenizer, token_bytes
    hf_dir, hf_model = tiny_hf
    batches, real_next = [], BatchLoader.next_batch
    monkeypatch.setattr(BatchLoader, "next_batch", lambda self: batches.append(real_next(self)) or batches[-1])
    run, crop = tmp_path / "run", ["model.block_size=64"]  # explicit: crops the context of 128
    res = train(make_cfg(*GPT2_DATA, f"data.path={tiny_corpus}", f"model.init_from={hf_dir}", "model.dropout=0",
                         "train.batch_size=4", "train.max_iters=6", "train.eval_interval=3", "optim.lr=3e-3",
                         "train.eval_at_start=true", *crop), run, cli_overrides=crop)
    assert (res.status, res.step, res.exit_code) == ("completed", 6, 0)
    trains, evals = records(run, "train"), records(run, "eval")
    x, y = batches[0]
    assert x.shape == (4, 64)
    assert abs(trains[0]["loss"] - hf_loss(hf_model, x, y)) <= 1e-5  # step 0: transformers' loss, same batch
    assert trains[0]["step"] == 1 and trains[0]["tokens"] == 4 * 64  # a fresh run: step, tokens, schedule
    # the evaluation at step 0 too, and its bits per byte: nats / ln 2 / the bytes of the targets
    from data.prepare import prepare
    tb = token_bytes(GPT2Tokenizer())
    prepared = prepare(to_dataclass(make_cfg(*GPT2_DATA, f"data.path={tiny_corpus}")).data, progress=False)
    loader = BatchLoader(prepared.train_path, prepared.val_path, 64, 4, seed=1337)
    val = [loader.eval_batch("val", i) for i in range(2)]
    want = sum(hf_loss(hf_model, *b) for b in val) / 2
    assert evals[0]["step"] == 0 and abs(evals[0]["val_loss"] - want) <= 1e-5
    assert evals[0]["val_bpb"] == pytest.approx(want * 4 * 64 * 2 / math.log(2) / sum(int(tb[b[1]].sum()) for b in val),
                                                rel=1e-5)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.05  # it learns
    last = ck.load_checkpoint(run / "last.pt")
    assert sorted(last) == sorted(FORMAT_1)  # format 1, nothing added
    assert last["config"]["model"]["init_from"] == str(hf_dir.resolve())  # where the weights came from
    assert {k: last["model_config"][k] for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")} \
        == {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "vocab_size": 50257, "bias": True}
    assert last["model"]["transformer.wpe.weight"].shape == (64, 64)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_from_llama_or_qwen3_its_tokenizer_is_the_runs(tmp_path, tiny_corpus, monkeypatch, capsys, kind):
    """A Llama / Qwen3 directory: its tokenizer.json tokenizes the data and is the checkpoint's tokenizer (as an
    own BPE is), the step-0 loss is transformers', and the fine-tune samples and exports back to the same class."""
    import export
    import sample
    from data.hf_tokenizer import read_tokenizer_json
    from data.loader import BatchLoader
    from tests.test_model_hf_llama import PAD, hub_dir, load_auto
    hf_dir, hf_model = hub_dir(tmp_path / "hf", kind, tie_word_embeddings=kind == "qwen3")
    batches, real_next = [], BatchLoader.next_batch
    monkeypatch.setattr(BatchLoader, "next_batch", lambda self: batches.append(real_next(self)) or batches[-1])
    run, crop = tmp_path / "run", ["model.block_size=32"]
    res = train(make_cfg("data=text", f"data.path={tiny_corpus}", f"model.init_from={hf_dir}", "model.dropout=0",
                         "train.batch_size=4", "train.max_iters=6", "train.eval_interval=3", "optim.lr=3e-3",
                         "train.eval_at_start=true", *crop), run, cli_overrides=crop)
    assert (res.status, res.step, res.exit_code) == ("completed", 6, 0)
    x, y = batches[0]
    assert x.shape == (4, 32) and abs(records(run, "train")[0]["loss"] - hf_loss(hf_model, x, y)) <= 1e-4
    evals = records(run, "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.05  # it learns
    last = ck.load_checkpoint(run / "last.pt")
    tok = read_tokenizer_json(hf_dir / "tokenizer.json")
    assert last["tokenizer"] == tok.to_dict() and last["model_config"]["vocab_size"] == tok.vocab_size + PAD
    assert last["config"]["data"]["tokenizer_file"] == str((hf_dir / "tokenizer.json").resolve())
    assert sample.main(["--run", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "5", "--seed", "1",
                        "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    assert export.main(["--hf", str(tmp_path / "out"), "--run", str(run)]) == 0
    assert type(load_auto(tmp_path / "out")).__name__ == type(hf_model).__name__


def test_a_llama_source_sets_the_data_tokenizer(tmp_path, tiny_corpus):
    from tests.test_model_hf_llama import hub_dir
    hf_dir, _ = hub_dir(tmp_path / "hf", "qwen3")
    c = to_dataclass(make_cfg("data=shakespeare", f"model.init_from={hf_dir}"))
    src = init_from.apply(c, [f"model.init_from={hf_dir}"])
    assert (c.data.tokenizer, c.data.tokenizer_file, c.data.vocab_size) == (
        "bpe", str((hf_dir / "tokenizer.json").resolve()), src.tokenizer["vocab_size"])
    assert (c.model.position, c.model.qk_norm, c.model.n_kv_head, c.model.block_size) == ("rope", True, 2, 64)
    assert src.describe(64).endswith("(Hugging Face Qwen3: 2 layers, 4 heads, 64 wide, context 64)")
    for data, given in ((["data=shakespeare_char"], []), (["data=text", "data.tokenizer=gpt2"], ["data.tokenizer"])):
        c = to_dataclass(make_cfg(*data, f"data.path={tiny_corpus}", f"model.init_from={hf_dir}"))
        with pytest.raises(ValueError, match="reads its own BPE .tokenizer.json. but data=") as e:
            init_from.apply(c, given)
        assert "\n" not in str(e.value)


def test_the_shape_comes_from_the_source(tmp_path, tiny_hf):
    """Over the model preset and experiment (model=tiny, experiment=cpu): layers, heads, width, biases, tying,
    context (unless model.block_size is given) and the vocabulary; dropout stays the config's."""
    hf_dir = tiny_hf[0]
    c = to_dataclass(make_cfg(*GPT2_DATA, "data.path=x.txt", f"model.init_from={hf_dir}", "model.dropout=0.1"))
    src = init_from.apply(c, ["model.init_from=" + str(hf_dir), "model.dropout=0.1"])
    m = c.model
    assert (m.n_layer, m.n_head, m.n_embd, m.bias, m.tie_weights, m.block_size) == (2, 2, 64, True, True, 128)
    assert (m.dropout, m.pad_vocab_to, m.init_from) == (0.1, 1, str(hf_dir.resolve()))
    assert (m.position, m.norm, m.mlp, m.mlp_hidden, m.n_kv_head, m.qk_norm) == (  # GPT-2's, over experiment=cpu's
        "learned", "layernorm", "gelu", None, None, False)
    assert src.tokenizer == {"type": "gpt2"}
    assert src.describe(128).endswith("(Hugging Face GPT-2: 2 layers, 2 heads, 64 wide, context 128)")
    c = to_dataclass(make_cfg(*GPT2_DATA, "data.path=x.txt", f"model.init_from={hf_dir}", "model=gpt2",
                              "model.n_layer=2", "model.block_size=32"))
    init_from.apply(c, ["model.n_layer=2", "model.block_size=32", "model=gpt2"])  # agreeing values are fine
    assert (c.model.n_layer, c.model.n_embd, c.model.block_size, c.model.pad_vocab_to) == (2, 64, 32, 1)
    assert init_from.given_keys(["+model.bias=true", "~train.seed", "data=text"]) == {"model.bias", "train.seed",
                                                                                     "data"}


def _char_run(tmp_path, corpus, name="src", *extra):
    run = tmp_path / name
    train(make_cfg("data=text", f"data.path={corpus}", "model.n_layer=2", "model.n_head=2", "model.n_embd=32",
                   "model.block_size=16", "train.batch_size=4", "train.max_iters=4", "train.eval_interval=2",
                   "optim.lr=1e-2", *extra), run)
    return run


@pytest.mark.slow  # over ~1 s
def test_from_a_tinygpt_run_directory(tmp_path, tiny_corpus):
    src = _char_run(tmp_path, tiny_corpus)
    source_eval = records(src, "eval")[-1]
    run = tmp_path / "ft"  # model=tiny (4 layers, 128 wide) from the CPU preset: the checkpoint's shape wins
    res = train(make_cfg("data=text", f"data.path={tiny_corpus}", f"model.init_from={src}", "train.batch_size=4",
                         "train.max_iters=2", "train.eval_interval=2", "train.eval_at_start=true",
                         "optim.lr=1e-3"), run)
    assert (res.status, res.step) == ("completed", 2)
    first = records(run, "eval")[0]
    assert first["step"] == 0 and first["val_loss"] == pytest.approx(source_eval["val_loss"], abs=1e-6)
    assert first["val_bpb"] == pytest.approx(first["val_loss"] / math.log(2))  # ASCII: one byte per token
    last = ck.load_checkpoint(run / "last.pt")
    assert (last["model_config"]["n_layer"], last["model_config"]["n_embd"], last["model_config"]["block_size"]) == \
        (2, 32, 16)
    assert last["config"]["model"]["init_from"] == str((src / "best.pt").resolve())
    assert all(int(s["step"]) == 2 for s in last["optimizer"]["state"].values())  # the optimizer started afresh
    # resuming the fine-tune run continues it from its own checkpoint, not from the source
    res = train(make_cfg("data=text", f"data.path={tiny_corpus}", f"model.init_from={src}", "train.batch_size=4",
                         "train.max_iters=4", "train.eval_interval=2", "train.eval_at_start=true", "optim.lr=1e-3",
                         "train.resume=true"), run)
    assert res.step == 4 and [r["step"] for r in records(run, "eval")] == [0, 2, 4]


def _one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.slow  # over ~1 s
def test_every_bad_source_is_one_line(tmp_path, tiny_corpus, tiny_hf, cache_with_gpt2):
    hf_dir = tiny_hf[0]
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((hf_dir / "config.json").read_text())
    char = ["data=text", f"data.path={tiny_corpus}"]
    cases = [
        (["model.init_from=nowhere"], [], ["model.init_from=nowhere does not exist",
                                           "hf download nowhere --local-dir nowhere"]),
        ([f"model.init_from={tmp_path / 'bert'}"], [], ["is not a Hugging Face directory tinygpt can load",
                                                        "model_type='bert' is not supported"]),
        ([f"model.init_from={tmp_path / 'empty'}"], [], ["is neither a Hugging Face GPT-2 directory (no config.json)",
                                                         "nor a tinygpt or nanoGPT run directory (no best.pt, "
                                                         "last.pt or ckpt.pt)"]),
        ([f"model.init_from={tmp_path / 'junk.pt'}"], [], ["is not a PyTorch checkpoint"]),
        ([f"model.init_from={tmp_path / 'noweights'}"], [], ["has a config.json but no weights"]),
        ([f"model.init_from={hf_dir}", "model.block_size=256"], ["model.block_size=256"],
         ["model.block_size=256 is larger than the context of", "(128 positions): use at most model.block_size=128"]),
        ([f"model.init_from={hf_dir}"], [], ["reads gpt2 BPE tokens but data=text is tokenized with "
                                             "data.tokenizer=char: use data=shakespeare, or data=text "
                                             "data.tokenizer=gpt2"]),
    ]
    for overrides, given, words in cases:
        with pytest.raises(ValueError) as info:
            train(make_cfg(*char, *overrides), tmp_path / "run", cli_overrides=overrides if given else None)
        _one_line(info, *words)
    src = _char_run(tmp_path, tiny_corpus)
    with pytest.raises(ValueError) as info:  # an explicit shape that contradicts the checkpoint's
        train(make_cfg(*char, f"model.init_from={src}", "model.n_layer=3"), tmp_path / "run",
              cli_overrides=[f"model.init_from={src}", "model.n_layer=3"])
    _one_line(info, "model.n_layer=3 contradicts model.init_from=", "whose model has n_layer=2",
              "leave model.n_layer out")
    other = tmp_path / "other.txt"
    other.write_text("completely different characters 0123456789 XYZ\n" * 200)
    with pytest.raises(ValueError) as info:  # a char model meets other characters
        train(make_cfg("data=text", f"data.path={other}", f"model.init_from={src}"), tmp_path / "run2")
    _one_line(info, "other.txt has characters not in the vocabulary: '0', '1', '2'",
              "remove or replace")
    with pytest.raises(ValueError) as info:  # a char model meets GPT-2 BPE
        train(make_cfg(*GPT2_DATA, f"data.path={tiny_corpus}", f"model.init_from={src}"), tmp_path / "run3")
    _one_line(info, "reads char (", "data.tokenizer=gpt2: use data with the char tokenizer",
              "data=shakespeare_char", "data=text data.path=<your text> data.tokenizer=char")


@pytest.mark.slow
def test_round_trip_hf_finetune_export_eval(tmp_path, tiny_hf, cache_with_gpt2, tiny_corpus, capsys):
    """`python train.py model.init_from=HF ...` (the automatic CPU preset), then export.py --hf and eval.py: the
    exported fine-tuned model scores a text exactly as its checkpoint does."""
    import eval as eval_cli
    import export
    hf_dir = tiny_hf[0]
    proc = run_cli(["train.py", "train.device=cpu", *GPT2_DATA, f"data.path={tiny_corpus}", f"model.init_from={hf_dir}",
                    "model.block_size=32", "train.batch_size=2", "train.max_iters=2", "train.eval_interval=2",
                    "train.eval_iters=1", "hydra.run.dir=run"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"init from {hf_dir} (Hugging Face GPT-2: 2 layers, 2 heads, 64 wide, context 128), context cropped " \
           f"to 32" in proc.stdout
    assert "model: " in proc.stdout and "2 layers, 2 heads, 64 wide, context 32, vocab 50257" in proc.stdout
    run = tmp_path / "run"
    bad = run_cli(["train.py", "train.device=cpu", *GPT2_DATA, f"data.path={tiny_corpus}",  # one line from the CLI
                   f"model.init_from={hf_dir}", "model.n_embd=32", "hydra.run.dir=run2"], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: model.n_embd=32 contradicts")
    assert export.main(["--hf", str(tmp_path / "out"), "--run", str(run)]) == 0
    capsys.readouterr()
    text = tmp_path / "text.txt"
    text.write_text(tiny_corpus.read_text()[:400])
    scores = []
    for source in (["--hf", str(tmp_path / "out")], ["--run", str(run)]):
        assert eval_cli.main(["--file", str(text), "--json", *source]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[0] == approx_record(scores[1], rel=1e-5) and math.isfinite(scores[0]["loss"])


def test_config_records_nothing_new_for_runs_without_a_source():
    assert Config().model.init_from is None and init_from.apply(Config()) is None


FEWER = "the king and the queen speak of love at night\n"  # some of the tiny corpus's characters


@pytest.mark.slow  # two short runs
def test_a_char_model_fine_tunes_on_text_with_fewer_characters(tmp_path, tiny_corpus, capsys):
    """docs/finetune.md: a char model fine-tunes on text written with characters it knows. The new
    text's own vocabulary is smaller (other ids): it is encoded with the source's characters, from a
    run or from its Hugging Face export, and the result samples; a character the source lacks is
    one line naming it."""
    import export
    import sample
    src = _char_run(tmp_path, tiny_corpus)
    source_tokenizer = ck.load_checkpoint(src / "best.pt")["tokenizer"]
    fewer = tmp_path / "fewer.txt"
    fewer.write_text(FEWER * 200)
    assert set(FEWER) < set(source_tokenizer["chars"])
    assert export.main(["--hf", str(tmp_path / "exported"), "--run", str(src)]) == 0
    for source, run in ((src, tmp_path / "ft"), (tmp_path / "exported", tmp_path / "ft-hf")):
        res = train(make_cfg("data=text", f"data.path={fewer}", f"model.init_from={source}",
                             "train.batch_size=4", "train.max_iters=2",
                             "train.eval_interval=2"), run)
        assert res.status == "completed"
        assert ck.load_checkpoint(run / "last.pt")["tokenizer"] == source_tokenizer
        capsys.readouterr()
        assert sample.main(["--run", str(run), "--prompt", "the king", "--max-new-tokens", "20",
                            "--device", "cpu", "--seed", "1"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("the king") and len(out) >= len("the king") + 20
        assert set(out) <= set(source_tokenizer["chars"])
    other = tmp_path / "other.txt"
    other.write_text(FEWER * 100 + "0123 Zürich\n")
    with pytest.raises(ValueError) as info:
        train(make_cfg("data=text", f"data.path={other}", f"model.init_from={src}"),
              tmp_path / "refused")
    _one_line(info, "other.txt has characters not in the vocabulary: '0', '1', '2', '3', 'Z', 'ü'",
              "remove or replace them in the text, or train a new model on it")


def test_a_fine_tune_caches_its_encoding_apart(tmp_path):
    """The prepared cache key tells the encodings apart: the text's own characters, a fine-tune
    source's (each source's its own), and a second preparation with the same source is a hit."""
    from data.config import DataConfig
    from data.prepare import encode_with, prepare
    from data.tokenizer import CharTokenizer
    text = tmp_path / "fewer.txt"
    text.write_text(FEWER * 50)
    own = prepare(DataConfig(name="text", path=str(text)), progress=False)
    bases = [CharTokenizer(FEWER + "XYZ"), CharTokenizer(FEWER + "!?")]
    prepared = []
    for base in bases:
        cfg = DataConfig(name="text", path=str(text))
        encode_with(cfg, base.to_dict())
        prepared.append(prepare(cfg, progress=False))
        assert prepared[-1].tokenizer.to_dict() == base.to_dict() and not prepared[-1].cached
        again = DataConfig(name="text", path=str(text))
        encode_with(again, base.to_dict())
        assert prepare(again, progress=False).cached
    assert own.tokenizer.to_dict() == CharTokenizer(FEWER).to_dict()
    assert len({own.dir, *(p.dir for p in prepared)}) == 3
    first = prepared[0].token_files()[0].windows([0], len(FEWER))[0]
    assert bases[0].decode(first.tolist()) == FEWER  # the base's ids, not the text's own
