"""Plan cache, repeated-layer reduction, summary text, JSON round trip, Gantt chart."""

from __future__ import annotations

import functools

import dataclasses

import numpy as np
import pytest

from conftest import random_costs, random_dag, ref_cycle, topo
from torch_tessera.target.costs import CostTable
from torch_tessera.scheduler import Plan, Workload, plan, solve
from torch_tessera.scheduler.gantt import timeline, write_gantt
from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

#: these tests check the cycle model's solver (the per-cut charge of Topology.hop_overhead): the model
#: ``score="cycle"`` keeps; the simulated score is tested in test_pipeline_plan.py
plan = functools.partial(plan, score="cycle")


def test_cache_hit_miss_and_invalidation(tmp_path):
    dag = random_dag(6, 0)
    costs, tp = random_costs(dag, 2, 0), topo(2)
    first = plan(dag, costs, tp, cache_dir=tmp_path)
    assert not first.solver.method.startswith("cache")
    assert len(list(tmp_path.glob("*.json"))) == 1
    again = plan(dag, costs, tp, cache_dir=tmp_path)
    assert again.solver.method.startswith("cache:")
    assert again.placement == first.placement and again.predicted_seconds == first.predicted_seconds
    # changed costs, device set, program, policy: all miss
    c2 = CostTable(costs.devices, costs.kernels, costs.seconds * 1.01)
    assert not plan(dag, c2, tp, cache_dir=tmp_path).solver.method.startswith("cache")
    renamed = dataclasses.replace(tp, devices=("x0", "x1"))
    c3 = CostTable(("x0", "x1"), costs.kernels, costs.seconds)
    assert not plan(dag, c3, renamed, cache_dir=tmp_path).solver.method.startswith("cache")
    u, v = next(iter(dag.graph.edges))
    dag.graph.edges[u, v]["bytes"] += 1
    assert not plan(dag, costs, tp, cache_dir=tmp_path).solver.method.startswith("cache")
    assert not plan(dag, costs, tp, policy="latency", cache_dir=tmp_path).solver.method.startswith("cache")
    assert plan(dag, costs, tp, policy="latency", cache_dir=tmp_path).solver.method.startswith("cache")


def test_cache_env_root_and_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "root"))
    dag = random_dag(5, 1)
    costs, tp = random_costs(dag, 2, 1), topo(2)
    plan(dag, costs, tp)
    files = list((tmp_path / "root" / "plans").glob("*.json"))
    assert len(files) == 1
    files[0].write_text("{not json")
    p = plan(dag, costs, tp)  # unreadable file: solved again, rewritten
    assert not p.solver.method.startswith("cache")
    assert plan(dag, costs, tp).solver.method.startswith("cache")
    assert plan(dag, costs, tp, cache_dir=False).solver.method != "cache"


@pytest.mark.parametrize("layers,D", [(3, 2), (4, 2), (2, 3)])
def test_layer_counts_reduction_matches_full_milp(layers, D, monkeypatch):
    devs = ("big", "small", "mid")[:D]
    dag = transformer_dag(layers=layers, tokens=256, context=2048)
    costs, tp = roofline_costs(dag, devs, seed=layers), nvlink_topology(devs)
    full = plan(dag, costs, tp, tie_layers=False, cache_dir=False, time_limit=60, mip_gap=1e-6)
    monkeypatch.setattr(solve, "EXACT_BLOCKS", 0)  # the counts MILP alone, no untied fallback
    red = plan(dag, costs, tp, cache_dir=False, mip_gap=1e-6)
    assert red.solver.blocks < full.solver.blocks
    assert red.predicted_seconds == pytest.approx(ref_cycle(dag, costs, tp, red.placement), rel=1e-9)
    assert red.lower_bound_seconds <= full.predicted_seconds * (1 + 1e-6)  # the counts bound is valid
    assert red.predicted_seconds <= full.predicted_seconds * 1.02
    if full.solver.status == "optimal":
        assert full.predicted_seconds <= red.predicted_seconds * (1 + 1e-6)


