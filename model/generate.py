"""Sampling from a GPT: a ladder of small functions, each built on the one below (as gpt-fast's generate.py), over
a KVCache (per-layer key/value buffers allocated once, written in place at explicit positions). The ladder, the
sliding window and the engine's CUDA-graph/compile fallback: docs/design.md, Model and generation.
"""
from __future__ import annotations

import warnings
from functools import partial
from typing import Iterator

import torch
import torch.nn.functional as F

from common.cli import failure_reason


class KVCache:
    """Static: all max_len slots, fixed shapes for CUDA graphs and torch.compile; dynamic: only the filled prefix."""

    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 *, device=None, dtype: torch.dtype = torch.float32, static: bool = True):
        shape = (batch_size, n_head, max_len, head_dim)  # n_head: the key/value heads (n_kv_head with GQA)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.batch_size, self.max_len, self.static = batch_size, max_len, static

    @classmethod
    def for_model(cls, model, batch_size: int, *, max_len: int | None = None, device=None,
                  dtype: torch.dtype | None = None, static: bool = True) -> "KVCache":
        """A cache sized for `model` (max_len defaults to its block_size, the largest position it knows), storing
        k/v in the dtype attention computes in (dtype defaults to autocast's if on, else the weights')."""
        c, p = model.config, next(model.parameters())
        kind = torch.device(device or p.device).type
        dtype = dtype or (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else p.dtype)
        return cls(c.n_layer, batch_size, c.kv_heads, max_len or c.block_size, c.head_size,
                   device=device or p.device, dtype=dtype, static=static)

    def width(self, input_pos: torch.Tensor) -> int:
        """Key slots queries at input_pos (T,) see: all max_len if static, else the filled prefix (a host read)."""
        return self.max_len if self.static else int(input_pos[-1]) + 1

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, nh, T, hs) at input_pos (T,); return this layer's first `width` slots (B, nh, width, hs)."""
        k_all, v_all = self.k[layer], self.v[layer]
        k_all.index_copy_(2, input_pos, k.to(k_all.dtype))  # cast: k may be bf16 under autocast
        v_all.index_copy_(2, input_pos, v.to(v_all.dtype))
        if self.static:
            return k_all, v_all
        n = self.width(input_pos)
        return k_all[:, :, :n], v_all[:, :, :n]


