"""checkpoint/nanogpt.py: a nanoGPT run directory read as it is. The equality tests use tests/fixtures/nanogpt (two
runs of nanoGPT's real train.py at a pinned commit, and what nanoGPT's own code computed on them: its README says
how to make them again); the rest use small checkpoints laid out as nanoGPT's train.py writes them."""
from __future__ import annotations

import json
import pickle
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint.file import CheckpointError, checkpoint_in_run, load_checkpoint, load_model
from model.config import GPTConfig
from model.gpt import GPT
from tests.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "nanogpt"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
RUNS = ("out-bias", "out-nobias")
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # Tiny Shakespeare's 65


@pytest.fixture
def nanogpt_dir(tmp_path, monkeypatch):
    """A copy of the fixture's nanoGPT working directory (out-*/ckpt.pt, data/shakespeare_char/meta.pkl), as cwd."""
    work = tmp_path / "nanoGPT"
    shutil.copytree(FIXTURE, work, ignore=shutil.ignore_patterns("*.json", "*.md", "*.sh", "*.py"))
    monkeypatch.chdir(work)
    return work


def write_nanogpt_run(run: Path, vocab_size: int = 65, bias: bool = True, prefix: str = "",
                      dataset: str | None = "shakespeare_char", meta: dict | None = None, **model_args) -> GPT:
    """run/ckpt.pt as nanoGPT's train.py writes it (model, optimizer, model_args, iter_num, best_val_loss, config),
    with a random exact-GELU model (weights ~ N(0, 0.3), positions N(0, 1): greedy text that is not one token
    repeated); `meta`: a meta.pkl beside it. Returns the model."""
    args = dict(n_layer=1, n_head=2, n_embd=8, block_size=16, bias=bias, vocab_size=vocab_size, dropout=0.0)
    args.update(model_args)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{k: v for k, v in args.items() if k in GPTConfig.__dataclass_fields__}, mlp="gelu_exact"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 1.0 if "wpe" in name else 0.3)
    run.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {prefix + k: v for k, v in model.state_dict().items()}, "optimizer": {"state": {},
                "param_groups": []}, "model_args": args, "iter_num": 250, "best_val_loss": torch.tensor(1.5),
                "config": {"dataset": dataset} if dataset else {}}, run / "ckpt.pt")
    if meta is not None:
        (run / "meta.pkl").write_bytes(pickle.dumps(meta))
    return model


def char_meta(chars: str = CHARS) -> dict:
    return {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}


# ----------------------------------------------------------------------------- equal to nanoGPT's own code
@pytest.mark.parametrize("run", RUNS)
def test_reads_as_a_tinygpt_checkpoint(nanogpt_dir, run):
    ckpt = load_checkpoint(nanogpt_dir / run / "ckpt.pt")
    raw = torch.load(nanogpt_dir / run / "ckpt.pt", weights_only=True)
    args = raw["model_args"]
    assert ckpt["format"] == "tinygpt" and ckpt["step"] == raw["iter_num"] and ckpt["from_nanogpt"]
    assert ckpt["tokenizer"] == {"type": "char", "chars": CHARS}
    config = GPTConfig.from_dict(ckpt["model_config"])
    assert (config.mlp, config.bias, config.dropout, config.vocab_size, config.block_size) == (
        "gelu_exact", args["bias"], args["dropout"], args["vocab_size"], args["block_size"])
    assert checkpoint_in_run(nanogpt_dir / run) == nanogpt_dir / run / "ckpt.pt"


@pytest.mark.parametrize("run", RUNS)
def test_loss_and_attention_equal_nanogpts(nanogpt_dir, run):
    """The loss nanoGPT's model.py computed on the same tokens (within 1e-4; it is float32 rounding), and the
    explorer's attention (its --run loading and forward) equal to the textbook softmax of nanoGPT's weights."""
    from viz.explorer.model_view import forward_with_attention, load_source
    model, tokenizer, _, _ = load_source("run", run, torch.device("cpu"))
    want = EXPECTED["runs"][run]
    for case in want["loss"]:
        x, y = torch.tensor(case["x"]), torch.tensor(case["y"])
        assert abs(model(x, y)[1].item() - case["loss"]) < 1e-4, case
    att = want["attention"]
    assert tokenizer.encode(att["text"]) == att["ids"]
    layers = list(range(model.config.n_layer))
    weights = forward_with_attention(model, att["ids"], layers).weights
    assert torch.allclose(torch.stack([weights[layer] for layer in layers]), torch.tensor(att["probs"]), atol=2e-6)


