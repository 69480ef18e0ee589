"""The Hugging Face GPT-2 format both ways, locally (no network, no transformers package): read for
GPT.from_pretrained (sample.py --init, eval.py --hf, fine-tuning), written for export.py. Our module
names are GPT-2's, so the mapping is small.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from common.files import with_open_mode
from model import hf_llama
from model.config import GPTConfig
from model.positions import export_family

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# names HF uses for the same tanh formula
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
ERF_GELU = "gelu"  # HF's name for the exact (erf) GELU, tinygpt's mlp=gelu_exact
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",  # in order of preference
                "pytorch_model.bin", "pytorch_model.bin.index.json")


def config_from_hf(hf: dict) -> GPTConfig:
    """Map a Hugging Face GPT-2 config.json dict onto GPTConfig (dropout 0: loaded models are for
    inference); Llama and Qwen3 configs go to model.hf_llama."""
    if hf.get("model_type") in hf_llama.ARCHITECTURES:
        return hf_llama.config_from_hf(hf)
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"model_type={hf.get('model_type')!r} is not supported: "
                         "only GPT-2, Llama and Qwen3 checkpoints (model_type gpt2, llama, qwen3) "
                         "load")
    act = hf.get("activation_function", "gelu_new")
    if act not in (*_TANH_GELU, ERF_GELU):
        raise ValueError(f"activation_function={act!r} is not supported: tinygpt's GPT-2 MLP "
                         "computes GELU, tanh (gelu_new) or exact (gelu)")
    unsupported = {"scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
                   "scale_attn_weights": True}
    for key, ours in unsupported.items():
        if hf.get(key, ours) != ours:
            raise ValueError(f"{key}={hf[key]} is not supported: tinygpt's attention assumes "
                             f"{key}={ours}")
    try:
        return GPTConfig(vocab_size=hf["vocab_size"],
                         block_size=hf.get("n_positions", hf.get("n_ctx")),
                         n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"],
                         dropout=0.0,
                         bias=True, tie_weights=hf.get("tie_word_embeddings", True),
                         attention="sdpa",
                         norm_eps=hf.get("layer_norm_epsilon", 1e-5), mlp_hidden=hf.get("n_inner"),
                         mlp="gelu_exact" if act == ERF_GELU else "gelu")
    except KeyError as e:
        raise ValueError(f"config.json lacks {e.args[0]!r}: is this a GPT-2 checkpoint "
                         f"directory?") from None


def _load_file(path: Path) -> dict:
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ValueError(f"{path} needs the safetensors package: pip install safetensors "
                             "(or provide pytorch_model.bin instead)") from None
        return load_file(str(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, or pickled objects that weights_only refuses
        raise ValueError(f"cannot read {path} as a tensor-only checkpoint ({type(e).__name__}): "
                         "re-download it or convert it to safetensors") from None


def load_hf_state_dict(path: Path) -> dict:
    """The raw tensors of a HF checkpoint dir: safetensors first, then pytorch_model.bin, sharded or
    not."""
    for name in WEIGHT_FILES:
        if (path / name).is_file() and name.endswith(".index.json"):
            shards = sorted(set(json.loads((path / name).read_text())["weight_map"].values()))
            return {k: t for shard in shards for k, t in _load_file(path / shard).items()}
        if (path / name).is_file():
            return _load_file(path / name)
    raise FileNotFoundError(f"no weights in {path}: expected model.safetensors or "
                            "pytorch_model.bin (e.g. `hf download gpt2 --local-dir <dir>`)")


def convert_hf_state_dict(sd: dict, config: GPTConfig) -> dict:
    """HF GPT-2 tensor names/layouts -> ours (float32; Conv1D weights transposed to nn.Linear
    layout)."""
    # the position scheme's family (model/positions.py): Llama/Qwen3's rotary, or GPT-2's table
    if export_family(config, "hf") == "llama":
        return hf_llama.convert_state_dict(sd, config)
    out = {}
    for key, t in sd.items():
        key = key.removeprefix("transformer.")
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # old checkpoints store the causal-mask buffers; we build masks on the fly
        if key != "lm_head.weight":
            key = "transformer." + key
        t = t.to(torch.float32)
        out[key] = t.t().contiguous() if key.endswith(_CONV1D) else t
    if config.tie_weights:  # HF saves a tied head once (or not at all): the embedding is the head
        out["lm_head.weight"] = out.get("transformer.wte.weight")
    return out


def read_config(path) -> GPTConfig:
    """Our config for a local HF GPT-2 directory: FileNotFoundError without config.json, ValueError
    if unsupported."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}/config.json not found: point from_pretrained at a local "
                                "HF GPT-2 directory (config.json + model.safetensors or "
                                "pytorch_model.bin)")
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}/config.json is not valid JSON ({e.msg} at line {e.lineno}): "
                         "re-download it") from None
    if not isinstance(hf_config, dict):
        raise ValueError(f"{path}/config.json holds no JSON object: re-download it")
    return config_from_hf(hf_config)


