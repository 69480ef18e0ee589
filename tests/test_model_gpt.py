"""model/gpt.py: shapes, loss, GPT-2 layout and initialisation, parameter counts, learning; weights into a model
(one check and one wording for weights that do not fit, the meta-device build)."""
import dataclasses
import math
import subprocess
import sys
import time

import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT
from model.gpt import check_weights, clean_state_dict, model_with_weights
from model.positions import SCHEMES
from tests.helpers import REPO




def test_forward_shapes_and_loss(tiny_gpt_config):
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config)
    idx = torch.randint(0, 32, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, 32) and logits.dtype == torch.float32 and loss is None
    targets = torch.randint(0, 32, (3, 10))
    _, loss = model(idx, targets)
    expected = torch.nn.functional.cross_entropy(logits.view(-1, 32), targets.view(-1))
    assert torch.allclose(loss, expected)
    masked = targets.clone()
    masked[:, :5] = -1  # ignore_index=-1: these positions do not count
    _, loss_masked = model(idx, masked)
    assert torch.allclose(loss_masked, torch.nn.functional.cross_entropy(logits[:, 5:].reshape(-1, 32),
                                                                         targets[:, 5:].reshape(-1)))


def test_last_only_computes_the_head_for_the_last_position(tiny_gpt_config):
    """What sampling reads (nanoGPT's inference forward): the last row of the full logits, nothing else."""
    model = GPT(tiny_gpt_config).eval()
    idx = torch.randint(0, 32, (3, 10))
    calls = []
    handle = model.lm_head.register_forward_hook(lambda m, inputs, out: calls.append(inputs[0].shape))
    last, _ = model(idx, last_only=True)
    handle.remove()
    assert calls == [(3, 1, tiny_gpt_config.n_embd)] and last.shape == (3, 1, 32)
    assert torch.allclose(last, model(idx)[0][:, -1:], atol=1e-6, rtol=0)
    with pytest.raises(AssertionError, match="every position"):
        model(idx, torch.randint(0, 32, (3, 10)), last_only=True)


def test_sequence_longer_than_block_size_raises(tiny_gpt_config):
    model = GPT(tiny_gpt_config)
    model(torch.zeros(1, tiny_gpt_config.block_size, dtype=torch.long))  # exactly block_size is fine
    with pytest.raises(ValueError, match="block_size=16"):
        model(torch.zeros(1, tiny_gpt_config.block_size + 1, dtype=torch.long))


def test_gpt2_module_names(tiny_gpt_config):
    names = set(GPT(dataclasses.replace(tiny_gpt_config, n_layer=1)).state_dict())
    assert names == {
        "transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight",
        "transformer.ln_f.weight", "transformer.ln_f.bias",
        *(f"transformer.h.0.{m}.{p}" for m in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
          for p in ("weight", "bias")),
    }
    no_bias = GPT(dataclasses.replace(tiny_gpt_config, n_layer=1, bias=False))
    assert not [n for n in no_bias.state_dict() if n.endswith(".bias")]


def test_gpt2_initialisation_and_tied_head():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=512, block_size=64, n_layer=4, n_head=4, n_embd=128)
    model = GPT(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    h = model.transformer.h
    assert abs(h[0].mlp.c_fc.weight.std().item() - 0.02) < 0.002
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.002
    scaled = 0.02 / math.sqrt(2 * config.n_layer)
    assert abs(torch.cat([b.attn.c_proj.weight.flatten() for b in h]).std().item() - scaled) < 0.001
    assert abs(torch.cat([b.mlp.c_proj.weight.flatten() for b in h]).std().item() - scaled) < 0.001
    assert all((b.attn.c_attn.bias == 0).all() for b in h)
    untied = GPT(dataclasses.replace(config, tie_weights=False))
    assert untied.lm_head.weight is not untied.transformer.wte.weight


def test_loss_at_init_is_close_to_ln_vocab():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config)
    idx, targets = torch.randint(0, 65, (2, 16, 64)).unbind(0)
    with torch.no_grad():
        _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(65)) < 0.1


def test_num_params_follows_nanogpt_convention():
    config = GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    C, V, T = 16, 50, 8
    block = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    tied = GPT(config)
    total = V * C + T * C + block + 2 * C  # wte (= lm_head) + wpe + block + ln_f
    assert tied.num_params(non_embedding=False) == total
    assert tied.num_params() == total - T * C  # position embeddings subtracted
    untied = GPT(dataclasses.replace(config, tie_weights=False))
    assert untied.num_params(non_embedding=False) == total + V * C  # separate lm_head
    assert untied.num_params() == total + V * C - T * C - V * C  # and the token embedding too


MODERN = dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, qk_norm=True, bias=False,
              tie_weights=False)


