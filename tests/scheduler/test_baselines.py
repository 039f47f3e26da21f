"""The field's baselines as plans, on a synthetic 2-layer transformer-like DAG with attention kernels."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import ref_cycle
from torch_tessera.lowering.program import BufferKind
from torch_tessera.scheduler import NotApplicableError, Workload, available_baselines, plan
from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

DEVS = ("big", "small")


@pytest.fixture(scope="module")
def model():
    dag = transformer_dag(layers=2, tokens=256, context=2048)
    return dag, roofline_costs(dag, DEVS), nvlink_topology(DEVS)


def _full_model_bytes(dag) -> int:
    return sum(b.nbytes for b in dag.buffers.values() if b.kind == BufferKind.PARAMETER)


def test_homo(model):
    dag, costs, tp = model
    for name, g in (("homo-L", 0), ("homo-R", 1), ("homo-1", 1), ("homo-small", 1)):
        p = plan(dag, costs, tp, policy=name)
        assert set(p.placement.values()) == {g}
        assert p.cycle_seconds == pytest.approx(costs.seconds[:, g].sum())
        assert p.cut_edges == ()
        assert p.weight_bytes[g] == _full_model_bytes(dag) and p.weight_bytes[1 - g] == 0
    with pytest.raises(NotApplicableError):
        plan(dag, costs, tp, policy="homo-5")


def test_request_dist_adds_throughput_and_replicates_memory(model):
    dag, costs, tp = model
    p = plan(dag, costs, tp, policy="request-dist")
    a, b = costs.seconds.sum(0)
    assert p.cycle_seconds == pytest.approx(1 / (1 / a + 1 / b))
    assert p.predicted_seconds == p.cycle_seconds
    assert p.replicas == (0, 1)
    assert p.weight_bytes == (_full_model_bytes(dag),) * 2
    assert p.latency_seconds == pytest.approx(max(a, b), rel=1e-6)


def test_af_splits_attention_and_picks_better_orientation(model):
    dag, costs, tp = model
    p = plan(dag, costs, tp, policy="af")
    attn = {k for k, d in dag.graph.nodes(data=True) if d["op_class"] == "attention"}
    devs_attn = {p.placement[k] for k in attn}
    devs_rest = {p.placement[k] for k in dag.graph.nodes if k not in attn}
    assert len(devs_attn) == 1 and len(devs_rest) == 1 and devs_attn != devs_rest
    a = devs_attn.pop()
    flipped = {k: (1 - a if k in attn else a) for k in dag.graph.nodes}
    assert p.cycle_seconds == pytest.approx(ref_cycle(dag, costs, tp, p.placement))
    assert p.cycle_seconds <= ref_cycle(dag, costs, tp, flipped)
    assert all(e.src_device != e.dst_device for e in p.cut_edges)


def test_layer_is_contiguous_and_balanced(model):
    dag, costs, tp = model
    p = plan(dag, costs, tp, policy="layer")
    per_layer = {}
    for k, d in dag.graph.nodes(data=True):
        if d["layer"] is not None:
            per_layer.setdefault(d["layer"], set()).add(p.placement[k])
    assert all(len(v) == 1 for v in per_layer.values())
    seq = [per_layer[l].pop() for l in sorted(per_layer)]
    assert seq == sorted(seq) or seq == sorted(seq, reverse=True)  # contiguous ranges
    homos = [plan(dag, costs, tp, policy=h).cycle_seconds for h in ("homo-L", "homo-R")]
    assert p.cycle_seconds <= min(homos) * (1 + 1e-9)  # one stage is a candidate too


def test_pd_needs_prefill_and_decode(model):
    dag, costs, tp = model
    with pytest.raises(NotApplicableError, match="does not apply"):
        plan(dag, costs, tp, policy="pd")
    pre = transformer_dag(layers=2, tokens=512, context=2048)
    wl = Workload.llm(pre, roofline_costs(pre, DEVS), dag, costs, mean_output_tokens=16)
    p = plan(wl, None, tp, policy="pd")
    assert len(set(p.placements["prefill"].values())) == 1
    assert len(set(p.placements["decode"].values())) == 1
    assert set(p.placements["prefill"].values()) != set(p.placements["decode"].values())
    handed = [e for e in p.cut_edges if e.kind == "STATE"]
    assert {e.ranges[0][0] for e in handed} == {"kv.0", "kv.1"}
    assert all(e.program == "prefill" and e.dst_program == "decode" for e in handed)


@pytest.mark.parametrize("score", ["cycle", "simulate"])
def test_throughput_beats_or_matches_every_kernel_placement_baseline(model, score):
    """By the model the plan was scored with: the cycle model, or the simulated step of the pipelined schedule."""
    dag, costs, tp = model
    best = plan(dag, costs, tp, policy="throughput", cache_dir=False, score=score)
    metric = "cycle_seconds" if score == "cycle" else "simulated_seconds"
    for name in available_baselines(2):
        if name in ("pd", "request-dist"):
            continue
        base = plan(dag, costs, tp, policy=name, score=score)
        assert getattr(best, metric) <= getattr(base, metric) * (1 + 1e-9), name
    assert best.lower_bound_seconds <= best.predicted_seconds


def test_latency_objective_for_baselines(model):
    dag, costs, tp = model
    p = plan(dag, costs, tp, policy="af", objective="latency")
    assert p.objective == "latency" and p.predicted_seconds == p.latency_seconds
    assert p.lower_bound_seconds <= plan(dag, costs, tp, policy="latency", cache_dir=False).predicted_seconds


def test_workload_weights_shared_between_programs():
    pre = transformer_dag(layers=2, tokens=512, context=1024)
    dec = transformer_dag(layers=2, tokens=32, context=1024)
    wl = Workload.llm(pre, roofline_costs(pre, DEVS), dec, roofline_costs(dec, DEVS), 64)
    p = plan(wl, None, nvlink_topology(DEVS), policy="homo-L")
    assert p.weight_bytes[0] == _full_model_bytes(dec)  # one copy serves both programs
    p2 = plan(wl, None, nvlink_topology(DEVS), cache_dir=False)
    dec_cost = roofline_costs(dec, DEVS).seconds[:, 0].sum() * 64 + roofline_costs(pre, DEVS).seconds[:, 0].sum()
    assert plan(wl, None, nvlink_topology(DEVS), policy="homo-L").cycle_seconds == pytest.approx(dec_cost)
    assert p2.cycle_seconds <= dec_cost
    assert np.isclose(p2.frequencies["decode"], 64)
