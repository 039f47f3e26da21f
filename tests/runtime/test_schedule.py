"""The schedule a placement turns into: copies between memory domains, event waits inside one."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import RecordingBackend
from torch_tessera.models import MLP
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep, build_schedule, cut_edge_count


def _program_and_dag():
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    model = MLP(16, 32).eval()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(torch.randn(4, 16))
    runner = backend.executors[0]
    return runner.program, runner.dag


def test_separate_memory_copies_exactly_the_cut_edges():
    program, dag = _program_and_dag()
    n = len(program.launches)
    placement = {i: i % 2 for i in range(n)}  # alternate devices: every dependency crosses
    sched = build_schedule(program, dag, placement)
    cut_copies = {s.edge for s in sched.steps if isinstance(s, CopyStep) and s.purpose == "cut"}
    assert len(cut_copies) == cut_edge_count(dag, placement) > 0
    assert not any(isinstance(s, SyncStep) for s in sched.steps)
    assert [s.launch for s in sched.steps if isinstance(s, LaunchStep)] == list(range(n))


def test_shared_memory_waits_instead_of_copying():
    program, dag = _program_and_dag()
    n = len(program.launches)
    placement = {i: i % 2 for i in range(n)}
    sched = build_schedule(program, dag, placement, domains=[0, 0])
    assert not [s for s in sched.steps if isinstance(s, CopyStep)]  # no copies at all: same storages
    syncs = {s.edge for s in sched.steps if isinstance(s, SyncStep)}
    crossing = {(u, v) for u, v in dag.graph.edges if placement[u] != placement[v]}
    assert syncs == crossing  # RAW, WAR and WAW edges alike
    for i, step in enumerate(sched.steps):  # each wait comes before its consumer's launch
        if isinstance(step, SyncStep):
            later = [s.launch for s in sched.steps[i:] if isinstance(s, LaunchStep)]
            assert later[0] == step.edge[1]


@pytest.mark.parametrize("options", [{}, {"devices": "cpu:0,cpu:1", "policy": "random", "seed": 1}])
def test_inputs_at_other_storage_offsets(options):
    """Dynamo reuses a graph for a view at another storage offset (``input_ids[:, -1:]`` of a growing sequence,
    a slice of a batch): the executors must read the caller's elements, not those at the recorded offset."""

    def f(x, w):
        return torch.relu(x @ w) * 2

    big, w = torch.randn(20, 8), torch.randn(8, 8)
    torch._dynamo.reset()
    backend = RecordingBackend(**options)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    for i in range(3):
        x = big[i * 4:(i + 1) * 4]
        torch.testing.assert_close(compiled(x, w), f(x, w))
    assert len(backend.compiled) == 1  # one graph served all three offsets