def test_counts_bound_is_tight_on_identical_layers():
    dag = transformer_dag(layers=12, tokens=256, context=2048)
    devs = ("big", "small")
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    p = plan(dag, costs, tp, cache_dir=False)
    assert p.gap < 0.005
    assert "counted" in " ".join(p.solver.notes)
    assert p.solver.method.startswith("counts-lp")  # the rounded LP counts were within mip_gap: no MILP
    exact = plan(dag, costs, tp, cache_dir=False, mip_gap=1e-6)  # the counts MILP too, to its end
    assert p.lower_bound_seconds <= exact.predicted_seconds * (1 + 1e-9)
    assert p.predicted_seconds <= exact.predicted_seconds * (1 + 0.005)


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_rounded_lp_counts_respect_memory_budgets(share):
    """A budget that holds ``share`` of the model on the big device: rounding the LP's counts up there would break it
    (as on Mixtral, 2 devices); the rounding is repaired and the plan fits, within mip_gap of its bound."""
    from torch_tessera.lowering.program import BufferKind

    dag = transformer_dag(layers=12, tokens=256, context=2048)
    devs = ("big", "small")
    total = sum(b.nbytes for b in dag.buffers.values() if b.kind != BufferKind.TEMP)
    tp = nvlink_topology(devs, memory=[int(share * total), total])
    p = plan(dag, roofline_costs(dag, devs), tp, cache_dir=False)
    assert p.solver.method.startswith("counts-lp")
    assert all(m <= b for m, b in zip(p.memory_bytes, tp.memory))
    assert p.gap <= 0.005


def test_summary_and_json_round_trip():
    dag = transformer_dag(layers=2, tokens=64, context=512)
    devs = ("big", "small")
    p = plan(dag, roofline_costs(dag, devs), nvlink_topology(devs), cache_dir=False)
    text = str(p)
    for key in ("kernels", "cut edges", "bytes per step", "lower bound", "gap", "big", "small", "solver"):
        assert key in text
    assert f"{len(p.cut_edges)}" in text
    back = Plan.from_json(p.to_json())
    assert back == p


