"""The CUDA-graph path of the multi-device executor, run on CPU virtual devices with a pointer-faithful stand-in graph.

The stand-in (``tests/runtime/graph_stand_in.py``) records each launch with the tensors its arguments had at capture
and replays exactly those, running nothing while capturing, as a CUDA graph does; so bugs of the graph path itself (state updated twice on the capturing call,
stale or moved storages) show up here in CI.

Found this way (2026-11-29): the capturing call ran its warm-up pass and then replayed the graphs, so in-place state
updates ran twice; with transformers' static cache, whose per-layer length counters are such state, every later
decode step wrote its K/V one prompt further along, past the end of the cache (the device-side assert seen on the
H200; on CPU, heap corruption).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.backend.test_models_equal_eager import StatefulCounter
from tests.conftest import TEST_DEVICE, RecordingBackend
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from torch_tessera.models import llama_config

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the stand-in graph replaces CUDA graphs on CPU only")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: StatefulCounter.forward is compiled by other files too, and Dynamo's
    recompile limit (8 per code object) would otherwise run it eagerly, with no executor recorded."""
    torch._dynamo.reset()


GRAPH_MODES = ["whole", "segments"]  # one graph over every device with the copies inside it / one per segment


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("options", [{"devices": "cpu:0", "policy": "home"},
                                     {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 3}],
                         ids=["one-device", "random-placement-two-devices"])
def test_state_is_updated_once_per_call_with_graphs(stand_in_graphs, options, mode):
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=mode, **options)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(4):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"call {call}: {m}")
            torch.testing.assert_close(model.state, ref.state, msg=lambda m: f"state after call {call}: {m}")
    ex = backend.executors[0].executor
    assert (ex.calls, ex.captures) == (4, 1)
    assert (ex.graphs.entry().whole is not None) == (mode == "whole")
    assert ex.launches_executed == 4 * len(ex.program.launches)  # capturing records launches, it runs none


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_hf_generate_with_graphs_equals_eager(stand_in_graphs, mode):
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
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="random", seed=3, cuda_graphs=mode)
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    with torch.no_grad():
        want = eager.generate(ids, **kwargs)
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want), f"first difference at token {int((got != want).nonzero()[0, 1])}"
    prefill, decode = (r.executor for r in backend.executors)
    assert (prefill.calls, decode.calls) == (1, new - 1) and (prefill.captures, decode.captures) == (1, 1)
    for ex in (prefill, decode):
        assert ex.launches_executed == ex.calls * len(ex.program.launches)
    cut = [ex.schedule.steps for ex in (prefill, decode)]
    assert all(any(type(st).__name__ == "CopyStep" for st in steps) for steps in cut), "the placement cut nothing"
    for ex in (prefill, decode):  # every copy of the schedule ran once per call, none of them twice
        per_call = sum(1 for st in ex.schedule.steps if type(st).__name__ == "CopyStep")
        setup = ("weights", "static")  # once per executor (static inputs: module buffers, e.g. rotary inv_freq)
        assert sum(n for purpose, n in ex.transfers.items() if purpose not in setup) == per_call * ex.calls
        assert ex.transfers["static"] == sum(1 for st in ex.schedule.setup if st.purpose == "static")


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_state_kept_on_its_owner_with_graphs(stand_in_graphs, mode):
    """Every launch on device 1 and the state declared to live there (``set_state_homes``): captured once, the
    state is updated in place once per call where it lives, and no copy of it is in the graph."""
    from torch_tessera.lowering.program import BufferKind
    from torch_tessera.runtime.schedule import CopyStep

    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=mode, devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), ref(x))
        runner = backend.executors[0]
        runner.set_placement({launch.index: 1 for launch in runner.program.launches})
        ex = runner.executor
        owners = ex.state_owners()
        assert owners and set(owners.values()) == {1}
        ex.set_state_homes(owners)
        buffers = ex.program.buffers
        assert not [s for s in ex.schedule.steps
                    if isinstance(s, CopyStep) and buffers[s.buffer].kind == BufferKind.STATE]
        for call in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"call {call}: {m}")
            torch.testing.assert_close(model.state, ref.state, msg=lambda m: f"state after call {call}: {m}")
    assert (ex.calls, ex.captures) == (3, 1)


@pytest.mark.parametrize("options", [{"devices": "cpu:0", "policy": "home"},
                                     {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 3}],
                         ids=["one-device", "random-placement-two-devices"])
def test_generates_in_a_row_capture_once(stand_in_graphs, options):
    """transformers makes a new static cache at every ``generate``: new cache-length counters (small STATE, copied
    into the graph's storage) and K/V tensors that the prefill program creates (outputs, handed back in the storage
    the last ``generate`` dropped). Three ``generate`` calls: tokens equal eager's, and each program captured once."""
    from transformers import LlamaForCausalLM

    config = llama_config("tiny")
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    eager = copy.deepcopy(model)
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, cache_implementation="static",
                  disable_compile=True)
    torch._dynamo.reset()
    backend = RecordingBackend(cuda_graphs="whole", **options)
    model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
    with torch.no_grad():
        for g in range(3):
            ids = torch.randint(0, config.vocab_size, (1, 8))
            want = eager.generate(ids, **kwargs)
            got = model.generate(ids, **kwargs)
            assert torch.equal(got, want), f"generate {g}: first difference at {int((got != want).nonzero()[0, 1])}"
    prefill, decode = (r.executor for r in backend.executors)
    assert (prefill.calls, decode.calls) == (3, 12)
    assert (prefill.captures, decode.captures) == (1, 1), "a generate captured its programs again"


def test_outputs_the_caller_keeps_are_not_overwritten(stand_in_graphs):
    """An output still held when the graph replays keeps its values (a fresh tensor is handed out); one dropped is
    handed back at the same address."""
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs="whole", devices="cpu:0", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        xs = [torch.randn(4, 16) for _ in range(4)]
        want = [ref(x) for x in xs]
        kept = [compiled(xs[0]), compiled(xs[1])]  # the first replay's output is still held here
        kept.append(compiled(xs[2]))
        for k in range(3):
            torch.testing.assert_close(kept[k], want[k], msg=lambda m: f"output of call {k}: {m}")
        assert len({t.data_ptr() for t in kept}) == 3
        address = kept[2].data_ptr()
        del kept[2]
        again = compiled(xs[3])
        torch.testing.assert_close(again, want[3])
        assert again.data_ptr() == address, "a dropped output's storage was not handed out again"


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_whole_graph_keeps_no_reference_to_the_callers_state(stand_in_graphs, mode):
    """Between calls a whole graph's pools hold no reference to state bound at the caller's address (so a cache the
    caller drops is freed, and its successor can get the same memory); segment replays keep theirs. Results equal
    eager. (The stand-in's recorded launches hold the tensors themselves, so the count is of the pools' hold.)"""
    torch.manual_seed(0)
    model, ref = StatefulCounter(2048), StatefulCounter(2048)  # 8 KiB of state: bound, not copied into the graph
    backend = RecordingBackend(cuda_graphs=mode, devices="cpu:0", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(3):
            x = torch.randn(4, 2048)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"call {call}: {m}")
            torch.testing.assert_close(model.state, ref.state, msg=lambda m: f"state after call {call}: {m}")
            pool = backend.executors[0].executor.graphs.entry().pools[0]
            assert ("state" in pool) == (mode == "segments") and ("state" in pool.released) == (mode == "whole")
    assert backend.executors[0].executor.captures == 1
