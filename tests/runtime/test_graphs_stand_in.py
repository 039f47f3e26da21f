"""The CUDA-graph path of the multi-device executor, run on CPU virtual devices with a pointer-faithful stand-in graph.

A real CUDA graph records each kernel with the addresses its arguments had at capture and replays exactly those,
without running anything while capturing. The stand-in below does the same on CPU: while "capturing", a Triton launch
resolves its tensor arguments at once and records a closure over those very tensors (nothing runs); an extern op runs
once to obtain its capture-time output tensors and its replay writes into them. Replays therefore read and write the
memory the capture saw, as on a GPU, so bugs of the graph path itself (state updated twice on the capturing call,
stale or moved storages) show up here in CI.

Found this way (2026-11-29): the capturing call ran its warm-up pass and then replayed the graphs, so in-place state
updates ran twice; with transformers' static cache, whose per-layer length counters are such state, every later
decode step wrote its K/V one prompt further along, past the end of the cache (the device-side assert seen on the
H200; on CPU, heap corruption).
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from tests.backend.test_models_equal_eager import StatefulCounter
from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.lowering.program import ScalarArg, TensorArg, TritonLaunch
from torch_tessera.models import llama_config
from torch_tessera.runtime import executor as executor_mod
from torch_tessera.runtime import placed as placed_mod
from torch_tessera.runtime.devices import CpuStream

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the stand-in graph replaces CUDA graphs on CPU only")


class _Graph:
    """Stand-in for ``torch.cuda.CUDAGraph``: replay runs the closures recorded while capturing."""

    capturing: "_Graph | None" = None

    def __init__(self) -> None:
        self.calls: list = []

    def replay(self) -> None:
        for call in self.calls:
            call()


class _capture:
    def __init__(self, graph: _Graph, pool=None, stream=None) -> None:
        self.graph = graph

    def __enter__(self) -> None:
        _Graph.capturing = self.graph

    def __exit__(self, *exc) -> None:
        _Graph.capturing = None


@pytest.fixture
def stand_in_graphs(monkeypatch):
    """CUDA graphs replaced by the pointer-faithful stand-in; executors accept ``cuda_graphs=True`` on CPU devices."""
    orig_launch = executor_mod.KernelLauncher.launch

    def launch(self, launch, pool, stream=None):
        if pool.device.type == "cpu":
            stream = None
        if _Graph.capturing is None:
            return orig_launch(self, launch, pool, stream)

        def arg(v):
            if isinstance(v, TensorArg):
                return pool.view(v)
            return v.value if isinstance(v, ScalarArg) else v

        if isinstance(launch, TritonLaunch):
            args, kernel = [arg(a) for a in launch.args], self.kernel(launch.kernel)

            def replay_triton(args=args, kernel=kernel, device=pool.device):
                with executor_mod._interpreter_context(device):
                    kernel.run(*args, stream=0)

            _Graph.capturing.calls.append(replay_triton)
            return None
        args, kwargs = tree_map(arg, launch.args), tree_map(arg, dict(launch.kwargs))
        result = launch.overload(*args, **kwargs)  # the capture-time allocation of fresh outputs
        leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]

        def replay_extern(args=args, kwargs=kwargs, leaves=leaves, op=launch.overload):
            new = [t for t in tree_flatten(op(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
            for old, fresh in zip(leaves, new):
                if old.data_ptr() != fresh.data_ptr():
                    old.copy_(fresh)  # a graph writes fresh outputs where the capture allocated them

        _Graph.capturing.calls.append(replay_extern)
        return result

    orig_init = placed_mod.PlacedExecutor.__init__

    def init(self, *a, cuda_graphs=False, **k):
        orig_init(self, *a, **k)
        self.cuda_graphs = cuda_graphs

    monkeypatch.setattr(executor_mod.KernelLauncher, "launch", launch)
    monkeypatch.setattr(placed_mod.PlacedExecutor, "__init__", init)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: CpuStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s=None: contextlib.nullcontext())


@pytest.mark.parametrize("options", [{"devices": "cpu:0", "policy": "home"},
                                     {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 3}],
                         ids=["one-device", "random-placement-two-devices"])
def test_state_is_updated_once_per_call_with_graphs(stand_in_graphs, options):
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=True, **options)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(4):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"call {call}: {m}")
            torch.testing.assert_close(model.state, ref.state, msg=lambda m: f"state after call {call}: {m}")
    ex = backend.executors[0].executor
    assert (ex.calls, ex.captures) == (4, 1)
    assert ex.launches_executed == 4 * len(ex.program.launches)  # capturing records launches, it runs none


def test_hf_generate_with_graphs_equals_eager(stand_in_graphs):
    """Greedy decoding with a static KV cache through captured graphs on two devices, token for token."""
    from transformers import LlamaForCausalLM

    config = llama_config("tiny")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    eager = copy.deepcopy(model)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    new = 12
    kwargs = dict(max_new_tokens=new, do_sample=False, cache_implementation="static", disable_compile=True)
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="random", seed=3, cuda_graphs=True)
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    with torch.no_grad():
        want = eager.generate(ids, **kwargs)
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want), f"first difference at token {int((got != want).nonzero()[0, 1])}"
    prefill, decode = (r.executor for r in backend.executors)
    assert (prefill.calls, decode.calls) == (1, new - 1) and (prefill.captures, decode.captures) == (1, 1)
    for ex in (prefill, decode):
        assert ex.launches_executed == ex.calls * len(ex.program.launches)
