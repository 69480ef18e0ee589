"""Sampling from a GPT: a ladder of small functions, each built on the one below it.

    logits_to_probs -> sample -> prefill / decode_one_token -> generate_tokens (iterator) -> generate

- `logits_to_probs` applies temperature, then top-k, then top-p (nucleus) filtering; temperature=0 means
  greedy (a one-hot distribution on the argmax).
- `sample` draws one token per row. It uses the "exponential race" argmax(p / E), E ~ Exp(1), which
  picks token i with probability exactly p_i (like torch.multinomial) but needs no host sync, so it can
  live inside a CUDA graph. Pass a `torch.Generator` for reproducible draws.
- `prefill` runs a whole window through the model, filling a KVCache; `decode_one_token` feeds one token
  at an explicit position and reads everything before it from the cache.
- `generate_tokens` yields each new token as a (B, 1) LongTensor; `generate` collects them.

Context overflow (learned absolute positions stop at block_size). The window of tokens the model sees
starts as the prompt's last block_size tokens. Whenever the next prediction would need a window longer
than block_size, the window slides: it restarts at the most recent max(1, block_size // 2) tokens, which
are re-prefilled at positions 0.. into the cache, and decoding continues from there. Sliding by half a
block (rather than one token) keeps the cache useful: one re-prefill per block_size // 2 new tokens
instead of a full forward per token. The uncached path (use_kv_cache=False) feeds the model exactly the
same windows, so both paths produce identical tokens (up to float rounding, which the tests check).

Generation runs under torch.no_grad() and uses the model as it is: call model.eval() first (dropout).
The decode loop never waits on the device: positions are views of one `arange` made per generation (a
`torch.tensor([p])` per token would be a blocking host->device copy), and tokens are written into a
preallocated buffer.

`compile=True` (CUDA only) captures `decode_one_token` with torch.compile(mode="reduce-overhead"), i.e.
CUDA graphs over the per-layer cache tensors, whose addresses are marked static so they are written in
place; elsewhere it warns and runs the same eager cached decode. If the first compiled call fails (no
Triton, no C compiler, ...), it warns once and that token and all later ones decode eagerly, for the rest
of the process. With a `generator`, the random draw stays eager (a user's Generator cannot be captured),
so compiled and eager decoding sample the same tokens; without one, compiled code draws from inductor's
own RNG stream.
"""
from __future__ import annotations

import warnings
from typing import Iterator

import torch
import torch.nn.functional as F

from model.kv_cache import KVCache


def _check_sampling(temperature, top_k, top_p) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not temperature >= 0:  # `not >=` also rejects NaN
        raise ValueError(f"temperature={temperature!r} is invalid: use 0 (greedy) or a positive number such as 0.8")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k={top_k!r} is invalid: use a positive integer (e.g. top_k=50) or None")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not (0.0 < top_p <= 1.0)):
        raise ValueError(f"top_p={top_p!r} is outside (0, 1]: use e.g. top_p=0.9, or None to disable")


def logits_to_probs(logits, temperature=1.0, top_k=None, top_p=None) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) after temperature, top-k and top-p filtering.

    top_k is clamped to V (ties with the k-th logit are kept). top_p keeps the smallest set of most
    probable tokens whose cumulative probability is >= top_p; the most probable token is always kept.
    """
    _check_sampling(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), logits.size(-1)).float()
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of strictly better tokens
        mass_before[..., 0] = 0.0  # exact zero: the top token is always kept
        drop = mass_before >= top_p  # the kept tokens already reach top_p without this one
        probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None) -> torch.Tensor:
    """logits (B, V) -> next tokens (B, 1); temperature=0 is argmax and draws no random numbers."""
    if temperature == 0:
        _check_sampling(temperature, top_k, top_p)
        return logits.argmax(dim=-1, keepdim=True)
    probs = logits_to_probs(logits, temperature, top_k, top_p)  # (B, V)
    # Exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) is distributed as p (no host sync needed).
    if generator is None:
        e = torch.empty_like(probs).exponential_(1.0)
    else:
        e = _exponential(probs.shape, generator).to(probs.device)
    return (probs / e.clamp_min(torch.finfo(e.dtype).tiny)).argmax(dim=-1, keepdim=True)


def _exponential(shape, generator) -> torch.Tensor:
    # on the generator's device, so a CPU generator gives the same draws whatever the model's device
    return torch.empty(shape, device=generator.device).exponential_(1.0, generator=generator)


def prefill(model, idx, cache, temperature=1.0, top_k=None, top_p=None, generator=None) -> torch.Tensor:
    """Run the window idx (B, T) at positions 0..T-1, writing the cache; return the next token (B, 1)."""
    input_pos = torch.arange(idx.size(1), device=idx.device)  # (T,)
    logits, _ = model(idx, cache=cache, input_pos=input_pos)  # (B, T, V)
    return sample(logits[:, -1], temperature, top_k, top_p, generator)


def decode_one_token(model, tok, pos, cache, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Feed tok (B, 1) at position pos (a (1,) LongTensor), attending to the cache; return the next token (B, 1)."""
    logits, _ = model(tok, cache=cache, input_pos=pos)  # (B, 1, V)
    return sample(logits[:, -1], temperature, top_k, top_p, generator)


_compiled_decode = None  # set to decode_one_token once compilation has failed


