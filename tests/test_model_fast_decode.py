"""model/fast_decode.py: the decode step picked per device, the CUDA graph (its step, run uncaptured or on a stand-in
GPU, and for real on a GPU), torch.compile, and the one warning with which either falls back to eager decoding."""
import contextlib
import shutil
import warnings

import pytest
import torch

from model.fast_decode import FastDecode, GraphedStep, pick_decode
from model.generate import generate, generate_tokens, next_token_probs
from model.gpt import GPT
from model.sampling import Sampling
from tests.test_model_generate import decoder_config, spiky_model  # noqa: F401 (fixture)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# greedy, and every rule at once (the rules one by one on every path: tests/test_model_sampling.py)
SAMPLINGS = [Sampling(temperature=0),
             Sampling(temperature=1.5, top_k=20, top_p=0.95, min_p=0.01, repetition_penalty=1.3)]
IDS = ["greedy", "sampled"]


def _run(model, idx, n, decode, sampling, seed=None):
    """generate() with `decode`, and a generator seeded with `seed` (None: none)."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return generate(model, idx, n, sampling, generator=g, decode=decode)


# ---- which step ------------------------------------------------------------------------------

def test_the_cpu_decodes_eagerly_and_compile_there_warns(tiny_gpt_config):
    """cuda_graphs=True is the default and a no-op without CUDA (no warning); compile=True warns and is eager."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pick_decode(CPU) is next_token_probs and pick_decode(CPU, cuda_graphs=False) is next_token_probs
    with pytest.warns(RuntimeWarning, match="needs a CUDA device; running the eager cached decode on cpu"):
        assert pick_decode(CPU, compile=True) is next_token_probs


def test_cuda_picks_graphs_by_default_compile_if_asked_and_eager_without_the_cache(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: ("compiled", fn, kw))  # nothing is compiled here
    graphed, compiled = pick_decode(CUDA), pick_decode(CUDA, compile=True)
    assert isinstance(graphed, FastDecode) and graphed.kind == "CUDA graphs" and graphed.compiled is None
    assert compiled.kind == "compiled" and compiled.compiled == ("compiled", next_token_probs,
                                                                 dict(mode="reduce-overhead"))
    assert pick_decode(CUDA, cuda_graphs=False) is next_token_probs
    assert pick_decode(CUDA, use_kv_cache=False) is next_token_probs  # a graph needs the cache's fixed shapes


def test_a_fast_step_needs_the_kv_cache(tiny_gpt_config):
    with pytest.raises(ValueError, match="needs the KV cache"):
        generate_tokens(GPT(tiny_gpt_config), torch.zeros(1, 1, dtype=torch.long), 2, use_kv_cache=False,
                        decode=FastDecode())


# ---- CUDA graphs: the captured step, checked where it can be without a GPU -------------------------

@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_graphed_step_on_fixed_buffers_gives_eager_tokens(decoder_config, sampling):
    """The function a CUDA graph captures, run uncaptured on the graph's own input buffers (as a
    replay is): eager decoding's tokens, the window sliding twice; a second generation, on new
    buffers, gets its own eager tokens (a step still bound to the first one's would not)."""
    model = spiky_model(decoder_config)
    n = 3 * decoder_config.block_size
    step = FastDecode(capture=False)
    for idx in (torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([[7, 8], [9, 7]])):
        eager = _run(model, idx, n, next_token_probs, sampling, seed=7)
        assert torch.equal(_run(model, idx, n, step, sampling, seed=7), eager)
    assert step.works


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_capture_and_replay_protocol_on_a_stand_in_gpu(decoder_config, monkeypatch, sampling):
    """GraphedStep's CUDA calls, with CPU stand-ins: warm-up on a side stream, one capture, then per token
    copy in + replay, which rewrites the one output tensor (as a real graph does). Tokens still equal eager
    decoding's: each output is drawn from before the next replay, and re-prefills keep the graph valid."""
    steps, events, init = [], [], GraphedStep.__init__

    def register(self, *args, **kwargs):
        steps.append(self)
        init(self, *args, **kwargs)

    class Graph:
        def replay(self):
            events.append("replay")
            steps[-1].out.copy_(steps[-1].fn(*steps[-1].inputs))  # into the captured output, in place

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(g, stream=None):
        assert isinstance(g, Graph) and isinstance(stream, Stream)
        events.append("capture")
        yield
    monkeypatch.setattr(GraphedStep, "__init__", register)
    for name, value in dict(CUDAGraph=Graph, graph=graph, Stream=Stream, current_stream=Stream,
                            stream=lambda s: contextlib.nullcontext(),
                            device=lambda d: contextlib.nullcontext()).items():
        monkeypatch.setattr(torch.cuda, name, value)
    model = spiky_model(decoder_config)
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    n = 3 * decoder_config.block_size
    graphed = _run(model, idx, n, FastDecode(), sampling, seed=2)
    assert torch.equal(graphed, _run(model, idx, n, next_token_probs, sampling, seed=2))
    assert len(steps) == 1 and steps[0].graph is not None
    assert events[0] == "capture" and events.count("capture") == 1 and len(events) > n // 2