def test_modern_module_names_and_shapes(tiny_gpt_config):
    """No wpe with rope; RMSNorm weights only; fused q, k, v with n_kv_head key/value heads; c_fc [gate; up]."""
    config = dataclasses.replace(tiny_gpt_config, n_layer=1, **MODERN)  # 2 heads of 16, 1 key/value head
    shapes = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    H = config.mlp_size
    assert H == 96 and shapes == {
        "transformer.wte.weight": (32, 32), "lm_head.weight": (32, 32), "transformer.ln_f.weight": (32,),
        "transformer.h.0.ln_1.weight": (32,), "transformer.h.0.ln_2.weight": (32,),
        "transformer.h.0.attn.c_attn.weight": ((2 + 2 * 1) * 16, 32), "transformer.h.0.attn.c_proj.weight": (32, 32),
        "transformer.h.0.attn.q_norm.weight": (16,), "transformer.h.0.attn.k_norm.weight": (16,),
        "transformer.h.0.mlp.c_fc.weight": (2 * H, 32), "transformer.h.0.mlp.c_proj.weight": (32, H)}
    head_dim = GPT(dataclasses.replace(config, head_dim=8)).state_dict()  # heads narrower than n_embd / n_head
    assert tuple(head_dim["transformer.h.0.attn.c_proj.weight"].shape) == (32, 2 * 8)


@pytest.mark.parametrize("position", list(SCHEMES))
def test_only_a_scheme_with_a_table_has_wpe(position):
    """GPT builds wpe (block_size x n_embd) for a scheme whose entry says so, and only then; the
    non-embedding count leaves it out."""
    config = GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16,
                       position=position)
    model = GPT(config)
    table = SCHEMES[position].table
    assert ("wpe" in model.transformer) == table
    assert model.num_params(non_embedding=False) - model.num_params() == (8 * 16 if table else 0)


def test_num_params_without_position_table_and_swiglu_is_parameter_matched():
    config = GPTConfig(vocab_size=50, block_size=8, n_layer=2, n_head=2, n_embd=48)
    rope = GPT(dataclasses.replace(config, position="rope"))
    assert rope.num_params() == rope.num_params(non_embedding=False) == GPT(config).num_params()
    mlp = {kind: sum(p.numel() for p in GPT(dataclasses.replace(config, mlp=kind, bias=False)).transformer.h[0]
                     .mlp.parameters()) for kind in ("gelu", "swiglu", "relu2")}
    assert mlp["gelu"] == mlp["relu2"] == mlp["swiglu"] == 2 * 48 * 4 * 48  # 8C/3 = 128, a multiple of 32


def test_mlp_and_norm_settings_compute_their_formulas():
    config = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=6, bias=False, mlp_hidden=5)
    x = torch.randn(2, 3, 6)
    for kind, act in (("gelu", lambda h: torch.nn.functional.gelu(h, approximate="tanh")),
                      ("gelu_exact", lambda h: 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))),  # nanoGPT's nn.GELU()
                      ("relu2", lambda h: torch.relu(h) ** 2),
                      ("swiglu", lambda h: torch.nn.functional.silu(h[..., :5]) * h[..., 5:])):
        mlp = GPT(dataclasses.replace(config, mlp=kind)).transformer.h[0].mlp
        assert torch.allclose(mlp(x), act(x @ mlp.c_fc.weight.T) @ mlp.c_proj.weight.T, atol=1e-6), kind
    ln = GPT(dataclasses.replace(config, norm="rmsnorm", norm_eps=1e-3)).transformer.ln_f
    torch.nn.init.normal_(ln.weight)
    assert torch.allclose(ln(x), x / (x.pow(2).mean(-1, keepdim=True) + 1e-3).sqrt() * ln.weight, atol=1e-6)


def test_logit_softcap_bounds_the_logits_in_fp32(tiny_gpt_config):
    torch.manual_seed(0)
    plain = GPT(tiny_gpt_config).eval()
    with torch.no_grad():
        plain.lm_head.weight.mul_(500)  # logits far beyond the cap
    capped = GPT(dataclasses.replace(tiny_gpt_config, logit_softcap=3.0)).eval()
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 32, (2, 10))
    raw, c = plain(idx)[0], capped(idx)[0]
    assert raw.abs().max() > 30 and c.abs().max() <= 3.0 and c.dtype == torch.float32
    assert torch.allclose(c, 3.0 * torch.tanh(raw / 3.0), atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert capped(idx)[0].dtype == torch.float32  # tanh in fp32 whatever autocast computes the head in


@pytest.mark.parametrize("settings", [{}, MODERN, dict(MODERN, mlp="relu2", logit_softcap=15.0, n_kv_head=None)])
def test_tiny_model_overfits_one_batch(tiny_gpt_config, settings):
    tiny_gpt_config = dataclasses.replace(tiny_gpt_config, **settings)
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config)
    seq = torch.randint(0, tiny_gpt_config.vocab_size, (4, tiny_gpt_config.block_size + 1))
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    start = time.perf_counter()
    for step in range(300):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if loss.item() < 0.1:
            break
    assert loss.item() < 0.1, f"loss {loss.item():.3f} after {step + 1} steps"
    assert time.perf_counter() - start < 20


def test_bad_constructor_argument():
    with pytest.raises(ValueError, match="GPTConfig"):
        GPT({"vocab_size": 10})