def _get_compiled_decode():
    global _compiled_decode, _exponential  # compile once per process; CUDA graphs are re-recorded per new cache
    if _compiled_decode is None:
        # a user's Generator cannot be captured in a CUDA graph: draw eagerly. Wrapped here rather than with a
        # decorator: torch.compiler.disable imports torch._dynamo, ~1.3 s CPU at every start of train.py/sample.py
        _exponential = torch.compiler.disable(_exponential)
        _compiled_decode = torch.compile(decode_one_token, mode="reduce-overhead")
    return _compiled_decode


def generate_tokens(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True,
                    generator=None, compile=False) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens new tokens, each a (B, 1) LongTensor, continuing the prompt idx (B, T).

    Arguments are validated here, before the first token is asked for. See the module docstring for
    the context-overflow strategy shared by the cached and uncached paths.
    """
    _check_sampling(temperature, top_k, top_p)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point():
        raise ValueError("idx must be a (batch, time) tensor of token ids: e.g. torch.tensor([[0]])")
    if idx.size(1) == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. a newline or the end-of-text token)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use a non-negative integer")
    if compile and not use_kv_cache:
        raise ValueError("compile=True needs the KV cache: drop use_kv_cache=False or compile=True")
    decode = decode_one_token
    if compile and idx.device.type != "cuda":
        warnings.warn(f"compile=True uses CUDA graphs and needs a CUDA device; running the eager cached "
                      f"decode on {idx.device.type}", RuntimeWarning, stacklevel=2)
    elif compile:
        decode = _get_compiled_decode()
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    return _generate(model, idx.long(), max_new_tokens, use_kv_cache, decode, decode is not decode_one_token, kw)


@torch.no_grad()  # torch wraps generator functions so grad mode does not leak to the caller between yields
def _generate(model, idx, max_new_tokens, use_kv_cache, decode, static_cache, kw):
    block_size = model.config.block_size
    keep = max(1, block_size // 2)  # tokens kept when the window slides
    B, T0 = idx.shape
    tokens = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=idx.device)
    tokens[:, :T0] = idx
    n, start = T0, max(0, T0 - block_size)  # tokens so far; the window is tokens[:, start:n]
    cache = _new_cache(model, B, idx.device, static_cache) if use_kv_cache else None
    positions = torch.arange(block_size, device=idx.device)  # decode at p reads the view positions[p:p+1]
    untried = decode is not decode_one_token  # the compiled decode's first call compiles: guard it
    for i in range(max_new_tokens):
        slide = n - start > block_size  # the window cannot hold token n-1 at a known position
        if slide:
            start = n - keep
        if not use_kv_cache:
            logits, _ = model(tokens[:, start:n])  # (B, n-start, V): recompute the whole window
            tok = sample(logits[:, -1], **kw)
        elif i == 0 or slide:
            tok = prefill(model, tokens[:, start:n], cache, **kw)
        else:
            p = n - 1 - start  # position of token n-1 in the window
            args = (model, tokens[:, n - 1:n], positions[p:p + 1], cache)
            tok = _first_compiled_call(decode, args, kw) if untried else decode(*args, **kw)
            if tok is None:  # compilation failed (warned): decode this token and the rest eagerly
                decode = decode_one_token
                tok = decode(*args, **kw)  # rewrites the cache slots the failed call may have written
            untried = False
        tokens[:, n] = tok[:, 0]  # copy out: a CUDA-graph output is overwritten by the next replay
        n += 1
        yield tokens[:, n - 1:n]


def _new_cache(model, batch_size, device, static: bool) -> KVCache:
    dtype = next(model.parameters()).dtype
    if torch.is_autocast_enabled(device.type):  # store k/v in the dtype the attention computes in
        dtype = torch.get_autocast_dtype(device.type)
    cache = KVCache.for_model(model, batch_size, device=device, dtype=dtype)
    if static:  # fixed addresses let CUDA graphs write the cache in place instead of copying it
        for t in (*cache.k, *cache.v):  # guard=False (default from torch 2.10): a new cache re-records, not recompiles
            torch._dynamo.mark_static_address(t, guard=False)
    return cache


def _first_compiled_call(decode, args, kw):
    """The compiled decode's first call, which compiles it: its token, or None after a warning if it failed.

    The caller retries eagerly outside this frame, so the failed call's frames and tensors are freed first.
    The user's generator is rewound, so the retry draws what eager decoding would have drawn.
    """
    global _compiled_decode
    g = kw.get("generator")
    state = g.get_state() if g is not None else None
    try:
        return decode(*args, **kw)
    except torch.OutOfMemoryError:
        raise  # not a compiler problem, and an eager retry needs more memory, not less
    except Exception as e:  # noqa: BLE001 - inductor/Triton/C-compiler failures take many forms
        lines = str(e).strip().splitlines()
        why = f"{type(e).__name__}: {lines[0] if lines else ''}"[:200]
    warnings.warn(f"torch.compile failed ({why}): decoding without compilation", RuntimeWarning,
                  stacklevel=4)  # past _generate and no_grad's generator wrapper: who asked for the token
    _compiled_decode = decode_one_token  # later generations skip the compiler too (warned once)
    if g is not None:
        g.set_state(state)
    return None


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True,
             generator=None, compile=False) -> torch.Tensor:
    """idx (B, T) -> (B, T + max_new_tokens): the prompt followed by the generated tokens."""
    new = list(generate_tokens(model, idx, max_new_tokens, temperature, top_k, top_p, use_kv_cache,
                               generator, compile))
    return torch.cat([idx.long(), *new], dim=1)
