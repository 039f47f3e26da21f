"""Every placement policy the backend accepts runs the tiny Llama on two CPU virtual devices and equals eager."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.models import build_model
from torch_tessera.runtime.schedule import cut_edge_count

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


@pytest.mark.parametrize("policy", ["throughput", "latency", "af", "layer", "homo-R"])
def test_policy_plan_runs_and_equals_eager(policy):
    model, inputs = build_model("llama", "tiny")
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy=policy)
    compiled = torch.compile(copy.deepcopy(model), backend=backend, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    runner = backend.executors[0]
    assert runner.plan is not None and runner.plan.policy == policy
    placement = runner.placement
    assert set(placement) == {l.index for l in runner.program.launches}
    assert runner.executor.cut_edges_transferred == cut_edge_count(runner.dag, placement)
    if policy == "homo-R":
        assert set(placement.values()) == {1} and runner.executor.cut_edges_transferred == 0
    if policy == "af":
        attention = {k.index for k in runner.dag.nodes() if k.op_class == "attention"}
        assert attention and len({placement[n] for n in attention}) == 1
        assert {placement[n] for n in placement if n not in attention} != {placement[next(iter(attention))]}
