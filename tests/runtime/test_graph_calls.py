"""Per-call work of one CUDA graph over the devices, on CPU virtual devices with the pointer-faithful stand-in.

What a call does besides the replay decides how close a graph of one device comes to ``mode="reduce-overhead"``
(issue 5: 2.08 vs 1.93 ms on an H200): module buffers are read in place instead of copied in, the replay goes to
the caller's stream, a graph of the home device alone returns without waiting on the host, and a graph holding
transfers still waits and names them when it does not complete (``TransferTimeout``).
"""

from __future__ import annotations

import pytest
import torch

from tests.backend.test_models_equal_eager import StatefulCounter
from tests.conftest import TEST_DEVICE, RecordingBackend
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from torch_tessera.errors import TransferTimeout
from torch_tessera.target import devices as devices_mod
from torch_tessera.runtime import realize as realize_mod

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the stand-in graph replaces CUDA graphs on CPU only")


class WithTable(torch.nn.Module):
    """A module buffer (like Llama's rotary ``inv_freq``) read every call: a static input of Dynamo's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("table", torch.arange(16.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table + 1


@pytest.mark.parametrize("options", [{"devices": "cpu:0", "policy": "home"},
                                     {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 0}],
                         ids=["one-device", "two-devices"])
def test_module_buffers_are_read_in_place_not_copied_in(stand_in_graphs, options):
    torch.manual_seed(0)
    model = WithTable()
    backend = RecordingBackend(cuda_graphs=True, **options)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(4):
            if call == 2:
                model.table.mul_(-2)  # in place: a static input keeps its address, its contents may change
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model.lin(x) * model.table + 1, msg=lambda m: f"call {call}: {m}")
    ex = backend.executors[0].executor
    assert ex.program.static_inputs == ("table",)
    state = ex.graphs.entry()
    copied = {ex.program.inputs[k].buffer for k, _ in state.copy_list}
    assert copied == {"x"}, f"copied into static storage every call: {sorted(copied)}"
    assert (ex.calls, ex.captures) == (4, 1)
    if len(ex.devices) > 1:  # the table is read on the other device: placed there once (and again after the
        # in-place change), not copied inside the graph every call
        assert any(s.buffer == "table" and s.purpose == "static" for s in ex.schedule.setup)
        assert not any(getattr(s, "buffer", None) == "table" for s in state.copies)
        assert ex.transfers["static"] == 2 * len([s for s in ex.schedule.setup if s.buffer == "table"])


def test_graph_of_the_home_device_alone_does_not_wait_on_the_host(stand_in_graphs, monkeypatch):
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=True, devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), ref(x))
        state = backend.executors[0].executor.graphs.entry()
        assert state.on_caller_stream and not state.host_wait and not state.copies
        # a replay that never completes: a graph without transfers has nothing to time out on, and returns
        monkeypatch.setattr(devices_mod.CpuEvent, "query", lambda self: False)
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), ref(x))


def test_graph_with_transfers_that_never_completes_names_them(stand_in_graphs, monkeypatch):
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=True, devices="cpu:0,cpu:1", policy="random", seed=4, timeout_s=0.05)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), ref(x))
        torch.testing.assert_close(compiled(x), ref(x))  # a replay that completes
        ex = backend.executors[0].executor
        assert ex.graphs.entry().host_wait and ex.graphs.entry().copies
        monkeypatch.setattr(devices_mod.CpuEvent, "query", lambda self: False)
        monkeypatch.setattr(realize_mod, "SPIN_S", 0.0)
        with pytest.raises(TransferTimeout, match=r"did not complete within 0.05 s; it holds \d+ transfers \(edges"):
            compiled(x)


@pytest.mark.parametrize("graph_copies", ["link", "producer", "push"])
def test_graph_copies_option_reaches_the_executor(stand_in_graphs, graph_copies):
    torch.manual_seed(0)
    model, ref = StatefulCounter(), StatefulCounter()
    backend = RecordingBackend(cuda_graphs=True, graph_copies=graph_copies, devices="cpu:0,cpu:1", policy="random",
                               seed=4)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for call in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), ref(x), msg=lambda m: f"call {call}: {m}")
    ex = backend.executors[0].executor
    assert ex.graph_copies == graph_copies and ex.graphs.entry().whole is not None and ex.graphs.entry().copies
    assert not ex.graphs.entry().pushes  # CPU devices: "push" falls back to the ordinary copies
    per_call = len(ex.graphs.entry().copies)
    assert sum(n for purpose, n in ex.transfers.items() if purpose != "weights") == 3 * per_call
