"""Weights shared between executors (``PlacedExecutor.weight_cache``): a serving process keeps one copy of each
weight per device for all its plans and programs, instead of one per executor (which ran a 24-SM H200 out of memory
in a 32-layer serving sweep, 2026-11-30). Every executor must still compute what eager computes."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TEST_DEVICE
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from tests.runtime.test_pipelining import _compile
from torch_tessera.models import MLP

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


def _weights_on(ex, dev: int) -> dict[str, torch.Tensor]:
    return {b: t for b, t in ex.placed_pools[dev].storages.items()}


@pytest.mark.parametrize("graphs", [False, True])
def test_second_executor_reuses_the_first_ones_weights(graphs, request):
    if graphs:
        request.getfixturevalue("stand_in_graphs")
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    x = torch.randn(8, 32)
    want = model(x)
    runner, args = _compile(model, (x,))
    runner.cuda_graphs = graphs
    n = len(runner.program.launches)
    runner.weight_cache = {}

    def run_with(placement):
        runner.set_placement(placement)
        with torch.no_grad():
            out = [o for o in runner.executor.run(list(args)) if isinstance(o, torch.Tensor)][0]
        torch.testing.assert_close(out, want)
        return runner.executor

    first = run_with({i: 1 for i in range(n)})  # every weight onto device 1
    placed = first.bytes_moved["weights"]
    assert placed > 0 and len(runner.weight_cache) > 0
    second = run_with({i: 1 if i % 2 == 0 else 0 for i in range(n)})  # a subset of them on device 1
    assert second.bytes_moved["weights"] == 0  # nothing copied again
    third = run_with({i: 1 for i in range(n)})
    assert third.bytes_moved["weights"] == 0
    if not graphs:  # the storages are the first executor's
        mine, theirs = _weights_on(third, 1), _weights_on(first, 1)
        assert mine and all(mine[b] is theirs[b] for b in mine)
    runner.weight_cache = None  # without a cache each executor copies its own
    assert run_with({i: 1 for i in range(n)}).bytes_moved["weights"] == placed