@pytest.mark.parametrize("run", RUNS)
def test_greedy_text_equals_nanogpts_sample(nanogpt_dir, run, capsys):
    """sample.py --top-k 1 --window sliding prints what nanoGPT's sample.py --top_k=1 printed, past block_size too;
    with or without the KV cache."""
    import sample
    want = EXPECTED["runs"][run]["sample"]
    for cache in ([], ["--no-kv-cache"]):
        assert sample.main(["--run", run, "--prompt", want["start"], "--top-k", "1", "--window", "sliding",
                            "--max-new-tokens", str(want["max_new_tokens"]), "--device", "cpu", *cache]) == 0
        out, err = capsys.readouterr()
        assert out == want["text"] + "\n", cache
        assert f"using {run}/ckpt.pt" in err and "vocabulary from data/shakespeare_char/meta.pkl" in err


@pytest.mark.slow  # transformers' import
def test_hugging_face_export_generates_the_same_greedy_text(nanogpt_dir, tmp_path):
    """export.py --hf writes GPT-2 with activation_function "gelu" (nanoGPT's exact GELU; "gelu_new" would be the
    tanh one), zero biases for the bias-free run, and transformers' greedy tokens are nanoGPT's up to the context
    (transformers does not slide past n_positions)."""
    import export
    from transformers import GPT2LMHeadModel
    for run in RUNS:
        want = EXPECTED["runs"][run]["sample"]
        assert export.main(["--hf", str(tmp_path / run), "--run", run]) == 0
        assert json.loads((tmp_path / run / "config.json").read_text())["activation_function"] == "gelu"
        hf = GPT2LMHeadModel.from_pretrained(tmp_path / run).eval()
        n = hf.config.n_positions
        prompt = torch.tensor([want["ids"][:len(want["start"])]])
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n - prompt.size(1),
                          do_sample=False)
        assert out[0].tolist() == want["ids"][:n], run


