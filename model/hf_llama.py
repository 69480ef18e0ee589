"""The Hugging Face Llama and Qwen3 formats both ways, locally (no transformers package): read
for GPT.from_pretrained (SmolLM2, Qwen3, ...), written for export.py; and which Hugging Face class,
if any, expresses a model's settings (the position scheme's part: model/positions.py's table). Our
rotary is HF's rotate_half layout, so q_proj/k_proj copy with no permutation; the fused c_attn rows
are [q; k; v] and swiglu's c_fc rows [gate; up] (docs/export_eval.md).
"""
from __future__ import annotations

import torch

from model.config import GPTConfig
from model.positions import export_family

# model_type -> class
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# transformers' config defaults
_DEFAULTS = {"llama": dict(rms_norm_eps=1e-6, max_position_embeddings=2048),
             "qwen3": dict(rms_norm_eps=1e-6, max_position_embeddings=32768)}
# ours -> HF, one to one
_LAYER = {"ln_1.weight": "input_layernorm.weight",
          "ln_2.weight": "post_attention_layernorm.weight",
          "attn.c_proj.weight": "self_attn.o_proj.weight",
          "attn.c_proj.bias": "self_attn.o_proj.bias",
          "attn.q_norm.weight": "self_attn.q_norm.weight",
          "attn.k_norm.weight": "self_attn.k_norm.weight",
          "mlp.c_proj.weight": "mlp.down_proj.weight",
          "mlp.c_proj.bias": "mlp.down_proj.bias"}
