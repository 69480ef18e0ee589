"""A step function replayed as a CUDA graph: one-token decoding launches hundreds of tiny kernels, and
launching them costs more than running them. Captured over the eager function, no compiler (docs/design.md).
"""
from __future__ import annotations

import torch


class GraphedStep:
    """fn(*inputs) -> tensor, run on its own copies of the inputs, at fixed addresses. capture=True (CUDA):
    captured once; each call copies the inputs in, replays, and returns the graph's output, which the next call
    overwrites. capture=False runs fn uncaptured on the same buffers (testable on a CPU). fn must not sync with the
    host, allocate outside the graph, or depend on anything but the inputs and tensors at fixed addresses."""

    def __init__(self, fn, *example_inputs: torch.Tensor, capture: bool = True, warmup: int = 2):
        self.fn = fn
        self.inputs = tuple(x.clone() for x in example_inputs)
        self.graph, self.out = None, None
        if capture:
            self._capture(warmup)

    def _capture(self, warmup: int) -> None:
        with torch.cuda.device(self.inputs[0].device):  # the inputs' GPU (cuda:1), not just the current one
            side = torch.cuda.Stream()  # warm up (lazy init, cuBLAS workspaces) and capture off the default
            side.wait_stream(torch.cuda.current_stream())  # stream, as the CUDA-graph docs ask
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