def _check_sampling(temperature, top_k, top_p, vocab_limit=None) -> None:
    def number(x, whole=False):  # bool is an int, but True is a typo, not 1
        return not isinstance(x, bool) and isinstance(x, int if whole else (int, float))
    if not (number(temperature) and 0 <= temperature < float("inf")):  # also rejects NaN
        raise ValueError(f"temperature={temperature!r} is invalid: use 0 (greedy) or a positive number such as 0.8")
    if top_k is not None and not (number(top_k, whole=True) and top_k >= 1):
        raise ValueError(f"top_k={top_k!r} is invalid: use a positive integer (e.g. top_k=50) or None")
    if top_p is not None and not (number(top_p) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p={top_p!r} is outside (0, 1]: use e.g. top_p=0.9, or None to disable")
    if vocab_limit is not None and not (number(vocab_limit, whole=True) and vocab_limit >= 1):
        raise ValueError(f"vocab_limit={vocab_limit!r} is invalid: use the tokenizer's vocabulary size, or None")


def limit_vocab(logits, vocab_limit=None) -> torch.Tensor:
    """logits (..., V) with ids >= vocab_limit at -inf: rows of a padded vocabulary are never sampled."""
    if vocab_limit is None or vocab_limit >= logits.size(-1):
        return logits
    return logits.masked_fill(torch.arange(logits.size(-1), device=logits.device) >= vocab_limit, float("-inf"))


# Sampling computes in float32. A temperature below its smallest normal number cannot be divided by (a GPU flushes
# it to 0; 5e-324 is 0 in float32): it samples as temperature 0 does. Any other is exact: see logits_to_probs.
GREEDY_BELOW = torch.finfo(torch.float32).tiny  # 1.18e-38


def greedy(temperature) -> bool:
    """Does `temperature` (checked) sample greedily: argmax, no random draw? 0, or positive but below GREEDY_BELOW.
    The one rule every decode path (eager, CUDA graph, compiled) and the explorer follow."""
    return temperature < GREEDY_BELOW


def logits_to_probs(logits, temperature=1.0, top_k=None, top_p=None, vocab_limit=None) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) after the vocab limit, temperature, top-k (clamped to V, ties
    kept) and top-p (the smallest set of most probable tokens with mass >= top_p; the top one always stays).
    Finite for every temperature: the logits are shifted so the largest is 0 before dividing (the same softmax),
    so a tiny temperature gives the argmax all the mass (exact ties share it) instead of inf - inf = NaN."""
    _check_sampling(temperature, top_k, top_p, vocab_limit)
    logits = limit_vocab(logits.float(), vocab_limit)
    if greedy(temperature):
        return F.one_hot(logits.argmax(dim=-1), logits.size(-1)).float()
    if top_k is not None:  # before the temperature, which is monotonic: no two logits can merge into one first
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # a temperature past float32's largest number would be inf there, and -inf / inf is NaN
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / min(temperature, torch.finfo(torch.float32).max)
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of strictly better tokens
        mass_before[..., 0] = 0.0  # exact zero: the top token is always kept
        drop = mass_before >= top_p  # the kept tokens already reach top_p without this one
        probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None, vocab_limit=None) -> torch.Tensor:
    """logits (B, V) -> next tokens (B, 1); a greedy temperature (0, see `greedy`) is argmax, with no random draw."""
    _check_sampling(temperature, top_k, top_p, vocab_limit)
    if greedy(temperature):
        return limit_vocab(logits, vocab_limit).argmax(dim=-1, keepdim=True)
    return draw(logits_to_probs(logits, temperature, top_k, top_p, vocab_limit), generator)


def draw(probs, generator=None) -> torch.Tensor:
    """probs (B, V) -> tokens (B, 1) drawn ~ probs by the exponential race (no host sync; see docs/design.md)."""
    e = (torch.empty_like(probs).exponential_(1.0) if generator is None
         else _exponential(probs.shape, generator).to(probs.device))
    return (probs / e.clamp_min(torch.finfo(e.dtype).tiny)).argmax(dim=-1, keepdim=True)


def _exponential(shape, generator) -> torch.Tensor:
    if torch.compiler.is_compiling():  # a user's Generator cannot be captured in a CUDA graph: draw eagerly
        return torch.compiler.disable(_exponential)(shape, generator)  # (not a decorator: ~1.3 s import at start)
    # on the generator's device, so a CPU generator gives the same draws whatever the model's device
    return torch.empty(shape, device=generator.device).exponential_(1.0, generator=generator)


def prefill(model, idx, cache, **kw) -> torch.Tensor:
    """Run the window idx (B, T) at positions 0..T-1, writing the cache; return the next token (B, 1)."""
    logits, _ = model(idx, cache=cache, input_pos=torch.arange(idx.size(1), device=idx.device), last_only=True)
    return sample(logits[:, -1], **kw)


def decode_one_token(model, tok, pos, cache, **kw) -> torch.Tensor:
    """Feed tok (B, 1) at position pos (a (1,) LongTensor), attending to the cache; return the next token (B, 1)."""
    logits, _ = model(tok, cache=cache, input_pos=pos)  # (B, 1, V)
    return sample(logits[:, -1], **kw)


def _step_before_draw(model, tok, pos, cache, temperature, top_k, top_p, vocab_limit) -> torch.Tensor:
    """decode_one_token up to its random draw: the next token (B, 1) if greedy(temperature), else probs (B, V)."""
    logits, _ = model(tok, cache=cache, input_pos=pos)
    if greedy(temperature):
        return sample(logits[:, -1], 0, vocab_limit=vocab_limit)
    return logits_to_probs(logits[:, -1], temperature, top_k, top_p, vocab_limit)


class GraphedDecode:
    """decode_one_token with the step up to the (eager) draw replayed as a CUDA graph captured at the first call
    (capture=False: uncaptured). One per generation: the graph holds the first call's model and static cache."""

    def __init__(self, capture: bool = True):
        self.capture, self.step, self.cache = capture, None, None

    def __call__(self, model, tok, pos, cache, temperature=1.0, top_k=None, top_p=None, generator=None,
                 vocab_limit=None) -> torch.Tensor:
        if self.step is None:
            assert cache.static, "a graph needs fixed shapes: KVCache(static=True)"
            from model.cuda_graph import GraphedStep  # CUDA only: a sampling run on the CPU never imports it
            fn = partial(_step_before_draw, model, cache=cache, temperature=temperature, top_k=top_k,
                         top_p=top_p, vocab_limit=vocab_limit)
            self.step, self.cache = GraphedStep(fn, tok, pos, capture=self.capture), cache
        assert cache is self.cache, "one GraphedDecode per generation"
        out = self.step(tok, pos)
        return out if greedy(temperature) else draw(out, generator)


