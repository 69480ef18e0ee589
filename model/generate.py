"""Sampling from a GPT as a ladder of small functions, each built on the one below (gpt-fast's
generate.py) and each taking one Sampling (model/sampling.py, whose rules logits_to_probs applies)
whole: a KVCache written at explicit positions, next_token_probs (a prefill or one decode step),
the random draw, the token loop. The tokens so far are one static buffer, which the rules read on
every path. A faster decode step (CUDA) is chosen by the caller (model/fast_decode.py) and passed
in: this file never imports it. The window past block_size and the exact draw: docs/design.md,
Model and generation."""
from __future__ import annotations

from typing import Iterator

import torch

from model.sampling import WINDOWS, Sampling, logits_to_probs


class KVCache:
    """Static: all max_len slots, fixed shapes for CUDA graphs and torch.compile; dynamic: only the
    filled prefix."""

    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 *, device=None, dtype: torch.dtype = torch.float32, static: bool = True):
        # n_head: the key/value heads (n_kv_head with GQA)
        shape = (batch_size, n_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.batch_size, self.max_len, self.static = batch_size, max_len, static

    @classmethod
    def for_model(cls, model, batch_size: int, *, max_len: int | None = None, device=None,
                  dtype: torch.dtype | None = None, static: bool = True) -> "KVCache":
        """A cache sized for `model` (max_len defaults to its block_size, the largest position it
        knows), storing k/v in the dtype attention computes in (dtype defaults to autocast's if on,
        else the weights')."""
        c, p = model.config, next(model.parameters())
        kind = torch.device(device or p.device).type
        dtype = dtype or (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind)
                          else p.dtype)
        return cls(c.n_layer, batch_size, c.kv_heads, max_len or c.block_size, c.head_size,
                   device=device or p.device, dtype=dtype, static=static)

    def width(self, input_pos: torch.Tensor) -> int:
        """Key slots queries at input_pos (T,) see: all max_len if static, else the filled prefix
        (a host read)."""
        return self.max_len if self.static else int(input_pos[-1]) + 1

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, nh, T, hs) at input_pos (T,); return this layer's first `width` slots
        (B, nh, width, hs)."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all.index_copy_(2, input_pos, k.to(k_all.dtype))  # cast: k may be bf16 under autocast
        v_all.index_copy_(2, input_pos, v.to(v_all.dtype))
        if self.static:
            return k_all, v_all
        n = self.width(input_pos)
        return k_all[:, :, :n], v_all[:, :, :n]


def draw(probs, sampling: Sampling = Sampling(), generator=None) -> torch.Tensor:
    """probs (B, V) -> tokens (B, 1): the most probable if sampling.greedy, with no random draw,
    else drawn ~ probs by the exponential race argmax(p / E), exact like torch.multinomial but with
    no host sync."""
    if sampling.greedy:
        return probs.argmax(dim=-1, keepdim=True)
    # on the generator's device, so a CPU generator gives the same draws whatever the model's device
    e = (torch.empty_like(probs).exponential_(1.0) if generator is None else
         torch.empty(probs.shape, device=generator.device).exponential_(1.0, generator=generator)
         .to(probs.device))
    return (probs / e.clamp_min(torch.finfo(e.dtype).tiny)).argmax(dim=-1, keepdim=True)


def sample(logits, tokens, sampling: Sampling = Sampling(), generator=None) -> torch.Tensor:
    """logits (B, V) and the tokens so far (B, L) -> next tokens (B, 1) under `sampling`."""
    return draw(logits_to_probs(logits, tokens, sampling), sampling, generator)


def next_token_probs(model, idx, input_pos, cache, tokens, sampling: Sampling) -> torch.Tensor:
    """Run idx (B, T) at positions input_pos (T,), writing its keys and values into the cache (if
    any) and attending to the cache's earlier ones: the next token's probabilities (B, V) under
    `sampling`, whose rules read `tokens` (B, L), the tokens so far. A prefill is the whole window
    at 0..T-1, a decode step one token at its position: the step model/fast_decode.py makes fast."""
    logits, _ = model(idx, cache=cache, input_pos=input_pos, last_only=True)  # (B, 1, V)
    return logits_to_probs(logits[:, -1], tokens, sampling)


