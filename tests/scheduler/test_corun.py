"""Partitions of one GPU slow each other down while both run launches (``MemoryShare.corun_rate``), in the simulator
and in the planner's score of placements."""

from __future__ import annotations

import numpy as np
import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.modulo import build_pipelined_schedule
from torch_tessera.scheduler.pipeline_plan import PipelineModel, corun_bound
from torch_tessera.scheduler.simulate import MemoryShare, simulate
from torch_tessera.scheduler.synthetic import layered_dag
from torch_tessera.target.costs import CostTable
from torch_tessera.target.devices import PARTITION_CORUN_RATE


def _two_independent(t0: float, t1: float, domains: tuple[int, int]):
    dag = layered_dag(2, width=2, seed=0)  # two independent kernels
    costs = CostTable(("p0", "p1"), (0, 1), np.array([[t0, t0], [t1, t1]]))
    return build_pipelined_schedule(dag, {0: 0, 1: 1}, 1, costs=costs, domains=domains), costs


def test_side_by_side_launches_of_one_domain_run_at_the_corun_rate():
    s, costs = _two_independent(1e-3, 3e-3, (0, 0))
    mem = MemoryShare({}, (), {}, (), corun_rate=0.5)
    r = simulate(s, costs, None, memory=mem)
    # both at half speed until launch 0's 1 ms is done (2 ms of wall), launch 1 has 2 ms left alone: 4 ms
    assert r.end[0][-1] == pytest.approx(2e-3)
    assert r.step_seconds == pytest.approx(4e-3)
    assert r.step_seconds == pytest.approx(corun_bound(np.array([1e-3, 3e-3]),
                                                       PipelineModel((0, 0), corun_rate=0.5)))
    # no slowdown at rate 1, or on two GPUs (two domains)
    assert simulate(s, costs, None, memory=MemoryShare({}, (), {})).step_seconds == pytest.approx(3e-3)
    s2, _ = _two_independent(1e-3, 3e-3, (0, 1))
    assert simulate(s2, costs, None, memory=mem).step_seconds == pytest.approx(3e-3)


def test_corun_rate_and_bandwidth_share_take_the_slower():
    # launch 0 asks 3 TB/s (gets 2 of the 4 TB/s domain: rate 2/3), launch 1 2 TB/s (all of it): co-run 0.8
    s, costs = _two_independent(1e-3, 1e-3, (0, 0))
    mem = MemoryShare({0: 3e9, 1: 2e9}, (3e12, 3e12), {0: 4e12}, (), corun_rate=0.8)
    r = simulate(s, costs, None, memory=mem)
    # launch 1 at 0.8 ends at 1.25 ms; launch 0 at 2/3 has 1/6 ms left, alone: 1.25 + 1/6 ms
    assert r.end[1][-1] == pytest.approx(1.25e-3)
    assert r.step_seconds == pytest.approx(1.25e-3 + 1e-3 / 6)


def test_bad_corun_rate_is_refused_by_name():
    s, costs = _two_independent(1e-3, 1e-3, (0, 0))
    with pytest.raises(ConfigError, match="corun_rate=0"):
        simulate(s, costs, None, memory=MemoryShare({}, (), {}, (), corun_rate=0.0))


def test_models_of_partitions_carry_the_measured_rate():
    assert PipelineModel.from_names(["cuda:0@104sm", "cuda:0@24sm"]).corun_rate == PARTITION_CORUN_RATE
    assert PipelineModel.from_names(["cuda:0", "cuda:1"]).corun_rate == 1.0
    assert PipelineModel.from_names(["cuda:0", "cuda:1"]).memory_share(layered_dag(2, 2, seed=0)) is None
    assert 0.0 < PARTITION_CORUN_RATE < 1.0


def test_corun_bound_per_domain():
    model = PipelineModel((0, 0, 1), corun_rate=0.5)
    # domain 0: 1 ms / 0.5 + (2 - 1) ms = 3 ms; domain 1 alone: 2.5 ms
    assert corun_bound(np.array([1e-3, 2e-3, 2.5e-3]), model) == pytest.approx(3e-3)
    assert corun_bound(np.array([1e-3, 2e-3, 2.5e-3]), PipelineModel((0, 0, 1))) == pytest.approx(2.5e-3)