@pytest.mark.slow  # eval.py and train.py as a user runs them
def test_eval_and_fine_tune_from_a_nanogpt_run(nanogpt_dir, tmp_path, cache_with_shakespeare):
    import subprocess
    import sys
    case = EXPECTED["runs"]["out-bias"]["loss"][-1]  # two windows of the context: eval.py's disjoint windows
    (tmp_path / "text.txt").write_text(case["text"], encoding="utf-8")
    out = subprocess.run([sys.executable, str(REPO / "eval.py"), "--file", str(tmp_path / "text.txt"), "--run",
                          "out-bias", "--json", "--device", "cpu"], capture_output=True, text=True, check=True)
    assert abs(json.loads(out.stdout)["loss"] - case["loss"]) < 1e-4
    run = subprocess.run([sys.executable, str(REPO / "train.py"), "model.init_from=out-bias", "data=shakespeare_char",
                          "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "train.device=cpu",
                          f"hydra.run.dir={tmp_path / 'ft'}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "(nanoGPT checkpoint: 2 layers" in run.stdout + run.stderr
    ft = load_checkpoint(tmp_path / "ft" / "last.pt")
    assert "from_nanogpt" not in ft and ft["model_config"]["mlp"] == "gelu_exact" and ft["optimizer"] is not None


def test_sliding_window_is_nanogpts_generate(tmp_path, monkeypatch):
    """Past block_size, --window sliding is nanoGPT's generate (crop to the last block_size tokens, argmax) token for
    token, cached or not; the default half window is another context (on a random model: other tokens)."""
    from model.generate import generate
    from model.sampling import Sampling
    monkeypatch.chdir(tmp_path)
    write_nanogpt_run(tmp_path / "out", meta=char_meta(), block_size=8, n_layer=2, n_embd=16)
    model, _ = load_model(tmp_path / "out" / "ckpt.pt")
    idx = torch.tensor([[5, 17, 42]])
    want = idx
    for _ in range(30):  # nanoGPT's model.generate with top_k=1
        logits = model(want[:, -model.config.block_size:])[0][:, -1]
        want = torch.cat([want, logits.argmax(-1, keepdim=True)], dim=1)
    assert len(set(want[0, 3:].tolist())) >= 3  # not one token repeated: the windows' contexts matter
    for cache in (True, False):
        assert torch.equal(generate(model, idx, 30, Sampling(temperature=0), cache, window="sliding"), want)
    assert not torch.equal(generate(model, idx, 30, Sampling(temperature=0)), want)
    with pytest.raises(ValueError, match="window='full' is not known: use one of half, sliding"):
        generate(model, idx, 3, window="full")


# ----------------------------------------------------------------------------- what is read, and from where
def test_compiled_runs_prefix_and_mask_buffers_are_dropped(tmp_path):
    model = write_nanogpt_run(tmp_path / "out", prefix="_orig_mod.", meta=char_meta())
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    ckpt["model"]["_orig_mod.transformer.h.0.attn.bias"] = torch.ones(1, 1, 16, 16).tril()  # (torch < 2.0 runs)
    torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
    ours, _ = load_model(tmp_path / "out" / "ckpt.pt")
    idx = torch.randint(0, 65, (2, 16))
    assert torch.equal(ours(idx)[0], model.eval()(idx)[0])


def test_meta_pkl_beside_then_cwd_data_then_the_checkout_of_the_run(tmp_path, monkeypatch):
    """nanoGPT's sample.py reads data/<dataset>/meta.pkl of the cwd; beside ckpt.pt and the run's checkout too."""
    checkout = tmp_path / "nanoGPT"
    write_nanogpt_run(checkout / "out", vocab_size=3)
    (checkout / "data" / "shakespeare_char").mkdir(parents=True)
    (checkout / "data" / "shakespeare_char" / "meta.pkl").write_bytes(pickle.dumps(char_meta("abc")))
    monkeypatch.chdir(tmp_path)
    assert load_checkpoint(checkout / "out" / "ckpt.pt")["tokenizer"]["chars"] == "abc"  # the checkout's
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "meta.pkl").write_bytes(pickle.dumps(char_meta("xyz")))
    assert load_checkpoint(checkout / "out" / "ckpt.pt")["tokenizer"]["chars"] == "xyz"  # the cwd's
    (checkout / "out" / "meta.pkl").write_bytes(pickle.dumps(char_meta("ABC")))
    assert load_checkpoint(checkout / "out" / "ckpt.pt")["tokenizer"]["chars"] == "ABC"  # beside it


def test_no_meta_pkl_is_gpt2_bpe_as_in_nanogpt(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_nanogpt_run(tmp_path / "out", vocab_size=50304, n_embd=4, n_head=1, dataset="openwebtext")
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert ckpt["tokenizer"] == {"type": "gpt2"} and ckpt["model_config"]["vocab_size"] == 50304
    assert "no meta.pkl found" in capsys.readouterr().err


# ----------------------------------------------------------------------------- mistakes: one line each
def test_meta_pkl_is_never_unpickled_beyond_plain_data(tmp_path, monkeypatch):
    """A meta.pkl holding an object (here one whose unpickling would write a file) is refused: nothing is called."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "called"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))
    write_nanogpt_run(tmp_path / "out")
    (tmp_path / "out" / "meta.pkl").write_bytes(pickle.dumps({"itos": Evil()}))
    with pytest.raises(CheckpointError, match=r"meta.pkl is not a nanoGPT vocabulary .*UnpicklingError global "
                                              r"pathlib"):
        load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert not marker.exists()


@pytest.mark.parametrize("meta,words", [
    (char_meta("ab"), "holds 2 characters but .*ckpt.pt has 65 token rows: it is another run's vocabulary"),
    (char_meta(CHARS[::-1]), "characters are not in sorted order"),
    ({"itos": {0: "ab"}}, "its itos entries must be distinct single characters"),
    (["not", "a", "dict"], "it has no itos table"),
])
def test_a_meta_pkl_that_does_not_fit_is_one_line(tmp_path, monkeypatch, meta, words):
    monkeypatch.chdir(tmp_path)
    write_nanogpt_run(tmp_path / "out", meta=meta)
    with pytest.raises(CheckpointError, match=words) as e:
        load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert "\n" not in str(e.value)


def test_checkpoints_that_are_not_nanogpts_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_nanogpt_run(tmp_path / "a")  # no meta.pkl anywhere and 65 rows: not GPT-2 BPE either
    with pytest.raises(CheckpointError, match=r"has 65 token rows and no meta.pkl was found \(looked at .*a/meta.pkl, "
                                              r"data/shakespeare_char/meta.pkl, .*\): copy the run's"):
        load_checkpoint(tmp_path / "a" / "ckpt.pt")
    write_nanogpt_run(tmp_path / "b", meta=char_meta(), mlp_ratio=8)  # a modified nanoGPT's model_args
    with pytest.raises(CheckpointError, match="model_args tinygpt does not know \\(mlp_ratio\\)"):
        load_checkpoint(tmp_path / "b" / "ckpt.pt")
    write_nanogpt_run(tmp_path / "e", meta=char_meta())
    ckpt = torch.load(tmp_path / "e" / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "model_args": {**ckpt["model_args"], "n_head": 3}}, tmp_path / "e" / "ckpt.pt")  # 8 wide
    cannot = r"has model_args that nanoGPT's model.py cannot build either \(n_embd=8 is not "
    with pytest.raises(CheckpointError, match=cannot + r"divisible by n_head=3\): it was not") as e:
        load_checkpoint(tmp_path / "e" / "ckpt.pt")
    # (GPTConfig's advice is for settings; a file's model_args are none)
    assert "e.g." not in str(e.value)
    torch.save({"model": {}, "model_args": {"n_layer": 1}}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="model_args without n_head, n_embd, .*not a checkpoint of nanoGPT"):
        load_checkpoint(tmp_path / "c.pt")
    torch.save({"model": {}}, tmp_path / "d.pt")
    with pytest.raises(CheckpointError, match="not a tinygpt checkpoint .* nor nanoGPT's ckpt.pt"):
        load_checkpoint(tmp_path / "d.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no best.pt or last.pt.*a nanoGPT out_dir holds ckpt.pt"):
        checkpoint_in_run(tmp_path / "empty")


def test_gpt2_vocabulary_run_offline_without_ranks_is_one_line(tmp_path, monkeypatch):
    from tests.test_data_tokenizer import _no_tiktoken_download
    _no_tiktoken_download(monkeypatch)
    monkeypatch.chdir(tmp_path)
    write_nanogpt_run(tmp_path / "out", vocab_size=50304, n_embd=4, n_head=1, dataset=None)
    with pytest.raises(FileNotFoundError, match="gpt2.tiktoken") as e:
        load_model(tmp_path / "out" / "ckpt.pt")
    assert "\n" not in str(e.value)


# ------------------------------------------------------------ a damaged file, in nanoGPT's terms
def _extra(c):
    c["model"]["transformer.h.0.mlp.gate.weight"] = torch.zeros(4, 32)


def _flip_bias(c):
    c["model_args"]["bias"] = not c["model_args"]["bias"]


def _layers(c):
    c["model_args"]["n_layer"] = 3


SAY = "model_args say {} but its weights are those of a model with {}"


@pytest.mark.parametrize("run, damage, words", [
    ("out-bias", _extra, "holds 1 tensor nanoGPT's model.py does not make "
                         "(transformer.h.0.mlp.gate.weight)"),
    ("out-nobias", _flip_bias, SAY.format("bias=True", "bias=False")),
    ("out-bias", _flip_bias, SAY.format("bias=False", "bias=True")),
    ("out-bias", _layers, SAY.format("n_layer=3", "n_layer=2")),
])
def test_a_damaged_nanogpt_file_is_told_the_edit_that_mends_it(nanogpt_dir, run, damage, words):
    """Issue 50: "use the model settings they were trained with" cannot be acted on for a nanoGPT
    file (its settings are the file's): what is wrong is said in nanoGPT's terms, with the command
    that mends the file; run, it does (the file computes what the untouched one does)."""
    path = nanogpt_dir / run / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    damage(ckpt)
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    message = str(e.value)
    assert words in message and "\n" not in message
    assert "model settings they were trained with" not in message
    command = shlex.split(re.search(r"python -c .*$", message)[0])
    # the command's Python, as `python -c` runs it
    exec(command[2], {})
    ours, _ = load_model(path)
    theirs, _ = load_model(FIXTURE / run / "ckpt.pt")
    idx = torch.randint(0, 65, (2, 16))
    assert torch.equal(ours(idx)[0], theirs(idx)[0])


def test_a_compiled_runs_extra_tensor_is_deleted_by_its_own_name(tmp_path):
    write_nanogpt_run(tmp_path / "out", prefix="_orig_mod.", meta=char_meta())
    ckpt = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)
    ckpt["model"]["_orig_mod.lm_head.bias"] = torch.zeros(65)
    torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
    deleted = r'del c\["model"\]\["_orig_mod.lm_head.bias"\]'
    with pytest.raises(CheckpointError, match=r"\(lm_head.bias\).*" + deleted):
        load_checkpoint(tmp_path / "out" / "ckpt.pt")


def test_a_nanogpt_file_missing_a_tensor_names_it_and_the_file_to_use(nanogpt_dir):
    path = nanogpt_dir / "out-bias" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["model"]["transformer.h.1.mlp.c_fc.weight"]
    # (and a misshapen one: what is missing says more)
    ckpt["model"]["transformer.h.0.mlp.c_fc.bias"] = torch.zeros(3)
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=r"ckpt.pt lacks transformer.h.1.mlp.c_fc.weight, a "
                                              r"tensor nanoGPT's model.py makes .* use the "
                                              r"out_dir/ckpt.pt that nanoGPT's own"):
        load_checkpoint(path)