# ours -> HF's parts, in row order
_FUSED = {"attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.c_fc": ("mlp.gate_proj", "mlp.up_proj")}
_TOP = {"transformer.wte.weight": "model.embed_tokens.weight",
        "transformer.ln_f.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}


def _refuse(name: str, value, why: str) -> ValueError:
    return ValueError(f"{name}={value!r} is not supported: {why}")


def _rope_theta(hf: dict) -> float:
    """rope_theta from transformers 5's rope_parameters or the older top-level key; scaled rotary
    is refused."""
    rp = hf.get("rope_parameters") or {}
    if hf.get("rope_scaling"):
        raise _refuse("rope_scaling", hf["rope_scaling"],
                      "tinygpt's rotary has no scaling (rope_type default)")
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise _refuse("rope_parameters.rope_type", rp.get("rope_type", rp.get("type")),
                      "tinygpt's rotary has no scaling (rope_type default)")
    partial = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _refuse("partial_rotary_factor", partial, "tinygpt rotates the whole head (factor 1)")
    return float(rp.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_hf(hf: dict) -> GPTConfig:
    """Map a Hugging Face Llama or Qwen3 config.json dict onto GPTConfig (dropout 0: loaded for
    inference)."""
    kind = hf["model_type"]
    assert kind in ARCHITECTURES, kind
    hf = {**_DEFAULTS[kind], **hf}
    if hf.get("hidden_act", "silu") != "silu":
        raise _refuse("hidden_act", hf["hidden_act"], "tinygpt's swiglu gates with silu")
    theta = _rope_theta(hf)
    layers = hf.get("layer_types") or ()
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in layers):
        raise _refuse("use_sliding_window", True,
                      "tinygpt's attention is full causal attention in every layer")
    attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    # tinygpt's `bias` is one setting: every Linear has one, or none has
    if attn_bias != mlp_bias:
        raise _refuse("attention_bias", attn_bias, f"with mlp_bias={mlp_bias} (Qwen3 has no MLP "
                      "biases): tinygpt's bias setting covers attention and MLP alike")
    try:
        n_embd, n_head = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or n_embd // n_head
        n_kv = hf.get("num_key_value_heads") or n_head
        return GPTConfig(
            vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"],
            n_layer=hf["num_hidden_layers"], n_head=n_head, n_embd=n_embd, dropout=0.0,
            bias=attn_bias, tie_weights=bool(hf.get("tie_word_embeddings", False)),
            attention="sdpa", position="rope", rope_theta=theta, norm="rmsnorm",
            norm_eps=hf["rms_norm_eps"], mlp="swiglu", mlp_hidden=hf["intermediate_size"],
            n_kv_head=None if n_kv == n_head else n_kv,
            head_dim=None if head_dim * n_head == n_embd else head_dim, qk_norm=kind == "qwen3")
    except KeyError as e:
        raise ValueError(f"config.json lacks {e.args[0]!r}: is this a complete "
                         f"{ARCHITECTURES[kind]} directory?") from None


def _hf_names(config: GPTConfig):
    """(ours, HF) for each one-to-one tensor name of a model with this config."""
    for key, theirs in _TOP.items():
        if key != "lm_head.weight" or not config.tie_weights:
            yield key, theirs
    for i in range(config.n_layer):
        for ours, theirs in _LAYER.items():
            yield f"transformer.h.{i}.{ours}", f"model.layers.{i}.{theirs}"


def _fused_names(config: GPTConfig):
    """(ours, [HF parts in row order]) for the fused weights and biases of each layer."""
    for i in range(config.n_layer):
        for ours, parts in _FUSED.items():
            for suffix in ("weight", "bias") if config.bias else ("weight",):
                yield (f"transformer.h.{i}.{ours}.{suffix}",
                       [f"model.layers.{i}.{p}.{suffix}" for p in parts])


def convert_state_dict(sd: dict, config: GPTConfig) -> dict:
    """HF Llama/Qwen3 tensor names -> ours (float32): q/k/v and gate/up concatenated by rows.
    Tensors left over keep their HF names, so model.gpt.check_weights names them."""
    # old checkpoints' buffers
    sd = {k: t for k, t in sd.items() if not k.endswith("rotary_emb.inv_freq")}
    # a tied head is the embedding (some files store it twice)
    if config.tie_weights:
        sd.pop("lm_head.weight", None)
    out = {}
    for ours, theirs in _hf_names(config):
        if theirs in sd:
            out[ours] = sd.pop(theirs).to(torch.float32)
    for ours, parts in _fused_names(config):
        if all(p in sd for p in parts):
            out[ours] = torch.cat([sd.pop(p).to(torch.float32) for p in parts], dim=0)
    if config.tie_weights:
        out["lm_head.weight"] = out.get("transformer.wte.weight")
    return {**out, **sd}


def export_kind(config: GPTConfig) -> str:
    """The model_type of the Hugging Face class that computes what this model computes: gpt2, llama
    or qwen3; a ValueError naming the first setting none of them expresses."""
    c = config
    # the position scheme decides the family (model/positions.py), or refuses in one line
    family = export_family(c, "hf")
    if c.logit_softcap is not None:
        raise _refuse("logit_softcap", c.logit_softcap, "no Hugging Face class export writes has a "
                      "logit softcap: train with logit_softcap=null to export")
    if c.mlp == "relu2":
        raise _refuse("mlp", c.mlp, "no Hugging Face class export writes has a relu2 MLP: use gelu "
                      "(GPT-2) or swiglu (Llama/Qwen3) to export")
    # GPT-2: everything else must be GPT-2's too
    if family == "gpt2":
        for name, gpt2, value in (("norm", "layernorm", c.norm),
                                  ("mlp", "gelu", c.mlp.removesuffix("_exact")),
                                  ("qk_norm", False, c.qk_norm),
                                  ("n_kv_head", c.n_head, c.kv_heads),
                                  ("head_dim", c.n_embd // c.n_head, c.head_size)):
            if value != gpt2:
                raise _refuse(name, value, f"position={c.position} exports as GPT-2, which has "
                              f"{name}={gpt2}: use position=rope, norm=rmsnorm, mlp=swiglu for "
                              f"Llama/Qwen3")
        return "gpt2"
    assert family == "llama", family
    for name, llama, value in (("norm", "rmsnorm", c.norm), ("mlp", "swiglu", c.mlp)):
        if value != llama:
            raise _refuse(name, value, f"position={c.position} exports as Llama/Qwen3, which have "
                          f"{name}={llama}")
    if c.qk_norm and c.bias:
        raise _refuse("bias", True, "with qk_norm=true the export is Qwen3, whose MLP has no "
                      "biases: use bias=false")
    return "qwen3" if c.qk_norm else "llama"


def hf_config(config: GPTConfig, vocab_size: int) -> dict:
    """config.json for LlamaForCausalLM / Qwen3ForCausalLM with this model's shape and the real
    vocabulary."""
    c, kind = config, export_kind(config)
    assert kind in ARCHITECTURES, kind
    # GPT-2 BPE: <|endoftext|> begins and ends texts
    eot = vocab_size - 1 if vocab_size == 50257 else None
    # rope_theta and rope_scaling: transformers 4's keys; rope_parameters: 5's
    out = {"model_type": kind, "architectures": [ARCHITECTURES[kind]], "vocab_size": vocab_size,
           "hidden_size": c.n_embd, "intermediate_size": c.mlp_size,
           "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
           "num_key_value_heads": c.kv_heads, "head_dim": c.head_size, "hidden_act": "silu",
           "max_position_embeddings": c.block_size, "rms_norm_eps": c.norm_eps,
           "rope_theta": c.rope_theta, "rope_scaling": None,
           "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
           "attention_bias": c.bias, "attention_dropout": 0.0,
           "tie_word_embeddings": c.tie_weights, "initializer_range": 0.02,
           "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32"}
    if kind == "llama":
        out["mlp_bias"] = c.bias
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layer)
    return out


def to_hf_state_dict(model, vocab_size: int) -> dict:
    """`model`'s weights in LlamaForCausalLM's / Qwen3ForCausalLM's names (float32, CPU, own
    storage)."""
    c = model.config
    assert 1 <= vocab_size <= c.vocab_size, (vocab_size, c.vocab_size)
    sd = {k: t.detach().to("cpu", torch.float32) for k, t in model.state_dict().items()}
    # (q_norm and k_norm only with qk_norm)
    out = {theirs: sd[ours] for ours, theirs in _hf_names(c) if ours in sd}
    q_rows, kv_rows = c.n_head * c.head_size, c.kv_heads * c.head_size
    for ours, parts in _fused_names(c):
        attn = ours.split(".")[-2] == "c_attn"
        sizes = [q_rows, kv_rows, kv_rows] if attn else [c.mlp_size] * 2
        out.update(zip(parts, sd[ours].split(sizes, dim=0)))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in out:
            out[name] = out[name][:vocab_size]
    return {k: t.contiguous().clone() for k, t in out.items()}
