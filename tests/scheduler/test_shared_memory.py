"""Partitions of one GPU share its memory: every planner keeps the bytes of one physical GPU within its capacity."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import random_dag
from torch_tessera.errors import InfeasiblePlanError
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.types import Plan, Workload
from torch_tessera.target.costs import CostTable
from torch_tessera.target.devices import parse_devices
from torch_tessera.target.links import build_topology

GB = 10**9
H200 = 141 * GB
PARTS = "cuda:0@104sm,cuda:0@24sm"


def _setup(devices: str, weight_gb: float, n: int = 8):
    """``n`` kernels, each reading its own weight of ``weight_gb / n`` GB, on ``devices`` (assumed H200s)."""
    dag = random_dag(n, 0, weight_mb=int(weight_gb * 1000 / n))
    topo = build_topology(parse_devices(devices, assume_gpu="h200"))
    nodes = tuple(sorted(dag.graph.nodes))
    seconds = np.random.default_rng(0).uniform(1e-4, 1e-3, (len(nodes), len(topo.devices)))
    costs = CostTable(topo.devices, nodes, seconds * np.array([1.0, 1.0, 20.0][:len(topo.devices)]))
    return dag, costs, topo


def _per_gpu(p: Plan) -> float:
    """Bytes the plan puts on GPU cuda:0 (every device of the pair is a partition of it)."""
    return float(sum(p.memory_bytes))


@pytest.mark.parametrize("policy", ["throughput", "latency", "homo-L", "homo-R"])
def test_plans_on_partitions_keep_one_gpu_within_its_memory(policy):
    dag, costs, topo = _setup(PARTS, 96)  # fits one H200 once
    p = plan(dag, costs, topo, policy=policy, cache_dir=False)
    assert _per_gpu(p) <= H200
    ((name, members, held, capacity),) = p.memory_pools
    assert (name, members, capacity) == ("cuda:0", (0, 1), H200) and held == pytest.approx(96 * GB, rel=1e-6)
    assert "hold 96.00 GB together (buffers they share once), budget 141.00 GB" in p.summary()


@pytest.mark.parametrize("policy", ["throughput", "latency"])
def test_model_bigger_than_the_gpu_does_not_fit_its_partitions(policy):
    dag, costs, topo = _setup(PARTS, 200)  # 100 GB per partition would fit each budget alone
    with pytest.raises(InfeasiblePlanError) as info:
        plan(dag, costs, topo, policy=policy, cache_dir=False)
    msg = str(info.value)
    m = re.search(r"GPU cuda:0 \(.*shared by cuda:0@104sm, cuda:0@24sm\) needs ([\d.]+) GB for its partitions "
                  r"together, has 141\.00 GB \(short by ([\d.]+) GB\)", msg)
    assert m, msg
    assert float(m.group(1)) == pytest.approx(200, abs=0.1) and float(m.group(2)) == pytest.approx(59, abs=0.1)
    assert "share its memory" in msg and "Fix:" in msg
    assert info.value.shortfalls[0][0] == "cuda:0"
    dag, costs, topo = _setup("cuda:0,cuda:1", 200)  # two whole GPUs hold it
    assert plan(dag, costs, topo, policy=policy, cache_dir=False).memory_bytes[0] <= H200


@pytest.mark.parametrize("policy", ["throughput", "latency"])
def test_the_planner_moves_what_one_gpu_cannot_hold_to_another(policy):
    """The partitions are 20x faster than cuda:1, so without the shared memory they would take all 200 GB."""
    dag, costs, topo = _setup(PARTS + ",cuda:1", 200)
    p = plan(dag, costs, topo, policy=policy, cache_dir=False)
    ((_, members, held, budget),) = p.memory_pools
    assert members == (0, 1) and held <= budget == H200
    assert p.memory_bytes[0] + p.memory_bytes[1] <= H200 and p.memory_bytes[2] >= 59 * GB
    assert p.memory_bytes[0] + p.memory_bytes[1] >= 125 * GB  # as much as fits stays on the fast partitions


def test_request_dist_copies_on_one_gpu_add_up_and_are_reported():
    dag, costs, topo = _setup(PARTS, 96)  # one copy fits, two (192 GB) do not
    with pytest.raises(InfeasiblePlanError) as info:
        plan(dag, costs, topo, policy="request-dist", cache_dir=False)
    msg = str(info.value)
    assert re.search(r"request-dist \(a full model copy on each of cuda:0@104sm, cuda:0@24sm\) does not fit: GPU "
                     r"cuda:0 .* needs 192\.00 GB for its partitions together, has 141\.00 GB \(short by 51\.00 GB\)",
                     msg), msg
    (name, need, have), = info.value.shortfalls
    assert (name, have) == ("cuda:0", H200) and need == pytest.approx(192 * GB, rel=1e-3)


def test_whole_separate_gpus_are_unchanged():
    dag, costs, topo = _setup("cuda:0,cuda:1", 96)
    assert topo.memory_pools == ()
    rd = plan(dag, costs, topo, policy="request-dist", cache_dir=False)
    assert rd.replicas == (0, 1) and rd.memory_pools == ()
    assert rd.memory_bytes == pytest.approx((96 * GB, 96 * GB), rel=1e-6)
    mine = plan(dag, costs, topo, cache_dir=False)
    given = plan(dag, costs, topo, memory_budgets=[H200, H200], cache_dir=False)  # the devices' own memory, no pools
    assert mine.placement == given.placement and mine.cycle_seconds == given.cycle_seconds


def test_request_streams_share_the_weights_of_one_gpu():
    """One request stream per partition reads the weights by name, and the partitions of one GPU share one buffer
    pool at run time: the weights count once, so request-dist as streams fits where two model copies do not."""
    dag, costs, topo = _setup(PARTS, 96)
    wl = Workload.single(dag, costs).replicated([0.5, 0.5])
    p = plan(wl, None, topo, policy="request-dist", cache_dir=False)
    assert p.weight_bytes == (96 * GB, 96 * GB)  # per device, as each partition reads them
    assert "hold 96.00 GB together (buffers they share once)" in p.summary()
    half = plan(wl, None, topo, policy="request-dist", memory_budgets=[H200, H200], cache_dir=False)
    assert half.weight_bytes == p.weight_bytes  # the same placement, planned without the shared pool


def test_mem_budget_of_a_partition_wins_and_the_rest_share_the_remainder():
    dag, costs, topo = _setup(PARTS + ",mem=60GB", 120)
    p = plan(dag, costs, topo, cache_dir=False)
    assert p.memory_bytes[1] <= 60 * GB and p.memory_bytes[0] <= H200 - 60 * GB
    with pytest.raises(InfeasiblePlanError, match=r"GPU cuda:0 \(.*less 60\.00 GB set by mem= on cuda:0@24sm,mem=60GB"
                                                  r"\) needs 120\.\d\d GB for cuda:0@104sm, has 81\.00 GB"):
        plan(dag, costs, topo, policy="homo-L", cache_dir=False)


def test_explicit_memory_budgets_win_over_the_shared_memory():
    dag, costs, topo = _setup(PARTS, 96)
    p = plan(dag, costs, topo, policy="request-dist", memory_budgets=[H200, H200], cache_dir=False)
    assert p.replicas == (0, 1) and p.memory_pools == ()