def read_pretrained(path) -> tuple[GPTConfig, dict]:
    """(our config, the weights in our names and layouts) of a local Hugging Face GPT-2 directory
    (124M to 1.5B; Llama and Qwen3 through model.hf_llama): what model.gpt.GPT.from_pretrained
    loads."""
    config = read_config(path)
    return config, convert_hf_state_dict(load_hf_state_dict(Path(path).expanduser()), config)


def hf_config(config: GPTConfig, vocab_size: int) -> dict:
    """config.json for transformers' GPT2LMHeadModel with this model's shape and the real (unpadded)
    vocabulary."""
    # GPT-2 BPE: <|endoftext|> begins and ends texts
    eot = vocab_size - 1 if vocab_size == 50257 else None
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": vocab_size,
            "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
            "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": config.mlp_hidden,
            "activation_function": ERF_GELU if config.mlp == "gelu_exact" else "gelu_new",
            "layer_norm_epsilon": config.norm_eps, "initializer_range": 0.02,
            "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout,
            "tie_word_embeddings": config.tie_weights, "bos_token_id": eot, "eos_token_id": eot,
            "torch_dtype": "float32"}


def to_hf_state_dict(model, vocab_size: int) -> dict:
    """`model`'s weights in GPT2LMHeadModel's names and layouts (float32, CPU; see docs/design.md).
    """
    c = model.config
    assert 1 <= vocab_size <= c.vocab_size, (vocab_size, c.vocab_size)
    out, sd = {}, model.state_dict()
    for key, t in sd.items():
        t = t.detach().to("cpu", torch.float32)
        if key == "lm_head.weight" and c.tie_weights:
            continue  # HF ties it to wte on load
        if key in ("lm_head.weight", "transformer.wte.weight"):
            t = t[:vocab_size]
        # own storage: safetensors
        out[key] = (t.t() if key.endswith(_CONV1D) else t).contiguous().clone()
    # HF's GPT-2 has a bias wherever a block or ln_f has a weight; zeros compute no bias
    if not c.bias:
        # (out, in): t.size(0) is out
        out.update({k.removesuffix("weight") + "bias": torch.zeros(t.size(0)) for k, t in sd.items()
                    if k.startswith(("transformer.h.", "transformer.ln_f."))})
    return out


def write_pretrained(model, vocab_size: int, out_dir) -> list[Path]:
    """config.json + model.safetensors in `out_dir` (created): what GPT2LMHeadModel.from_pretrained
    reads (or LlamaForCausalLM's / Qwen3ForCausalLM's, for rotary models; settings none of them has:
    ValueError)."""
    from safetensors.torch import save_file
    out_dir = Path(out_dir)
    gpt2 = hf_llama.export_kind(model.config) == "gpt2"
    config, sd = ((hf_config, to_hf_state_dict) if gpt2
                  else (hf_llama.hf_config, hf_llama.to_hf_state_dict))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config(model.config, vocab_size),
                                                    indent=2) + "\n")
    # safetensors writes it 0600, unlike the other files
    with with_open_mode(out_dir / "model.safetensors"):
        save_file(sd(model, vocab_size), str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
    return [out_dir / "config.json", out_dir / "model.safetensors"]
