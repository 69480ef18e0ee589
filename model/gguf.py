"""GGUF, the file llama.cpp, LM Studio and Ollama run, written with the `gguf` package (pip
install gguf; no llama.cpp checkout): the weights under llama.cpp's tensor names and the model's
shape as its metadata, for the architecture llama.cpp computes as tinygpt does (gpt2, llama or
qwen3). The tokenizer arrives as plain values (data/gguf_vocab.py), so model/ stays free of data/.

The tensors take the Hugging Face export's road (model.hf, model.hf_llama: HF's names, q/k/v and
gate/up split) and then gguf's own TensorNameMap (HF names -> llama.cpp's), as llama.cpp's
convert_hf_to_gguf.py does. llama.cpp's llama rotates interleaved pairs (2i, 2i+1), while our rotary
pairs (i, i + head_dim/2) (HF's rotate_half, and llama.cpp's qwen3, "neox"): for llama the rows of q
and k are permuted as the converter permutes them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from model.config import GPTConfig
from model.positions import export_family

# --gguf-type: how the matrices are stored (norms and biases stay f32)
TYPES = ("f32", "f16", "bf16", "q8_0")
BOTH = "llama.cpp's gpt2, llama and qwen3 have"


def import_gguf():
    """The `gguf` package (an optional dependency: only this export uses it)."""
    try:
        import gguf
    except ImportError:
        raise ValueError("the GGUF export needs the gguf package, which is not installed: "
                         "pip install gguf") from None
    return gguf


def _refuse(name: str, value, why: str) -> ValueError:
    return ValueError(f"{name}={value!r} cannot be exported to GGUF: {why}")


def gguf_arch(config: GPTConfig) -> str:
    """The llama.cpp architecture that computes what this model computes (gpt2, llama, qwen3); a
    ValueError naming the first setting none of them has. Unlike Hugging Face's GPT-2, llama.cpp's
    gpt2 has grouped-query heads (head_count_kv)."""
    c = config
    if c.logit_softcap is not None:
        raise _refuse("logit_softcap", c.logit_softcap, f"{BOTH} no logit softcap (train with "
                      "logit_softcap=null)")
    if c.mlp == "relu2":
        raise _refuse("mlp", c.mlp, f"{BOTH} no relu2 MLP (use gelu or swiglu)")
    # the position scheme's own word on GGUF (model/positions.py): gpt2's table, llama's rotation
    gpt2 = export_family(c, "gguf") == "gpt2"
    arch = "gpt2" if gpt2 else "qwen3" if c.qk_norm else "llama"
    gpt2_has = (("norm", "layernorm"), ("mlp", "gelu"), ("qk_norm", False),
                ("head_dim", c.n_embd // c.n_head))
    has = gpt2_has if gpt2 else (("norm", "rmsnorm"), ("mlp", "swiglu"))
    ours = {"norm": c.norm, "mlp": c.mlp.removesuffix("_exact"), "qk_norm": c.qk_norm,
            "head_dim": c.head_size}
    for name, value in has:
        if ours[name] != value:
            other = ("use position=rope, norm=rmsnorm, mlp=swiglu for llama/qwen3" if gpt2 else
                     "use position=learned, norm=layernorm, mlp=gelu for gpt2")
            raise _refuse(name, ours[name], f"position={c.position} exports as llama.cpp's "
                          f"{'gpt2' if gpt2 else 'llama/qwen3'}, which has {name}={value} "
                          f"({other})")
    if arch == "qwen3" and c.bias:
        raise _refuse("bias", True, "with qk_norm=true the export is llama.cpp's qwen3, which has "
                      "no biases (use bias=false)")
    return arch


def _permute_rows(t, heads: int):
    """Rows of q or k (heads * head_dim, ...) from the rotate_half layout to llama.cpp llama's
    interleaved one: in each head, rows i and i + head_dim/2 become rows 2i and 2i+1 (as
    convert_hf_to_gguf's permute)."""
    pairs = t.reshape(heads, 2, t.size(0) // heads // 2, *t.shape[1:])
    return pairs.transpose(1, 2).reshape(t.shape)


def hf_tensors(model, vocab_size: int, arch: str) -> dict:
    """The weights in Hugging Face's names, in nn.Linear's (out, in) layout, float32 on the CPU,
    the vocabulary cut to the tokenizer's; q and k permuted for llama; GPT-2's biases present (zeros
    where the model has none: llama.cpp's gpt2 needs them). Imported here: export.py --help loads
    no torch."""
    from model import hf, hf_llama
    c = model.config
    if arch == "gpt2":
        # HF's GPT-2 stores Conv1D weights as (in, out): back to (out, in)
        sd = hf.to_hf_state_dict(model, vocab_size)
        return {k: t.t().contiguous() if k.endswith(hf._CONV1D) else t for k, t in sd.items()}
    sd = hf_llama.to_hf_state_dict(model, vocab_size)
    if arch == "llama":
        for key in [k for k in sd if ".self_attn.q_proj." in k or ".self_attn.k_proj." in k]:
            sd[key] = _permute_rows(sd[key], c.n_head if ".q_proj." in key else c.kv_heads)
    return sd


def gguf_tensors(model, vocab_size: int, arch: str) -> dict[str, np.ndarray]:
    """{llama.cpp's tensor name: float32 array} for this model, in the order they are written."""
    gguf = import_gguf()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], model.config.n_layer)
    out = {}
    for key, t in hf_tensors(model, vocab_size, arch).items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"no GGUF name for {key}"
        out[name] = t.numpy()
    return out