@pytest.mark.slow
def test_model_package_imports_no_framework():
    code = ("import sys, model, model.generate, model.hf; "
            "bad = [m for m in ('hydra', 'omegaconf', 'data', 'training', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


@pytest.mark.slow
def test_model_modules_import_first_and_no_local_import_hides_a_loop():
    """model.gpt and model.hf once imported each other (GPT.from_pretrained): each must import first in a
    fresh interpreter, and a function-level `import model...` (model.generate's CUDA-graph step) may not hide a
    loop: the module it imports must not import the importer back."""
    import ast
    for name in ("model.gpt", "model.hf", "model.generate"):
        subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, check=True, timeout=120)

    def imported(node):
        return [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
    trees = {p.stem: ast.parse(p.read_text()) for p in (REPO / "model").glob("*.py")}
    for stem, tree in trees.items():
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        for node in (n for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))):
            for target in (m.split(".")[1] for m in imported(node) if m.startswith("model.")):
                back = [m for n in ast.walk(trees[target]) if isinstance(n, (ast.Import, ast.ImportFrom))
                        for m in imported(n) if m == f"model.{stem}"]
                assert not back, f"{stem}.py line {node.lineno} imports model.{target}, which imports it back"


def _model(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32), **kw}))


def test_mismatches_are_one_line_in_one_wording():
    sd = _model().state_dict()
    for other, says in ((_model(n_layer=3), r"missing 12 \(e\.g\. transformer\.h\.2\."),
                        (_model(n_layer=1), r"unexpected 12 \(e\.g\. transformer\.h\.1\."),
                        (_model(n_embd=64), r"transformer\.wte\.weight has shape \(32, 32\) there but \(32, 64\) here")):
        with pytest.raises(ValueError, match=rf"^the weights in src\.pt do not match the model \({says}.*\): "
                                             r"the file's weights and its saved settings disagree") as info:
            check_weights(other, sd, "src.pt")
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"missing 1 \(e\.g\. lm_head\.weight\)"):  # a None value is missing
        check_weights(_model(), {**sd, "lm_head.weight": None}, "x")


def test_wrapper_prefixes_are_stripped():
    sd = {"_orig_mod.module.a": 1, "module.b": 2, "c": 3}
    assert clean_state_dict(sd) == {"a": 1, "b": 2, "c": 3}


@pytest.mark.parametrize("tie", [True, False])
def test_model_with_weights_takes_the_tensors_as_they_are(tie):
    src = _model(tie_weights=tie)
    sd = {f"_orig_mod.{k}": v for k, v in src.state_dict().items()}
    model = model_with_weights(GPT, src.config, sd, "src")
    assert model.transformer.wte.weight.data_ptr() == src.transformer.wte.weight.data_ptr()  # no copy
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie  # tied again after assign
    x = torch.randint(0, 32, (2, 8))
    assert torch.equal(model.eval()(x)[0], src.eval()(x)[0])
    half = model_with_weights(GPT, src.config, {k: v.half() for k, v in src.state_dict().items()}, "src")
    assert {p.dtype for p in half.parameters()} == {torch.float32}  # a float32 model, like a fresh one


def test_from_pretrained_is_nanogpts_name_for_a_local_hf_directory(tmp_path, monkeypatch):
    """Issue 43: nanoGPT's GPT.from_pretrained('gpt2') was an AttributeError. It loads a local Hugging Face
    directory (model.hf reads it); a Hub name that is no directory here is one ValueError with the command that
    downloads it (tinygpt never does); a nonexistent path is told as before (no config.json there)."""
    from model.hf import write_pretrained
    ours = _model(bias=True)
    write_pretrained(ours, 32, tmp_path / "hf")
    loaded = GPT.from_pretrained(tmp_path / "hf")
    idx = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(loaded(idx)[0], ours.eval()(idx)[0], atol=1e-6)
    assert not loaded.training and GPT.from_pretrained(str(tmp_path / "hf"), dict(dropout=0.1)).config.dropout == 0.1
    with pytest.raises(ValueError, match=r"^override_args \['n_layer'\] cannot be set: a pretrained model's shape"):
        GPT.from_pretrained(tmp_path / "hf", {"n_layer": 3})
    monkeypatch.chdir(tmp_path)
    for name, command in (("gpt2", "hf download openai-community/gpt2 config.json model.safetensors --local-dir gpt2"),
                          ("HuggingFaceTB/SmolLM2-135M", "hf download HuggingFaceTB/SmolLM2-135M --local-dir "
                                                         "SmolLM2-135M")):
        with pytest.raises(ValueError) as info:
            GPT.from_pretrained(name)
        assert str(info.value) == (f"GPT.from_pretrained('{name}') is not a local directory, and tinygpt never "
                                   f"downloads models: get it with `{command}`, then use GPT.from_pretrained("
                                   f"'{name.rsplit('/', 1)[-1]}')")
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        GPT.from_pretrained(tmp_path / "nope")