# inference_mode: no_grad minus per-op bookkeeping (~5% of a CPU step); not leaked to the caller
# between yields
@torch.inference_mode()
def _token_loop(model, idx, max_new_tokens, sampling, use_kv_cache, decode, generator,
                window) -> Iterator[torch.Tensor]:
    """Prefill the window, then decode one token at a time (with `decode`), drawing each; past
    block_size the window restarts at its last half, re-prefilled (or, `window` "sliding", is the
    last block_size tokens, re-prefilled for every token, as nanoGPT's generate crops it). Without
    the cache every token is a prefill of the same windows."""
    block_size, (B, T0) = model.config.block_size, idx.shape
    # the tokens so far, which the rules read, at fixed addresses (a CUDA graph reads them too):
    # token n in slot n, -1 in the slots not drawn yet; and no per-token cat
    tokens = torch.full((B, T0 + max_new_tokens), -1, dtype=torch.long, device=idx.device)
    tokens[:, :T0] = idx
    n, start = T0, max(0, T0 - block_size)  # tokens so far; the window is tokens[:, start:n]
    # static (fixed shapes) for a fast step, and off the CPU so that eager runs its kernels; a CPU
    # cache reads only its prefix. As many slots as this generation fills: a 40,960-token context
    # (Qwen3) is not allocated whole.
    static = decode is not next_token_probs or idx.device.type != "cpu"
    cache = KVCache.for_model(model, B, max_len=min(block_size, T0 + max_new_tokens),
                              device=idx.device, static=static) if use_kv_cache else None
    positions = torch.arange(block_size, device=idx.device)  # views of it: no copy per token
    keep = block_size if window == "sliding" else max(1, block_size // 2)
    for i in range(max_new_tokens):
        # token n-1 would have no position: keep the window's last `keep` tokens
        slide = n - start > block_size
        if slide:
            start = n - keep
        if cache is None or i == 0 or slide:  # prefill: the window at 0..T-1
            probs = next_token_probs(model, tokens[:, start:n], positions[:n - start], cache,
                                     tokens, sampling)
        else:  # decode: token n-1 at its position, the earlier ones from the cache
            probs = decode(model, tokens[:, n - 1:n], positions[n - 1 - start:n - start], cache,
                           tokens, sampling)
        # the draw stays eager: see fast_decode.py
        tokens[:, n] = draw(probs, sampling, generator)[:, 0]
        n += 1
        yield tokens[:, n - 1:n]


def generate_tokens(model, idx, max_new_tokens, sampling: Sampling = Sampling(), use_kv_cache=True,
                    generator=None, decode=next_token_probs,
                    window: str = "half") -> Iterator[torch.Tensor]:
    """Yield max_new_tokens (B, 1) LongTensors continuing idx (B, T), drawn under `sampling`
    (checked when it was made); arguments are checked now, not at the first token; call
    model.eval() first. `decode`: the one-token step, next_token_probs or a faster one from
    model.fast_decode.pick_decode (CUDA graphs, torch.compile); `window`: the context past
    block_size (WINDOWS)."""
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling={sampling!r} is not a Sampling: pass e.g. "
                         "Sampling(temperature=0.8, top_k=50)")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point():
        raise ValueError("idx must be a (batch, time) tensor of token ids: e.g. "
                         "torch.tensor([[0]])")
    if idx.size(1) == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. a newline or the "
                         "end-of-text token)")
    if (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
            or max_new_tokens < 0):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use a non-negative "
                         "integer")
    if decode is not next_token_probs and not use_kv_cache:
        raise ValueError("a compiled or CUDA-graph decode step needs the KV cache: drop "
                         "use_kv_cache=False, or the decode step")
    if window not in WINDOWS:
        raise ValueError(f"window={window!r} is not known: use one of {', '.join(WINDOWS)}")
    return _token_loop(model, idx.long(), max_new_tokens, sampling, use_kv_cache, decode,
                       generator, window)


def generate(model, idx, max_new_tokens, sampling: Sampling = Sampling(), use_kv_cache=True,
             generator=None, decode=next_token_probs, window: str = "half") -> torch.Tensor:
    """idx (B, T) -> (B, T + max_new_tokens): the prompt followed by the generated tokens."""
    return torch.cat([idx.long(), *generate_tokens(model, idx, max_new_tokens, sampling,
                                                  use_kv_cache, generator, decode, window)], dim=1)
