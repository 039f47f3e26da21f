"""Memory budgets that nothing fits, pins, unsure kernels, STATE owners."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from conftest import MB, random_costs, random_dag, topo
from torch_tessera.errors import ConfigError, InfeasiblePlanError
from torch_tessera.graph.types import add_kernel
from torch_tessera.lowering.program import BufferKind
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag


def test_infeasible_budget_names_short_device_and_amount():
    dag = random_dag(4, 0, weight_mb=500)  # 2.0 GB of weights, one 0.5 GB weight per kernel
    costs, tp = random_costs(dag, 2, 0), topo(2)
    # d0 can hold 1 weight, d1 can hold 2: 3 of 4 fit; the least overflow puts the 4th (0.5 GB) on one device
    with pytest.raises(InfeasiblePlanError) as info:
        plan(dag, costs, tp, memory_budgets=[0.6e9, 1.1e9], cache_dir=False)
    msg = str(info.value)
    m = re.search(r"device (d\d) needs ([\d.]+) GB, has ([\d.]+) GB \(short by ([\d.]+) GB\)", msg)
    assert m, msg
    dev, need, have, short = m.group(1), *map(float, m.groups()[1:])
    assert have == pytest.approx({"d0": 0.6, "d1": 1.1}[dev], abs=0.01)
    assert short == pytest.approx(0.5 - (0.6 if dev == "d0" else 1.1) % 0.5, abs=0.02)
    assert need == pytest.approx(have + short, abs=0.02)
    assert "Fix:" in msg


def test_homo_baseline_too_big_for_device():
    dag = random_dag(4, 0, weight_mb=500)
    costs, tp = random_costs(dag, 2, 0), topo(2)
    with pytest.raises(InfeasiblePlanError, match=r"device d1 needs 2\.\d\d GB, has 1\.50 GB \(short by 0\.5"):
        plan(dag, costs, tp, policy="homo-R", memory_budgets=[None, 1.5e9])
    assert plan(dag, costs, tp, policy="homo-L", memory_budgets=[None, 1.5e9]).kernels_on(0) == 4


def test_weights_only_where_read():
    dag = random_dag(6, 2, weight_mb=100)
    costs, tp = random_costs(dag, 2, 2), topo(2)
    p = plan(dag, costs, tp, cache_dir=False)
    for g in range(2):
        readers = {f"w{k}" for k, d in p.placement.items() if d == g}
        assert set(p.weights[g]) == readers
        assert p.weight_bytes[g] == 100 * MB * len(readers)


def test_pins_are_respected_and_conflicts_raise():
    dag = random_dag(6, 1)
    costs, tp = random_costs(dag, 2, 1), topo(2)
    free = plan(dag, costs, tp, cache_dir=False).placement
    pins = {k: 1 - d for k, d in list(free.items())[:2]}
    p = plan(dag, costs, tp, pins=pins, cache_dir=False)
    assert all(p.placement[k] == d for k, d in pins.items())
    assert p.predicted_seconds >= plan(dag, costs, tp, cache_dir=False).predicted_seconds * (1 - 1e-9)
    with pytest.raises(ConfigError, match="not a device"):
        plan(dag, costs, tp, pins={0: 7}, cache_dir=False)
    with pytest.raises(ConfigError, match="names no launch"):
        plan(dag, costs, tp, pins={99: 0}, cache_dir=False)


def test_conflicting_pins_on_one_state_owner():
    dag = transformer_dag(layers=1, tokens=8, context=64)
    costs = roofline_costs(dag, ("big", "small"))
    writer = next(k.index for k in dag.nodes() if "kv.0" in k.writes)
    reader = next(k for k in dag.nodes() if k.name == "attention")
    add_kernel(dag.graph, replace(reader, write_ranges=reader.write_ranges + (("kv.0", 0, 8),)))  # a second writer
    reader = reader.index
    with pytest.raises(InfeasiblePlanError, match="must share a device"):
        plan(dag, costs, nvlink_topology(("big", "small")), pins={writer: 0, reader: 1}, cache_dir=False)


def test_unsure_kernels_stay_with_a_neighbour():
    dag = transformer_dag(layers=3, tokens=64, context=256, unsure_every=1)
    devs = ("big", "small")
    costs = roofline_costs(dag, devs, seed=4)
    for policy in ("throughput", "latency", "af", "layer"):
        p = plan(dag, costs, nvlink_topology(devs), policy=policy, cache_dir=False)
        for k in (n.index for n in dag.nodes() if n.unsure):
            nbrs = set(dag.graph.predecessors(k)) | set(dag.graph.successors(k))
            assert any(p.placement[j] == p.placement[k] for j in nbrs), (policy, k)


def test_state_writers_share_the_owner_device():
    dag = transformer_dag(layers=2, tokens=64, context=256)
    for k in dag.nodes():  # make attention also write its cache (as an in-place append would)
        if k.name == "attention":
            add_kernel(dag.graph, replace(k, write_ranges=k.write_ranges + ((f"kv.{k.layer}", 0, 8),)))
    devs = ("big", "small")
    costs = roofline_costs(dag, devs)
    for policy in ("throughput", "latency", "af"):
        p = plan(dag, costs, nvlink_topology(devs), policy=policy, cache_dir=False)
        for name, b in dag.buffers.items():
            if b.kind == BufferKind.STATE:
                owners = {p.placement[k.index] for k in dag.nodes() if name in k.writes}
                assert len(owners) == 1, (policy, name, owners)


def test_mismatched_costs_are_config_errors():
    dag = random_dag(4, 0)
    costs = random_costs(dag, 2, 0)
    with pytest.raises(ConfigError, match="covers devices"):
        plan(dag, costs, topo(3), cache_dir=False)
    with pytest.raises(ConfigError, match="unknown policy 'thruput'.*did you mean 'throughput'"):
        plan(dag, costs, topo(2), policy="thruput", cache_dir=False)
    short = random_costs(random_dag(3, 0), 2, 0)
    with pytest.raises(ConfigError, match="lacks launches"):
        plan(dag, short, topo(2), cache_dir=False)
    with pytest.raises(ConfigError, match="memory_budgets has 1 entries"):
        plan(dag, costs, topo(2), memory_budgets=[1], cache_dir=False)
    assert np.isfinite(plan(dag, costs, topo(2), memory_budgets={"d0": 10**12}, cache_dir=False).predicted_seconds)


@pytest.mark.parametrize("layers,share", [(4, 0.6), (8, 0.6), (8, 0.8)])
def test_latency_plan_when_only_split_placements_fit(layers, share):
    """Budgets of ``share`` of the model per device: no single device holds it and (at 0.6) no tied placement either,
    which made the latency policy raise while the throughput policy planned. Now it plans, within the budgets, and
    never worse than the layer baseline chosen for latency."""
    dag = transformer_dag(layers=layers, tokens=256, context=2048)
    devs = ("big", "small")
    total = sum(b.nbytes for b in dag.buffers.values() if b.kind != BufferKind.TEMP)
    tp = nvlink_topology(devs, memory=[int(share * total)] * 2)
    costs = roofline_costs(dag, devs)
    p = plan(dag, costs, tp, policy="latency", cache_dir=False, time_limit=5)
    assert all(m <= b for m, b in zip(p.memory_bytes, tp.memory))
    assert p.lower_bound_seconds <= p.predicted_seconds == p.latency_seconds
    try:
        layer = plan(dag, costs, tp, policy="layer", objective="latency", cache_dir=False)
    except InfeasiblePlanError:
        return
    assert p.latency_seconds <= layer.latency_seconds * (1 + 1e-9)