SYNC_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "is_nonzero", "equal", "_unique2",
            "unique_consecutive", "unique_dim", "_assert_async"}  # ops whose result the host must wait for


def _host_reads(fn) -> list[str]:
    """Names of the aten ops run by fn that need a tensor's data on the host (a sync on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket.__name__ in SYNC_OPS:
                reads.append(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
    reads: list[str] = []
    with Spy():
        fn()
    return reads


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_graphed_decoding_never_waits_on_the_device(decoder_config, sampling):
    """No host read anywhere in a generation over the static cache (prefills, window slides, decode steps, draws):
    a CUDA graph replays back to back, and the only sync is the caller's, to print a token."""
    model = spiky_model(decoder_config)
    idx = torch.tensor([[1, 2, 3]])
    n = 2 * decoder_config.block_size
    assert _host_reads(lambda: _run(model, idx, n, FastDecode(capture=False), sampling, seed=1)) == []
    # sensitivity: the CPU's dynamic cache reads its fill level on the host (free there), and is caught
    assert {"item", "_local_scalar_dense"} & set(_host_reads(lambda: _run(model, idx, n, next_token_probs, sampling)))


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_failed_capture_warns_once_with_the_reason_and_decodes_eagerly(tiny_gpt_config, monkeypatch, sampling):
    """The capture fails after its warm-up wrote the cache slot: one warning, that token and the rest are eager
    decoding's (the generator drawing as eagerly: the step never sees it), and later generations skip the capture."""
    def fail(self, warmup):
        self.fn(*self.inputs)  # as a warm-up would: writes the cache slot
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors ...")
    monkeypatch.setattr(GraphedStep, "_capture", fail)
    step = FastDecode()
    model = spiky_model(tiny_gpt_config)
    idx = torch.tensor([[1, 2, 3]])
    n = 2 * tiny_gpt_config.block_size
    eager = _run(model, idx, n, next_token_probs, sampling, seed=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(torch.cat([idx, *generate_tokens(model, idx, n, sampling, decode=step,
                                                            generator=torch.Generator().manual_seed(4))], 1), eager)
        assert torch.equal(_run(model, idx, n, step, sampling, seed=4), eager)  # a later generation: no capture
    assert [str(w.message) for w in caught] == [
        "CUDA graph capture failed (RuntimeError: CUDA error: operation not permitted when stream is capturing): "
        "decoding without CUDA graphs"]
    assert caught[0].category is RuntimeWarning and caught[0].filename == __file__  # points at the caller
    assert not step.works and step.graph is None


@pytest.mark.parametrize("kw", [dict(), dict(top_k=5, top_p=0.9)], ids=["plain", "filtered"])
def test_every_decode_path_gives_the_greedy_tokens_at_a_tiny_temperature(decoder_config, kw):
    """Cached, uncached and the CUDA graph's step (run uncaptured) follow the one rule: a temperature too small to
    divide by decodes greedily, past the context too (was: NaN probabilities, a token per NaN)."""
    model = spiky_model(decoder_config)
    idx, n = torch.tensor([[1, 2, 3], [4, 5, 6]]), 2 * decoder_config.block_size
    want = generate(model, idx, n, Sampling(temperature=0))
    for t in (1e-45, 5e-324):
        tiny = Sampling(temperature=t, **kw)
        assert torch.equal(generate(model, idx, n, tiny), want), t
        assert torch.equal(generate(model, idx, n, tiny, use_kv_cache=False), want), t
        assert torch.equal(_run(model, idx, n, FastDecode(capture=False), tiny, seed=1), want), t


# ---- torch.compile -----------------------------------------------------------------------------------

def _failing_compiled(calls, exc):
    """Stands in for a compiled step that fails after writing its cache slot (as a half-run graph could): the
    eager retry must rewrite it."""
    def step(model, tok, pos, cache, *rest):
        calls.append(pos.item())
        for t in (*cache.k, *cache.v):
            t.index_fill_(2, pos, 123.0)
        raise exc
    return step


def _compiled_step(stand_in):
    step = FastDecode(capture=False)
    step.compiled, step.kind = stand_in, "compiled"
    return step


@pytest.mark.parametrize("temperature, seed", [(0, None), (0.8, 5)])
def test_failed_compile_warns_once_and_decodes_eagerly(tiny_gpt_config, temperature, seed):
    """The compiled step's first call fails -> one warning, that token and the rest decode eagerly (same tokens,
    same generator draws), and later generations skip the compiler."""
    calls = []
    step = _compiled_step(_failing_compiled(calls, RuntimeError("no Triton\ndetails")))
    model = spiky_model(tiny_gpt_config)
    idx = torch.tensor([[1, 2, 3]])
    n = 2 * tiny_gpt_config.block_size  # the window slides: decoding resumes after re-prefills
    sampling = Sampling(temperature=temperature, top_k=10, top_p=0.9)
    eager = _run(model, idx, n, next_token_probs, sampling, seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(torch.cat([idx, *generate_tokens(model, idx, n, sampling, decode=step, generator=None if
                                      seed is None else torch.Generator().manual_seed(seed))], 1), eager)
        assert torch.equal(_run(model, idx, n, step, sampling, seed), eager)  # a later generation: no compile
    assert calls == [3]  # one try: the first decode step (position 3) of the first generation
    assert [str(w.message) for w in caught] == [
        "torch.compile failed (RuntimeError: no Triton): decoding without compilation"]
    assert caught[0].category is RuntimeWarning and caught[0].filename == __file__  # points at the caller


def test_out_of_memory_in_the_compiled_step_is_not_a_compile_failure(tiny_gpt_config):
    step = _compiled_step(_failing_compiled([], torch.OutOfMemoryError("OOM")))
    model = spiky_model(tiny_gpt_config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "torch.compile failed" warning either
        with pytest.raises(torch.OutOfMemoryError):
            list(generate_tokens(model, torch.tensor([[1]]), 5, Sampling(temperature=0), decode=step))
    assert step.works


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="torch.compile's CPU backend needs a C compiler")
def test_compiled_static_cache_decode_traces_once_and_matches_eager(tiny_gpt_config):
    """The step compile=True compiles on CUDA, compiled here on CPU: one graph with no graph break (the draw is
    outside, eager, even with a user's generator), no recompilation as positions advance or the window slides, and
    the eager decode's tokens."""
    import torch._dynamo

    model = spiky_model(tiny_gpt_config)
    idx = torch.tensor([[1, 2, 3]])
    n = 2 * tiny_gpt_config.block_size  # long enough for the window to slide (re-prefill) twice
    step = FastDecode(compile=True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        sampled = Sampling(0.8, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.3)
        for sampling, seed in ((Sampling(temperature=0), None), (sampled, 5)):
            eager = _run(model, idx, n, next_token_probs, sampling, seed)
            assert torch.equal(_run(model, idx, n, step, sampling, seed), eager)
            assert step.works  # compiled for real, no silent fallback
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # greedy's and the sampled one's
        assert not torch._dynamo.utils.counters["graph_break"]
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
def test_compile_fallback_with_a_real_inductor_failure(tiny_gpt_config):
    """As on a GPU image without a C compiler: inductor really fails -> one warning and eager tokens."""
    import torch._dynamo
    import torch._inductor.config

    step = FastDecode(compile=True)
    model = spiky_model(tiny_gpt_config)
    idx = torch.tensor([[1, 2, 3]])
    sampling = Sampling(temperature=0.8, top_k=10)
    eager = _run(model, idx, 20, next_token_probs, sampling, seed=3)
    torch._dynamo.reset()
    # config.patch restores the options on exit; monkeypatch's undo deletes options that torch defines
    # lazily, which made every later compile in the session fail (an order-dependent suite)
    try:
        with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
            # torch 2.13 wraps the reason in InductorError, 2.7 raises it bare: the warning names it either way
            reason = r"^torch.compile failed \((InductorError: )?InvalidCxxCompiler: No working C\+\+ compiler"
            with pytest.warns(RuntimeWarning, match=reason):
                assert torch.equal(_run(model, idx, 20, step, sampling, seed=3), eager)
    finally:
        torch._dynamo.reset()
    assert not step.works


# ---- failure reasons (the one warning that says why compiling or capturing failed) ----------------

class BackendCompilerFailed(RuntimeError):
    """torch 2.6's torch._dynamo.exc.BackendCompilerFailed, as it builds its message."""

    def __init__(self, backend_fn, inner_exception):
        self.inner_exception = inner_exception
        super().__init__(f"backend={backend_fn.__name__!r} raised:\n{type(inner_exception).__name__}: {inner_exception}")


class InductorError(RuntimeError):
    pass


def inductor():
    pass


def test_failure_reason_finds_the_line_that_says_something():
    from common.cli import failure_reason

    wrapped = BackendCompilerFailed(inductor, InductorError("RuntimeError: Failed to find C++ compiler.\nmore"))
    assert failure_reason(wrapped) == "InductorError: RuntimeError: Failed to find C++ compiler."  # not "raised:"
    assert failure_reason(RuntimeError("no Triton\ndetails")) == "RuntimeError: no Triton"
    empty = RuntimeError()
    empty.__cause__ = InductorError("\n  InvalidCxxCompiler: No working C++ compiler found\n")
    assert failure_reason(empty) == "InductorError: InvalidCxxCompiler: No working C++ compiler found"
    assert failure_reason(RuntimeError("  \n")) == "RuntimeError"


def test_compile_fallback_warning_carries_the_reason_of_a_wrapped_failure(tiny_gpt_config):
    """As torch 2.6 reports inductor failures: the first line is only "backend='inductor' raised:"."""
    exc = BackendCompilerFailed(inductor, InductorError("InvalidCxxCompiler: No working C++ compiler found"))
    step = _compiled_step(_failing_compiled([], exc))
    model = spiky_model(tiny_gpt_config)
    with pytest.warns(RuntimeWarning, match=r"^torch.compile failed \(InductorError: .*C\+\+ compiler") as caught:
        list(generate_tokens(model, torch.tensor([[1]]), 5, Sampling(temperature=0), decode=step))
    assert len(caught) == 1


# ---- on a GPU ------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_graph_decoding_gives_eager_tokens_faster_in_bf16():
    """The real thing: the baby shape in bf16 on a GPU, 400 tokens (the window slides at 256)."""
    import time

    from model.config import GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)).cuda().bfloat16().eval()
    idx = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    graphed_step = pick_decode(idx.device)
    assert isinstance(graphed_step, FastDecode)

    def run(decode, **kw):  # -> (tokens, tokens/s after the first 10: past the capture)
        g = torch.Generator(device="cuda").manual_seed(3)
        out, times = [], []
        for t in generate_tokens(model, idx, 400, Sampling(**kw), generator=g, decode=decode):
            out.append(t.item())  # a sync per token, as sample.py's printing
            times.append(time.perf_counter())
        return out, 390 / (times[-1] - times[9])

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="CUDA graph capture failed")  # no silent fallback
        for kw in (dict(temperature=0), dict(temperature=0.8, top_k=50, top_p=0.95, min_p=0.02),
                   dict(temperature=1.0), dict(temperature=0.8, repetition_penalty=1.3)):
            run(graphed_step, **kw), run(next_token_probs, **kw)  # warm-up: CUDA context, cuBLAS, allocator
            (graphed, graphed_rate), (eager, eager_rate) = run(graphed_step, **kw), run(next_token_probs, **kw)
            assert graphed == eager, kw
            assert graphed_rate > eager_rate, (graphed_rate, eager_rate)
    assert graphed_step.works


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_graph_decoding_of_the_modern_preset_gives_eager_tokens():
    """conf/model/modern.yaml (rope, GQA, qk_norm, swiglu, untied) in bf16 on a GPU: graphed == eager tokens over
    3 x block_size (the window slides twice), greedy and sampled."""
    from launch.config import preset
    from model.config import GPTConfig

    config = GPTConfig(**preset("model", "modern")).with_vocab(65)  # (a preset lists what it changes)
    assert (config.position, config.qk_norm, config.kv_heads < config.n_head) == ("rope", True, True)
    model = spiky_model(config).cuda().bfloat16().eval()
    idx = torch.tensor([[1, 2, 3]], device="cuda")
    n = 3 * config.block_size
    graphed_step = pick_decode(idx.device)

    def run(decode, **kw):
        g = torch.Generator(device="cuda").manual_seed(3)
        return torch.cat([idx, *generate_tokens(model, idx, n, Sampling(**kw), generator=g, decode=decode)], dim=1)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="CUDA graph capture failed")  # no silent fallback
        for kw in (dict(temperature=0), dict(temperature=0.8, top_k=20, top_p=0.95, min_p=0.02,
                                             repetition_penalty=1.3)):
            assert torch.equal(run(graphed_step, **kw), run(next_token_probs, **kw)), kw
    assert graphed_step.works