def test_gantt_shows_overlapping_micro_batches(tmp_path):
    dag = transformer_dag(layers=2, tokens=256, context=2048)
    devs = ("big", "small")
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    p = plan(dag, costs, tp, policy="layer", micro_batches=3)
    ivs = timeline(p, dag, costs, tp)
    assert {iv.micro_batch for iv in ivs} == {0, 1, 2}
    lanes = {iv.lane for iv in ivs}
    assert {"big", "small"} <= lanes and any("->" in lane for lane in lanes)
    end0 = max(iv.end for iv in ivs if iv.micro_batch == 0)
    assert min(iv.start for iv in ivs if iv.micro_batch == 1) < end0  # pipelined, not one after another
    for lane in lanes:  # no lane runs two tasks at once
        spans = sorted((iv.start, iv.end) for iv in ivs if iv.lane == lane)
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:]))
    out = write_gantt(p, dag, costs, tp, tmp_path / "g.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_limit_returns_incumbent_with_gap():
    dag = random_dag(60, 3)
    costs, tp = random_costs(dag, 3, 3), topo(3, bw=3e6)
    p = plan(dag, costs, tp, cache_dir=False, time_limit=0.3, tie_layers=False)
    assert np.isfinite(p.predicted_seconds)
    assert 0 <= p.lower_bound_seconds <= p.predicted_seconds
    assert p.solver.wall_seconds < 3.0


@pytest.mark.parametrize("D", [2, 3])
def test_counts_on_real_dag_shapes(D, monkeypatch):
    """Two shapes of real lowered LLMs: a table every layer reads (RoPE cos/sin: one source group, an edge into each
    layer) and a layer-boundary kernel without a layer index (Inductor's fused add + RMSNorm). The counts MILP must
    stay feasible (it was infeasible when an edge class's source fed several instances), its bound must stay valid,
    and the realised plan must be within 2 % of the exact MILP."""
    devs = ("big", "small", "mid")[:D]
    dag = transformer_dag(layers=6, tokens=256, context=2048, rope_tables=True, unlabelled_boundary=True)
    costs, tp = roofline_costs(dag, devs, seed=D), nvlink_topology(devs)
    full = plan(dag, costs, tp, tie_layers=False, cache_dir=False, time_limit=60, mip_gap=1e-6)
    monkeypatch.setattr(solve, "EXACT_BLOCKS", 0)  # the counts path alone
    monkeypatch.setattr(solve, "LP_PLAN_GAP", 0.0)  # and its MILP, even when the rounded LP plan is close
    monkeypatch.setattr(solve, "EXACT_MILP_SHARE", 0.85)  # run to its end: this checks its plan, not planning time
    red = plan(dag, costs, tp, cache_dir=False, mip_gap=1e-6)
    assert "counted" in " ".join(red.solver.notes)
    assert "milp" in red.solver.method  # the counts MILP's realisation, not only the list heuristic
    assert red.lower_bound_seconds <= full.predicted_seconds * (1 + 1e-6)
    assert red.predicted_seconds == pytest.approx(ref_cycle(dag, costs, tp, red.placement), rel=1e-9)
    assert red.predicted_seconds <= full.predicted_seconds * 1.02


@pytest.mark.parametrize("D", [2, 3])
def test_layers_of_other_shapes_are_aligned(D, monkeypatch):
    """A first layer with one more kernel (as real LLMs' first layer) and a last layer with one less are aligned with
    the others by op class: their other kernels join the repeated classes. The counts bound stays valid and the plan
    within 2 % of the exact MILP."""
    from torch_tessera.scheduler.blocks import tie_layers
    from torch_tessera.scheduler.problem import compile_problem

    devs = ("big", "small", "mid")[:D]
    dag = transformer_dag(layers=4, tokens=256, context=2048, first_layer_extra=True, unlabelled_boundary=True)
    costs, tp = roofline_costs(dag, devs, seed=D), nvlink_topology(devs)  # 4 layers: the exact MILP takes ~2 s
    pb = compile_problem(Workload.single(dag, costs), tp)
    exact_blocks = int(tie_layers(pb, align=False)[0].max()) + 1
    aligned_blocks = int(tie_layers(pb)[0].max()) + 1
    # layer 0's 11 kernels like the others' and the last layer's 10 (its boundary add is outside the layers) joined
    assert aligned_blocks == exact_blocks - 11 - 10 == 11 + 5  # one per layer position; scale, embedding, norm, head
    full = plan(dag, costs, tp, tie_layers=False, cache_dir=False, time_limit=60, mip_gap=1e-6)
    monkeypatch.setattr(solve, "EXACT_BLOCKS", 0)
    red = plan(dag, costs, tp, cache_dir=False, mip_gap=1e-6)
    assert red.lower_bound_seconds <= full.predicted_seconds * (1 + 1e-6)
    assert red.predicted_seconds == pytest.approx(ref_cycle(dag, costs, tp, red.placement), rel=1e-9)
    assert red.predicted_seconds <= full.predicted_seconds * 1.02


def test_layer_units_join_boundary_kernels():
    from torch_tessera.scheduler.blocks import layer_units
    from torch_tessera.scheduler.problem import compile_problem

    devs = ("big", "small")
    dag = transformer_dag(layers=3, unlabelled_boundary=True)
    pb = compile_problem(Workload.single(dag, roofline_costs(dag, devs)), nvlink_topology(devs))
    units = layer_units(pb)
    names = pb.names
    assert units[0] is None and units[-1] is None and units[-2] is None  # embedding, final norm, head
    boundary = [k for k in range(pb.n) if pb.layer[k] is None and names[k] == "add"]
    assert [units[k] for k in boundary] == [0, 1, None]  # the last layer's boundary add is after the last layer


def test_untied_milp_is_started_only_when_the_time_limit_allows_its_size(monkeypatch):
    assert solve.untied_fits(2824, 10.0)  # Llama-3.1-8B, 2 devices: solved in 2.9 s
    assert not solve.untied_fits(5656, 10.0)  # Mamba-2.8B, 4 devices: ran 10 s without improving
    assert solve.untied_fits(5656, 20.0)
    assert not solve.untied_fits(solve.EXACT_BLOCKS + 1, 1e6)
    devs = ("big", "small", "mid")
    dag = transformer_dag(layers=4, tokens=256, context=2048)
    costs, tp = roofline_costs(dag, devs, seed=4), nvlink_topology(devs)
    monkeypatch.setattr(solve, "RESOLVE_GAP", -1.0)  # every tied plan above its bound counts as loose
    started = plan(dag, costs, tp, cache_dir=False, mip_gap=0.0, time_limit=5.0)
    assert started.predicted_seconds > started.lower_bound_seconds
    assert any(n.startswith("untied MILP on") for n in started.solver.notes)
    monkeypatch.setattr(solve, "EXACT_BINARIES_PER_SECOND", 1e-3)
    skipped = plan(dag, costs, tp, cache_dir=False, mip_gap=0.0, time_limit=5.0)
    assert any(n.startswith("untied MILP not started") for n in skipped.solver.notes)
    assert not any(n.startswith("untied MILP on") for n in skipped.solver.notes)


@pytest.mark.parametrize("enabled", [True, False])
def test_plan_pauses_the_garbage_collector_and_restores_it(monkeypatch, enabled):
    import gc

    seen = []
    real = solve.solve_throughput

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    import torch_tessera.scheduler as sched

    monkeypatch.setattr(sched, "solve_throughput", spy)
    dag = random_dag(6, 0)
    (gc.enable if enabled else gc.disable)()
    try:
        plan(dag, random_costs(dag, 2, 0), topo(2), cache_dir=False)
        assert seen == [False]
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_compare_prints_why_a_plan_is_missing_in_full():
    """A baseline that does not apply or fit is listed as n/a, with its whole reason under the table (a table cell
    used to cut it at 70 characters, mid-sentence)."""
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler.report import compare

    reason = ("homo-R does not fit: device cpu:1 needs 26.33 GB, has 25.28 GB (short by 1.05 GB: weights 16.1 GB, "
              "KV cache 9.13 GB, activations 1.1 GB)")
    text = compare({"homo-R": InfeasiblePlanError(reason)})
    assert "n/a" in text and reason in text


def test_a_rounded_lp_plan_within_lp_plan_gap_skips_the_counts_milp(monkeypatch):
    """A tied plan realised from the rounded counts LP within LP_PLAN_GAP of the LP bound (here 0.55 %, over the
    default mip_gap) is returned without the counts MILP; with LP_PLAN_GAP = 0 the MILP runs, and its plan is not
    better by more than that gap."""
    devs = ("big", "small")
    dag = transformer_dag(layers=18, tokens=256, context=2048)  # bench/bench_scheduler.py's 200-kernel case
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    relaxed: list[bool] = []
    counts = solve.solve_counts

    def counting(*args, **kwargs):
        relaxed.append(bool(kwargs.get("relax", False)))
        return counts(*args, **kwargs)

    monkeypatch.setattr(solve, "solve_counts", counting)
    fast = plan(dag, costs, tp, cache_dir=False)
    assert relaxed == [True]  # the LP only
    assert 5e-3 < fast.gap <= solve.LP_PLAN_GAP and fast.solver.method == "counts-lp+local"
    relaxed.clear()
    monkeypatch.setattr(solve, "LP_PLAN_GAP", 0.0)
    full = plan(dag, costs, tp, cache_dir=False)
    assert relaxed == [True, False] and "milp" in full.solver.method
    assert fast.predicted_seconds <= full.predicted_seconds * (1 + 1e-2)