def _stored(gguf, name: str, data: np.ndarray, ftype: str):
    """(bytes to write, their GGML type): 1-D tensors, norms and GPT-2's position table stay f32
    (as llama.cpp's converter keeps them); a matrix whose rows do not split into Q8_0's blocks of 32
    falls back to f16, as there."""
    q = gguf.GGMLQuantizationType
    qtype = {"f32": q.F32, "f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0}[ftype]
    if data.ndim <= 1 or name.endswith("_norm.weight") or name.startswith("position_embd"):
        qtype = q.F32
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:
        return gguf.quants.quantize(data, q.F16), q.F16


def _add_shape(writer, arch: str, c: GPTConfig) -> None:
    """The hyperparameters llama.cpp reads for `arch` ({arch}.context_length, ...)."""
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_feed_forward_length(c.mlp_size)
    writer.add_head_count(c.n_head)
    writer.add_head_count_kv(c.kv_heads)
    if arch == "gpt2":
        writer.add_layer_norm_eps(c.norm_eps)
        return
    writer.add_layer_norm_rms_eps(c.norm_eps)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_rope_dimension_count(c.head_size)
    writer.add_key_length(c.head_size)
    writer.add_value_length(c.head_size)


def _add_vocab(writer, vocab: dict) -> None:
    """The tokenizer's plain values (data.gguf_vocab.gguf_vocab): tokenizer.ggml.* and
    tokenizer.chat_template."""
    writer.add_tokenizer_model(vocab["model"])
    if vocab.get("pre"):
        writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_types"])
    if vocab.get("merges") is not None:
        writer.add_token_merges(vocab["merges"])
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("eot", writer.add_eot_token_id)):
        if vocab.get(key) is not None:
            add(vocab[key])
    # tinygpt never adds a token: a prompt is its text's ids
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if vocab.get("chat_template"):
        writer.add_chat_template(vocab["chat_template"])


def _add_sampling(writer, sampling: dict) -> None:
    """sample.py's defaults as general.sampling.*, which llama.cpp's tools take as theirs (top_k 0:
    none)."""
    writer.add_sampling_temp(float(sampling["temperature"]))
    writer.add_sampling_top_k(int(sampling.get("top_k") or 0))
    writer.add_sampling_top_p(float(sampling.get("top_p") or 1.0))
    writer.add_sampling_min_p(float(sampling.get("min_p") or 0.0))
    writer.add_sampling_penalty_repeat(1.0)


def write_gguf(model, vocab: dict, path, ftype: str = "f32", *, name: str = "tinygpt",
               sampling: dict | None = None) -> dict:
    """Write `model` with the tokenizer `vocab` (data.gguf_vocab's plain values) as the GGUF file
    `path`; what was written: {"arch", "tensors": {name: GGML type name}, "bytes"}. A setting
    llama.cpp lacks: a ValueError before anything is written."""
    assert ftype in TYPES, ftype
    gguf = import_gguf()
    arch = gguf_arch(model.config)
    vocab_size = len(vocab["tokens"])
    assert vocab_size <= model.config.vocab_size, (vocab_size, model.config.vocab_size)
    tensors = gguf_tensors(model, vocab_size, arch)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16",
                 "q8_0": "MOSTLY_Q8_0"}[ftype]
    writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_shape(writer, arch, model.config)
    writer.add_vocab_size(vocab_size)
    _add_vocab(writer, vocab)
    if sampling is not None:
        _add_sampling(writer, sampling)
    stored = {}
    # a quantized type's bytes (uint8) get their shape from raw_dtype
    for tensor_name, data in tensors.items():
        raw, qtype = _stored(gguf, tensor_name, data, ftype)
        writer.add_tensor(tensor_name, raw, raw_dtype=qtype)
        stored[tensor_name] = qtype.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"arch": arch, "tensors": stored, "bytes": Path(path).stat().st_size}
