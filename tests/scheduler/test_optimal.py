"""Plans on small DAGs against the optimum found by enumerating every placement."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conftest import MB, all_placements, random_costs, random_dag, ref_cycle, ref_latency, ref_weights, topo
from torch_tessera.scheduler import plan

#: these tests check the cycle model's solver (the per-cut charge of Topology.hop_overhead): the model
#: ``score="cycle"`` keeps; the simulated score is tested in test_pipeline_plan.py
plan = functools.partial(plan, score="cycle")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("D", [2, 3])
def test_throughput_matches_brute_force(seed, D):
    dag = random_dag(7 if D == 2 else 6, seed)
    costs, tp = random_costs(dag, D, seed), topo(D)
    best = min(ref_cycle(dag, costs, tp, pl) for pl in all_placements(dag, D))
    p = plan(dag, costs, tp, policy="throughput", cache_dir=False, micro_batches=2)
    assert p.predicted_seconds == pytest.approx(ref_cycle(dag, costs, tp, p.placement), rel=1e-9)
    assert p.predicted_seconds == pytest.approx(best, rel=1e-4)
    assert p.lower_bound_seconds <= best * (1 + 1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_throughput_with_memory_budget_matches_brute_force(seed):
    D = 2
    dag = random_dag(7, seed, weight_mb=100)  # 700 MB of weights; temporaries are a few KB
    costs, tp = random_costs(dag, D, seed), topo(D)
    budgets = [350.5 * MB, 500.5 * MB]  # at most 3 weights on d0, 5 on d1
    feasible = [pl for pl in all_placements(dag, D)
                if np.all(ref_weights(dag, pl, D) <= np.array(budgets) - 0.1 * MB)]
    best = min(ref_cycle(dag, costs, tp, pl) for pl in feasible)
    p = plan(dag, costs, tp, memory_budgets=budgets, cache_dir=False)
    assert p.predicted_seconds == pytest.approx(best, rel=1e-4)
    w = ref_weights(dag, p.placement, D)
    assert np.all(w <= np.array(budgets)), w
    assert p.weight_bytes == tuple(int(x) for x in w)
    unlimited = plan(dag, costs, tp, cache_dir=False)
    assert unlimited.predicted_seconds <= p.predicted_seconds * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_latency_on_chain_is_exact(seed, monkeypatch):
    from torch_tessera.scheduler import solve

    monkeypatch.setattr(solve, "LATENCY_CUT_TOLERANCE", 0.0)  # no cut shedding: the DP's optimum itself
    dag = random_dag(8, seed, chain=True)
    costs, tp = random_costs(dag, 2, seed), topo(2, bw=1e8)
    best = min(ref_latency(dag, costs, tp, pl) for pl in all_placements(dag, 2))
    p = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert p.solver.method in ("dp", "dp+shed")  # +shed: an equally fast plan with fewer cut edges
    assert p.predicted_seconds == pytest.approx(best, rel=1e-9)
    assert p.predicted_seconds == pytest.approx(ref_latency(dag, costs, tp, p.placement), rel=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_latency_on_dag_near_brute_force_and_bound_valid(seed):
    dag = random_dag(7, seed)
    costs, tp = random_costs(dag, 2, seed), topo(2, bw=1e8)
    best = min(ref_latency(dag, costs, tp, pl) for pl in all_placements(dag, 2))
    p = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert p.predicted_seconds == pytest.approx(ref_latency(dag, costs, tp, p.placement), rel=1e-9)
    assert p.lower_bound_seconds <= best * (1 + 1e-9)
    assert p.predicted_seconds <= best * 1.05


def test_latency_with_memory_budget():
    dag = random_dag(6, 3, chain=True, weight_mb=100)
    costs, tp = random_costs(dag, 2, 3), topo(2, bw=1e8)
    budgets = [200.5 * MB, 450.5 * MB]
    feasible = [pl for pl in all_placements(dag, 2)
                if np.all(ref_weights(dag, pl, 2) <= np.array(budgets) - 0.1 * MB)]
    best = min(ref_latency(dag, costs, tp, pl) for pl in feasible)
    p = plan(dag, costs, tp, policy="latency", memory_budgets=budgets, cache_dir=False)
    assert np.all(ref_weights(dag, p.placement, 2) <= np.array(budgets))
    assert p.lower_bound_seconds <= best * (1 + 1e-9) <= p.predicted_seconds * (1 + 1e-9)
    assert p.predicted_seconds <= best * 1.05


def test_hand_worked_pair():
    """Two independent kernels, each 4x faster on a different device, tiny link: the optimum splits them
    (cycle = 1 ms); alone on either device the cycle would be 5 ms."""
    from torch_tessera.target.costs import CostTable

    dag = random_dag(2, 0)
    dag.graph.remove_edges_from(list(dag.graph.edges))
    costs = CostTable(("d0", "d1"), (0, 1), np.array([[1e-3, 4e-3], [4e-3, 1e-3]]))
    p = plan(dag, costs, topo(2), cache_dir=False)
    assert p.placement == {0: 0, 1: 1}
    assert p.predicted_seconds == pytest.approx(1e-3)
    assert p.gap == pytest.approx(0.0, abs=1e-4)
