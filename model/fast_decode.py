"""The decode step made fast on CUDA, chosen by the caller and passed to generate_tokens(decode=...)
(gpt-fast's way: model/generate.py never imports this file, and a CPU run never loads it). At batch
1 a step is hundreds of tiny kernels and the GPU waits for the CPU to launch them: so the step is
replayed as a CUDA graph, captured over the eager step (no compiler), or torch.compile'd. Only the
step is fast: the random draw stays in generate.py's loop, so a user's generator advances as in
eager mode. The step reads the generation's buffers (the KV cache, the tokens so far) at fixed
addresses and knows nothing of what the sampling rules do with them. A failed capture or compile
warns once; the step then runs eagerly.
"""
from __future__ import annotations

import warnings
from functools import partial

import torch

from common.cli import failure_reason
from model.generate import next_token_probs


def pick_decode(device, compile: bool = False, cuda_graphs: bool = True, use_kv_cache: bool = True):
    """The decode step for generate_tokens(decode=...) on `device`: torch.compile'd if `compile`,
    else replayed as a CUDA graph if `cuda_graphs` and the KV cache are on (both CUDA only), else
    the eager next_token_probs."""
    if compile and device.type != "cuda":
        warnings.warn(f"compile=True uses CUDA graphs and needs a CUDA device; running the eager "
                      f"cached decode on {device.type}", RuntimeWarning, stacklevel=2)
    elif compile:
        return FastDecode(compile=True)
    # (autocast's weight-cast cache outlives no graph)
    elif (cuda_graphs and use_kv_cache and device.type == "cuda"
          and not torch.is_autocast_enabled("cuda")):
        return FastDecode()
    return next_token_probs


class GraphedStep:
    """fn(*inputs) -> tensor, run on its own copies of the inputs, at fixed addresses. capture=True
    (CUDA): captured once; each call copies the inputs in, replays, and returns the graph's output,
    which the next call overwrites. capture=False runs fn uncaptured on the same buffers (testable
    on a CPU). fn must not sync with the host, allocate outside the graph, or depend on anything
    but the inputs and tensors at fixed addresses."""

    def __init__(self, fn, *example_inputs: torch.Tensor, capture: bool = True, warmup: int = 2):
        self.fn = fn
        self.inputs = tuple(x.clone() for x in example_inputs)
        self.graph, self.out = None, None
        if capture:
            self._capture(warmup)

    def _capture(self, warmup: int) -> None:
        with torch.cuda.device(self.inputs[0].device):  # the inputs' GPU (cuda:1), not the current
            # warm up (lazy init, cuBLAS workspaces) and capture off the default stream, as the
            # CUDA-graph docs ask
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self.fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                out = self.fn(*self.inputs)
        self.graph, self.out = graph, out  # set only once capture succeeded

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        for buf, x in zip(self.inputs, inputs):
            buf.copy_(x)  # device to device, asynchronous
        if self.graph is None:
            return self.fn(*self.inputs)
        self.graph.replay()
        return self.out


class FastDecode:
    """next_token_probs over a static KVCache, torch.compile'd (compile=True) or replayed as a CUDA
    graph captured at the first call on each new generation's buffers (capture=False: run
    uncaptured on the graph's buffers, testable on a CPU). One serves many generations (a graph
    holds its first call's model and Sampling); if a first call on new buffers fails (compiling,
    capturing), it warns once, and that token and every later one decode eagerly. Out of memory is
    raised: an eager retry needs more memory, not less."""

    def __init__(self, compile: bool = False, capture: bool = True):
        self.compiled = (torch.compile(next_token_probs, mode="reduce-overhead") if compile
                         else None)
        self.kind = "compiled" if compile else "CUDA graphs"  # what makes it fast, for messages
        self.capture, self.works = capture, True
        # the generation's buffers (cache, tokens so far) the step was last made fast for; its graph
        self.buffers, self.graph = None, None

    def __call__(self, model, tok, pos, cache, tokens, sampling) -> torch.Tensor:
        """As next_token_probs(model, tok, pos, cache, tokens, sampling), for one token (B, 1) at
        pos (1,)."""
        if not self.works:
            return next_token_probs(model, tok, pos, cache, tokens, sampling)
        if self.buffers is not None and self.buffers[0] is cache and self.buffers[1] is tokens:
            if self.compiled is not None:
                return self.compiled(model, tok, pos, cache, tokens, sampling)
            return self.graph(tok, pos)
        try:
            return self._first_call(model, tok, pos, cache, tokens, sampling)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - inductor/Triton/C-compiler/capture failures vary
            self.works = False
            failed, without = (("torch.compile failed", "compilation") if self.compiled is not None
                               else ("CUDA graph capture failed", "CUDA graphs"))
            # stacklevel: past generate.py's loop and inference_mode's generator wrapper, to
            # whoever asked for a token
            warnings.warn(f"{failed} ({failure_reason(e)}): decoding without {without}",
                          RuntimeWarning, stacklevel=4)
        # (rewrites the slot a failed call may have written)
        return next_token_probs(model, tok, pos, cache, tokens, sampling)

    def _first_call(self, model, tok, pos, cache, tokens, sampling) -> torch.Tensor:
        """Compile or capture over a new generation's buffers, and run this token."""
        assert cache.static, "a fast step needs fixed shapes and addresses: KVCache(static=True)"
        # the last generation's graph goes before the next is captured
        self.buffers, self.graph = None, None
        if self.compiled is not None:
            # fixed addresses let inductor's CUDA graphs read and write the buffers in place;
            # guard=False: a new generation re-records, it does not recompile
            import torch._dynamo  # (loaded by torch.compile already)
            for t in (*cache.k, *cache.v, tokens):
                torch._dynamo.mark_static_address(t, guard=False)
            out = self.compiled(model, tok, pos, cache, tokens, sampling)
        else:
            step = partial(next_token_probs, model, cache=cache, tokens=tokens, sampling=sampling)
            self.graph = GraphedStep(step, tok, pos, capture=self.capture)
            out = self.graph(tok, pos)
        self.buffers = (cache, tokens)  # only once it worked
        return out