class DecodeEngine:
    """Runs generations: prefill, then the one-token step picked here (eager, a GraphedDecode, or torch.compile'd
    once per engine). A failed capture or compile warns once, then this engine decodes eagerly."""

    def __init__(self):
        self.cuda_graphs_work = True  # False once a capture has failed
        self.compiled = None  # the compiled decode_one_token; decode_one_token itself once compiling failed

    def pick(self, device, compile, cuda_graphs, use_kv_cache):
        """The decode step for a generation on `device` (see generate_tokens)."""
        if compile and device.type != "cuda":
            warnings.warn(f"compile=True uses CUDA graphs and needs a CUDA device; running the eager cached "
                          f"decode on {device.type}", RuntimeWarning, stacklevel=3)
        elif compile:
            if self.compiled is None:
                self.compiled = torch.compile(decode_one_token, mode="reduce-overhead")
            return self.compiled
        elif (cuda_graphs and use_kv_cache and device.type == "cuda" and self.cuda_graphs_work
              and not torch.is_autocast_enabled("cuda")):  # autocast's weight-cast cache outlives no graph
            return GraphedDecode()
        return decode_one_token

    # inference_mode: no_grad minus per-op bookkeeping (~5% of a CPU step); not leaked to the caller between yields
    @torch.inference_mode()
    def tokens(self, model, idx, max_new_tokens, use_kv_cache, decode, kw) -> Iterator[torch.Tensor]:
        """Yield max_new_tokens (B, 1) tokens continuing idx (B, T), decoding with `decode` (from pick)."""
        block_size = model.config.block_size
        keep = max(1, block_size // 2)  # tokens kept when the window slides
        B, T0 = idx.shape
        tokens = torch.empty(B, T0 + max_new_tokens, dtype=torch.long, device=idx.device)  # no per-token cat
        tokens[:, :T0] = idx
        n, start = T0, max(0, T0 - block_size)  # tokens so far; the window is tokens[:, start:n]
        untried = decode is not decode_one_token  # a compiled/graphed decode's first call compiles/captures
        # static (fixed-shape) off the CPU too, so eager runs the graph's kernels; a CPU cache reads only its prefix
        static = untried or idx.device.type != "cpu"
        # as many slots as this generation can fill: a 40,960-token context (Qwen3) would otherwise be allocated whole
        max_len = min(block_size, T0 + max_new_tokens)
        cache = KVCache.for_model(model, B, max_len=max_len, device=idx.device, static=static) if use_kv_cache else None
        if cache is not None and untried and decode is self.compiled:  # fixed addresses let inductor's CUDA
            for t in (*cache.k, *cache.v):  # graphs write the cache in place; guard=False: a new cache re-records
                torch._dynamo.mark_static_address(t, guard=False)
        positions = torch.arange(block_size, device=idx.device)  # views of it: no host->device copy per token
        for i in range(max_new_tokens):
            slide = n - start > block_size  # the window cannot hold token n-1 at a known position
            if slide:
                start = n - keep
            if not use_kv_cache:  # recompute the whole window
                tok = sample(model(tokens[:, start:n], last_only=True)[0][:, -1], **kw)
            elif i == 0 or slide:
                tok = prefill(model, tokens[:, start:n], cache, **kw)
            else:
                p = n - 1 - start  # position of token n-1 in the window
                args = (model, tokens[:, n - 1:n], positions[p:p + 1], cache)
                tok = self._first_call(decode, args, kw) if untried else decode(*args, **kw)
                if tok is None:  # compiling/capturing failed (warned): decode this token and the rest eagerly
                    decode = decode_one_token
                    tok = decode(*args, **kw)  # rewrites the cache slots the failed call may have written
                untried = False
            tokens[:, n] = tok[:, 0]  # copy out: a CUDA graph's output is overwritten by the next replay
            n += 1
            yield tokens[:, n - 1:n]

    def _first_call(self, decode, args, kw):
        """A compiled/graphed decode's first call: its token, or None (warned, generator rewound) if that failed."""
        g = kw.get("generator")
        state = g.get_state() if g is not None else None
        try:
            return decode(*args, **kw)
        except torch.OutOfMemoryError:
            raise  # not a compiler problem, and an eager retry needs more memory, not less
        except Exception as e:  # noqa: BLE001 - inductor/Triton/C-compiler/capture failures take many forms
            why = failure_reason(e)
        if isinstance(decode, GraphedDecode):
            msg, self.cuda_graphs_work = f"CUDA graph capture failed ({why}): decoding without CUDA graphs", False
        else:
            msg, self.compiled = f"torch.compile failed ({why}): decoding without compilation", decode_one_token
        # later generations skip the compiler/capture too (warned once); stacklevel: past tokens() and
        # inference_mode's generator wrapper, to whoever asked for the token
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
        if g is not None:
            g.set_state(state)
        return None


ENGINE = DecodeEngine()


def generate_tokens(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True,
                    generator=None, compile=False, vocab_limit=None, cuda_graphs=True) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens (B, 1) LongTensors continuing idx (B, T), never an id >= vocab_limit; arguments are
    checked now, not at the first token; call model.eval() first. CUDA graphs and compile: docs/design.md."""
    _check_sampling(temperature, top_k, top_p, vocab_limit)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point():
        raise ValueError("idx must be a (batch, time) tensor of token ids: e.g. torch.tensor([[0]])")
    if idx.size(1) == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. a newline or the end-of-text token)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: use a non-negative integer")
    if compile and not use_kv_cache:
        raise ValueError("compile=True needs the KV cache: drop use_kv_cache=False or compile=True")
    decode = ENGINE.pick(idx.device, compile, cuda_graphs, use_kv_cache)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, vocab_limit=vocab_limit)
    return ENGINE.tokens(model, idx.long(), max_new_tokens, use_kv_cache, decode, kw)


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_kv_cache=True,
             generator=None, compile=False, vocab_limit=None, cuda_graphs=True) -> torch.Tensor:
    """idx (B, T) -> (B, T + max_new_tokens): the prompt followed by the generated tokens."""
    return torch.cat([idx.long(), *generate_tokens(model, idx, max_new_tokens, temperature, top_k, top_p,
                                                  use_kv_cache, generator, compile, vocab_limit, cuda_graphs)], dim=1)
