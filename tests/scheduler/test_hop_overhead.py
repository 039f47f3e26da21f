"""The per-hop charge (issue 9): each cut edge costs the two devices it joins ``hop`` seconds per program run and
``exposure x bytes / bandwidth``, besides its load on the link. Plans against brute force under that model, the charge
changing the optimum, the cache key, the baselines scored alike, and the topology figures."""

from __future__ import annotations

import functools

from dataclasses import replace

import numpy as np
import pytest

from conftest import all_placements, random_costs, random_dag
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.cache import plan_key
from torch_tessera.scheduler.evaluate import cycle_seconds, fill_drain_seconds
from torch_tessera.scheduler.synthetic import nvlink_topology
from torch_tessera.scheduler.problem import as_workload, compile_problem

#: these tests check the cycle model's solver (the per-cut charge of Topology.hop_overhead): the model
#: ``score="cycle"`` keeps; the simulated score is tested in test_pipeline_plan.py
plan = functools.partial(plan, score="cycle")


def charged_topo(D: int, hop: float, exposure: float = 0.0, bw: float = 1e8, lat: float = 2e-5) -> Topology:
    return Topology.uniform([f"d{i}" for i in range(D)], bw, lat, hop_overhead=hop, copy_exposure=exposure)


def ref_cycle_hop(dag, costs: CostTable, tp: Topology, place: dict[int, int], micro_batches: int = 2) -> float:
    """The documented model, written independently of the solver: device loads = kernel seconds + for every RAW edge
    cut ``a -> b`` (on both ``a`` and ``b``) ``micro_batches x hop_ab + exposure_ab x bytes / bandwidth_ab``; link
    loads = ``bytes / bandwidth + micro_batches x latency``; cycle = the largest."""
    D = len(tp.devices)
    dev, link = np.zeros(D), np.zeros((D, D))
    for k in dag.graph.nodes:
        dev[place[k]] += costs.row(k)[place[k]]
    for u, v, d in dag.graph.edges(data=True):
        a, b = place[u], place[v]
        if a != b and "RAW" in d["kinds"] and d["bytes"] > 0:
            t = d["bytes"] / tp.bandwidth[a, b]
            link[a, b] += t + micro_batches * tp.latency[a, b]
            charge = micro_batches * tp.hop_overhead[a, b] + tp.copy_exposure[a, b] * t
            dev[a] += charge
            dev[b] += charge
    return float(max(dev.max(), link.max()))


def _cuts(dag, place) -> int:
    return sum(1 for u, v, d in dag.graph.edges(data=True)
               if place[u] != place[v] and "RAW" in d["kinds"] and d["bytes"] > 0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("D,hop,exposure", [(2, 3e-4, 0.0), (2, 1e-4, 0.5), (3, 2e-4, 0.3)])
def test_throughput_matches_brute_force_with_hop_charge(seed, D, hop, exposure):
    dag = random_dag(7 if D == 2 else 6, seed)
    costs, tp = random_costs(dag, D, seed), charged_topo(D, hop, exposure)
    best = min(ref_cycle_hop(dag, costs, tp, pl) for pl in all_placements(dag, D))
    p = plan(dag, costs, tp, policy="throughput", cache_dir=False, micro_batches=2)
    assert p.predicted_seconds == pytest.approx(ref_cycle_hop(dag, costs, tp, p.placement), rel=1e-9)
    assert p.predicted_seconds == pytest.approx(best, rel=1e-4)
    assert p.lower_bound_seconds <= best * (1 + 1e-6)


def test_hop_charge_changes_the_optimum():
    """Over random DAGs, the optimum with the charge has fewer cuts than the free-hop optimum wherever they differ,
    and the charge makes a difference on some of them (brute force on both sides)."""
    changed = 0
    for seed in range(8):
        dag = random_dag(7, seed)
        costs = random_costs(dag, 2, seed)
        free, charged = charged_topo(2, 0.0), charged_topo(2, 4e-4)
        p0 = plan(dag, costs, free, cache_dir=False)
        p1 = plan(dag, costs, charged, cache_dir=False)
        places = list(all_placements(dag, 2))
        best0 = min(ref_cycle_hop(dag, costs, free, pl) for pl in places)
        best1 = min(ref_cycle_hop(dag, costs, charged, pl) for pl in places)
        assert p0.predicted_seconds == pytest.approx(best0, rel=1e-4)
        assert p1.predicted_seconds == pytest.approx(best1, rel=1e-4)
        assert _cuts(dag, p1.placement) <= _cuts(dag, p0.placement)
        if p1.placement != p0.placement:
            changed += 1
            # the free-hop plan scored under the charge is no better than the charged optimum
            assert ref_cycle_hop(dag, costs, charged, p0.placement) >= best1 * (1 - 1e-9)
    assert changed >= 2


def test_hand_worked_chain():
    """k0 -> k1, each 4x faster on a different device. Free hops: split them (cycle 1 ms + the link's share).
    A 5 ms per-hop charge on both devices (one micro-batch): split = 1 + 5 = 6 ms > 5 ms on one device."""
    dag = random_dag(2, 0, chain=True)
    costs = CostTable(("d0", "d1"), (0, 1), np.array([[1e-3, 4e-3], [4e-3, 1e-3]]))
    fast = dict(bw=1e12, lat=0.0)
    p0 = plan(dag, costs, charged_topo(2, 0.0, **fast), cache_dir=False, micro_batches=1)
    assert p0.placement == {0: 0, 1: 1} and p0.predicted_seconds == pytest.approx(1e-3, rel=1e-3)
    p1 = plan(dag, costs, charged_topo(2, 5e-3, **fast), cache_dir=False, micro_batches=1)
    assert len(set(p1.placement.values())) == 1 and p1.predicted_seconds == pytest.approx(5e-3, rel=1e-6)
    assert p1.cut_edges == ()
    # the split plan, scored by the same model, is charged 5 ms on each device
    split = plan(dag, costs, charged_topo(2, 5e-3, **fast), cache_dir=False, micro_batches=1,
                 pins={0: 0, 1: 1})
    assert split.device_seconds == pytest.approx((6e-3, 6e-3), rel=1e-6)


def test_charge_is_in_the_cache_key(tmp_path):
    dag = random_dag(6, 1)
    costs = random_costs(dag, 2, 1)
    wl = as_workload(dag, costs)
    keys = {}
    for name, tp in (("free", charged_topo(2, 0.0)), ("hop", charged_topo(2, 1e-4)), ("hop2", charged_topo(2, 2e-4)),
                     ("expose", charged_topo(2, 0.0, 0.5))):
        keys[name] = plan_key(compile_problem(wl, tp, micro_batches=2), "throughput", {})
    assert len(set(keys.values())) == 4
    assert plan_key(compile_problem(wl, charged_topo(2, 1e-4), micro_batches=2), "throughput", {}) == keys["hop"]
    # through plan(): a plan cached without the charge is not returned for a topology with it
    a = plan(dag, costs, charged_topo(2, 0.0), cache_dir=tmp_path)
    b = plan(dag, costs, charged_topo(2, 4e-4), cache_dir=tmp_path)
    c = plan(dag, costs, charged_topo(2, 4e-4), cache_dir=tmp_path)
    assert not a.solver.method.startswith("cache:") and not b.solver.method.startswith("cache:")
    assert c.solver.method.startswith("cache:") and c.placements == b.placements
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_throughput_plan_never_behind_a_baseline_under_the_charge():
    """On a 4-layer transformer (prefill + decode), with charges large enough that splitting rarely pays, the
    throughput plan's cycle (scored by the corrected model) is no worse than any baseline's scored by the same model,
    and every plan's prediction equals the evaluator's cycle of its placement."""
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    devs = ("big", "small")
    pre = transformer_dag(layers=4, tokens=256, context=1024, rope_tables=True)
    dec = transformer_dag(layers=4, tokens=16, context=1024, rope_tables=True)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 8.0)
    for hop, exposure in ((0.0, 0.0), (50e-6, 0.6), (500e-6, 1.0)):
        tp = replace(nvlink_topology(devs), hop_overhead=np.full((2, 2), hop), copy_exposure=np.full((2, 2), exposure))
        pb = compile_problem(wl, tp, micro_batches=2)
        t = plan(wl, None, tp, cache_dir=False)
        assert t.cycle_seconds == pytest.approx(cycle_seconds(pb, _flat(pb, t)), rel=1e-12)
        for name in ("homo-L", "homo-R", "layer", "af", "pd"):
            b = plan(wl, None, tp, policy=name, cache_dir=False)
            assert b.cycle_seconds == pytest.approx(cycle_seconds(pb, _flat(pb, b)), rel=1e-12)
            assert t.cycle_seconds <= b.cycle_seconds * (1 + 1e-9), (hop, name)


def _flat(pb, p) -> np.ndarray:
    """A plan's placements as the problem's flat kernel placement."""
    out = np.zeros(pb.n, dtype=np.int64)
    for i, (prog, launch) in enumerate(zip(pb.prog.tolist(), pb.launch.tolist())):
        out[i] = p.placements[pb.programs[prog]][launch]
    return out


def test_topology_figures():
    from torch_tessera.target.links import HOP_FIGURES, build_topology

    h200 = build_topology(["sim:h200", "sim:h200"])
    assert h200.hop_overhead[0, 1] == pytest.approx(52e-6) and h200.copy_exposure[0, 1] == pytest.approx(0.6)
    assert h200.hop_overhead[0, 0] == 0.0
    assert "bench/fit_hop_overhead.py" in h200.overhead_source and "2026-11-29" in h200.overhead_source
    from torch_tessera.target.devices import parse_devices

    parts = build_topology(parse_devices("cuda:0@104sm,cuda:0@24sm", assume_gpu="h200"))  # measured, not carried over
    assert parts.hop_overhead[0, 1] == pytest.approx(8e-6) and parts.copy_exposure[0, 1] == 0.0
    assert "SM partitions of one H200" in parts.overhead_source and "measured" in parts.overhead_source
    pair = build_topology(["sim:a100", "sim:l40s"])
    assert pair.hop_overhead[0, 1] == HOP_FIGURES["other-gpu"].overhead_s
    assert "not measured on this pair" in pair.overhead_source
    cpu = build_topology(["cpu:0", "cpu:1"])
    assert not cpu.hop_overhead.any() and not cpu.copy_exposure.any()
    assert not h200.free_transfers().hop_overhead.any()
    assert not h200.without_overheads().copy_exposure.any()
    with pytest.raises(ValueError, match="hop_overhead"):
        Topology.uniform(["a", "b"], 1e9, 1e-5, hop_overhead=-1e-6)


def test_state_hand_overs_are_not_charged_on_devices():
    """``pd`` cuts only the KV cache hand-over between its programs: the per-hop charge (fitted on cut edges inside a
    program's run) leaves its device loads at their compute; the link still carries the hand-over."""
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    devs = ("big", "small")
    pre = transformer_dag(layers=2, tokens=256, context=1024)
    dec = transformer_dag(layers=2, tokens=16, context=1024)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 8.0)
    free = nvlink_topology(devs)
    charged = replace(free, hop_overhead=np.full((2, 2), 1e-3), copy_exposure=np.full((2, 2), 1.0))
    a = plan(wl, None, free, policy="pd", cache_dir=False)
    b = plan(wl, None, charged, policy="pd", cache_dir=False)
    assert {e.kind for e in b.cut_edges} == {"STATE"}
    assert b.device_seconds == a.device_seconds and b.link_seconds == a.link_seconds


def test_measured_bench_plans_with_the_charge_and_one_micro_batch():
    """``tessera bench --measure`` plans every plan with the topology's charge, one micro-batch (each call pays each
    cut once, as fitted), and tessera is never behind a placement baseline under that model."""
    from torch_tessera.measure.execute import PLAN_MICRO_BATCHES, make_plans
    from torch_tessera.target.links import build_topology
    from torch_tessera.scheduler import Plan, Workload
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    h200 = build_topology(["sim:h200", "sim:h200@24sm"])  # the H200 pair's figures on the synthetic devices
    devs = ("big", "small")
    topo = replace(nvlink_topology(devs), hop_overhead=h200.hop_overhead, copy_exposure=h200.copy_exposure)
    assert topo.hop_overhead[0, 1] > 0
    pre = transformer_dag(layers=4, tokens=256, context=1024, rope_tables=True)
    dec = transformer_dag(layers=4, tokens=16, context=1024, rope_tables=True)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 8.0)
    plans, bound, choice = make_plans(wl, topo, 2, in_flight=4)
    assert PLAN_MICRO_BATCHES == 1
    t = plans["tessera"]
    assert set(choice.scores) == {"tessera", "streams"} | {n for n, p in plans.items() if isinstance(p, Plan)
                                                            and n not in ("tessera", "tessera-single")}
    for name, p in plans.items():
        if isinstance(p, Plan):
            assert p.micro_batches == 1
            if name != "tessera":  # cycle + fill/drain: what tessera is chosen by, request-dist's streams included
                assert (t.cycle_seconds + fill_drain_seconds(t, wl, 4)
                        <= (p.cycle_seconds + fill_drain_seconds(p, wl, 4)) * (1 + 1e-9)), name
    assert bound <= t.cycle_seconds


def _two_program_workload():
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.synthetic import roofline_costs, transformer_dag

    devs = ("big", "small")
    pre = transformer_dag(layers=2, tokens=64, context=256)
    dec = transformer_dag(layers=2, tokens=8, context=256)
    return Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 4.0), devs


def test_fill_drain_seconds_by_hand():
    """``sum_p f_p x (sum_d L_pd - max_d L_pd) / M``: the smaller device's share of each spanning program's call."""
    wl, devs = _two_program_workload()
    topo = nvlink_topology(devs)
    home = plan(wl, None, topo, policy="homo-L", cache_dir=False)
    assert fill_drain_seconds(home, wl, 1) == 0.0  # nothing spans devices
    alternate = {p: {i: i % 2 for i in pl} for p, pl in home.placements.items()}
    split = replace(home, placements=alternate)
    want = 0.0
    for prog in wl.programs:
        per = np.zeros(2)
        for i, d in alternate[prog.name].items():
            per[d] += prog.costs.row(i)[d]
        want += prog.frequency * per.min()
    assert fill_drain_seconds(split, wl, 1) == pytest.approx(want)
    assert fill_drain_seconds(split, wl, 4) == pytest.approx(want / 4)
    with pytest.raises(ValueError, match="in_flight"):
        fill_drain_seconds(split, wl, 0)


def test_tessera_takes_a_baselines_placement_only_when_fill_and_drain_make_it_better():
    from torch_tessera.benchmark import SINGLE, choose_tessera
    from torch_tessera.measure.execute import step_score

    def prefer_fill_drain(plans, wl, in_flight):  # the measured bench's rule over single placements
        c = choose_tessera(plans, wl, streams=False, score=lambda p: step_score(p, wl, in_flight))
        return c.plans, c.note

    wl, devs = _two_program_workload()
    topo = nvlink_topology(devs)
    home = plan(wl, None, topo, policy="homo-L", cache_dir=False)
    alternate = {p: {i: i % 2 for i in pl} for p, pl in home.placements.items()}
    # a ping-pong placement the cycle model scores 10 % below homo-L
    pingpong = replace(home, policy="throughput", placements=alternate, cycle_seconds=0.9 * home.cycle_seconds)
    plans = {"tessera": pingpong, "homo-L": home, "request-dist": ValueError("n/a")}
    chosen, note = prefer_fill_drain(plans, wl, in_flight=1)
    assert chosen["tessera"].placements == home.placements and chosen["tessera"].policy == "throughput"
    assert note.startswith("tessera = homo-L's placement") and note in chosen["tessera"].solver.notes
    assert chosen["homo-L"] is home and chosen[SINGLE] is pingpong
    # with enough calls in flight the fill and drain are small: the planner's placement stays
    big_m = max(1, int(100 * fill_drain_seconds(pingpong, wl, 1) / (0.1 * home.cycle_seconds)))
    kept, note = prefer_fill_drain(plans, wl, in_flight=big_m)
    assert kept["tessera"] is pingpong and note.startswith("tessera = the planner's single placement")
    assert SINGLE not in kept


def _ref_latency_hop(dag, costs: CostTable, tp: Topology, place: dict[int, int]) -> float:
    """One run list-scheduled in program order (written from the documented model): a cut edge's copy starts when
    its producer ends and its link is free and takes latency + per-hop charge + bytes / bandwidth."""
    D = len(tp.devices)
    free, link_free, fin = [0.0] * D, np.zeros((D, D)), {}
    for k in sorted(dag.graph.nodes):
        d, ready = place[k], 0.0
        for u in sorted(dag.graph.predecessors(k)):
            ed, t = dag.graph.edges[u, k], fin[u]
            if place[u] != d and "RAW" in ed["kinds"] and ed["bytes"] > 0:
                a = place[u]
                t = (max(t, link_free[a, d]) + tp.latency[a, d] + tp.hop_overhead[a, d]
                     + ed["bytes"] / tp.bandwidth[a, d])
                link_free[a, d] = t
            ready = max(ready, t)
        fin[k] = max(ready, free[d]) + costs.row(k)[d]
        free[d] = fin[k]
    return max(fin.values())


@pytest.mark.parametrize("seed", range(4))
def test_latency_policy_charges_each_hop_and_matches_brute_force(seed, monkeypatch):
    """The latency policy pays the per-hop charge on a request's critical path (measured 2026-11-30 on two H200s: a
    latency plan with 103-111 cut edges, made without it, served each token 1.6x slower than everything on GPU 0)."""
    dag = random_dag(8, seed, chain=True)
    costs = random_costs(dag, 2, seed)
    tp = charged_topo(2, hop=3e-4, bw=1e9)
    from torch_tessera.scheduler import solve

    best = min(_ref_latency_hop(dag, costs, tp, pl) for pl in all_placements(dag, 2))
    shed = plan(dag, costs, tp, policy="latency", cache_dir=False)  # default: cuts shed within the tolerance
    assert shed.predicted_seconds == pytest.approx(_ref_latency_hop(dag, costs, tp, shed.placement), rel=1e-9)
    assert shed.predicted_seconds <= best * (1 + solve.LATENCY_CUT_TOLERANCE) * (1 + 1e-9)
    monkeypatch.setattr(solve, "LATENCY_CUT_TOLERANCE", 0.0)  # the exact optimum
    p = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert p.predicted_seconds == pytest.approx(_ref_latency_hop(dag, costs, tp, p.placement), rel=1e-9)
    assert p.predicted_seconds == pytest.approx(best, rel=1e-9)
    assert _cuts(dag, shed.placement) <= _cuts(dag, p.placement)
    free = plan(dag, costs, replace(tp, hop_overhead=np.zeros((2, 2))), policy="latency", cache_dir=False)
    assert _cuts(dag, p.placement) <= _cuts(dag, free.placement)

def _charged_llm(D: int, layers: int = 8):
    """Prefill + decode of a transformer (the LP's tied classes), devices of different speeds, with the H200 figures
    of the per-hop charge on every pair."""
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    devs = ("big", "small", "mid")[:D]
    pre = transformer_dag(layers=layers, tokens=256, context=1024)
    dec = transformer_dag(layers=layers, tokens=1, context=1024)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 16.0)
    tp = replace(nvlink_topology(devs), hop_overhead=np.full((D, D), 52e-6), copy_exposure=np.full((D, D), 0.6))
    return wl, tp


@pytest.mark.parametrize("D", [2, 3])
def test_layer_split_candidates_keep_whole_layers_and_beat_whole_programs(D):
    """counts.layer_split: every layer of a program wholly on one device (groups outside layers as in the base), and
    its best candidate no slower than any assignment of whole programs to devices (which it seeds)."""
    import itertools

    from torch_tessera.scheduler.blocks import aggregate, block_cycle, tie_layers
    from torch_tessera.scheduler.counts import layer_split, solve_counts, tied_classes

    wl, tp = _charged_llm(D)
    pb = compile_problem(wl, tp, micro_batches=2)
    assert pb.charges_devices
    groups = aggregate(pb, pb.group)
    label, tied = tie_layers(pb)
    assert tied
    cls = tied_classes(pb, groups, label)
    _, frac = solve_counts(pb, cls, groups.forbidden, 30.0, relax=True, presolve=False)
    base = np.zeros(groups.B, dtype=np.int64)
    got = layer_split(pb, groups, cls, frac, base)
    assert 1 <= len(got) <= 2
    gprog = np.zeros(groups.B, dtype=np.int64)
    gprog[pb.group] = pb.prog
    for gp in got:
        for p in range(len(pb.programs)):
            for u in np.unique(cls.unit[(gprog == p) & (cls.unit >= 0)]):
                assert len(set(gp[(gprog == p) & (cls.unit == u)].tolist())) == 1
        assert (gp[cls.unit < 0] == base[cls.unit < 0]).all()
    vals = [block_cycle(groups, gp) for gp in got]
    assert vals == sorted(vals)
    whole = []
    for devs in itertools.product(range(D), repeat=len(pb.programs)):
        gp = base.copy()
        for p, g in enumerate(devs):
            gp[(gprog == p) & (cls.unit >= 0)] = g
        whole.append(block_cycle(groups, gp))
    assert vals[0] <= min(whole) * (1 + 1e-12)


def test_layer_split_only_with_the_charge_and_never_worse(monkeypatch):
    """The split candidates are tried only when cut edges charge devices (no-charge plans are unchanged), and a plan
    with them is never slower than without them."""
    import torch_tessera.scheduler.solve as solve

    calls = []
    real = solve.layer_split

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(len(out))
        return out

    monkeypatch.setattr(solve, "layer_split", counting)
    wl, tp = _charged_llm(2)
    plain = plan(wl, None, tp.without_overheads(), cache_dir=False)
    assert calls == []
    with_split = plan(wl, None, tp, cache_dir=False)
    assert calls and calls[0] >= 1
    monkeypatch.setattr(solve, "layer_split", lambda *a, **k: [])
    without = plan(wl, None, tp, cache_dir=False)
    assert with_split.predicted_seconds <= without.predicted_seconds * (1 + 1e-12)
    assert plain.predicted_seconds < with_split.predicted_seconds  # the charge costs something


def test_layer_split_returns_only_splits_that_fit_memory():
    """With budgets that hold about 60 % of the resident bytes each, no device can take everything: every split
    returned fits, and the plan made with them fits too."""
    from torch_tessera.scheduler.blocks import aggregate, block_memory_ok, tie_layers
    from torch_tessera.scheduler.counts import layer_split, solve_counts, tied_classes

    wl, tp = _charged_llm(2)
    total = sum(r.nbytes for r in compile_problem(wl, tp, micro_batches=2).resident)
    budgets = [int(0.6 * total)] * 2
    pb = compile_problem(wl, tp, micro_batches=2, memory_budgets=budgets)
    groups = aggregate(pb, pb.group)
    label, _ = tie_layers(pb)
    cls = tied_classes(pb, groups, label)
    _, frac = solve_counts(pb, cls, groups.forbidden, 30.0, relax=True, presolve=False)
    base = np.zeros(groups.B, dtype=np.int64)  # everything on device 0 outside the layers
    got = layer_split(pb, groups, cls, frac, base)
    assert got and all(block_memory_ok(pb, groups, gp) for gp in got)
    p = plan(wl, None, tp, cache_dir=False, memory_budgets=budgets)
    assert all(m <= b for m, b in zip(p.memory_bytes, budgets))


def _fork_join(branch_ms: float):
    """``a -> {b, c} -> d``: 10 ms kernels at the ends, two independent ``branch_ms`` kernels between, same cost on
    both devices; running ``c`` on the other device overlaps it with ``b`` at the price of two hops."""
    from conftest import MB
    from torch_tessera.lowering.program import BufferKind
    from torch_tessera.scheduler.synthetic import SynthKernel, _buf, dag_from_kernels

    buffers: dict = {}
    t = {n: _buf(buffers, f"t_{n}", BufferKind.TEMP, 4000) for n in "abcd"}
    w = {n: _buf(buffers, f"w_{n}", BufferKind.PARAMETER, MB) for n in "abcd"}
    ks = [SynthKernel("a", "gemm", [w["a"]], [t["a"]], 0.0),
          SynthKernel("b", "gemm", [t["a"], w["b"]], [t["b"]], 0.0),
          SynthKernel("c", "gemm", [t["a"], w["c"]], [t["c"]], 0.0),
          SynthKernel("d", "gemm", [t["b"], t["c"], w["d"]], [t["d"]], 0.0)]
    dag = dag_from_kernels(ks, buffers)
    ms = {"a": 10.0, "b": branch_ms, "c": branch_ms, "d": 10.0}
    nodes = sorted(dag.graph.nodes)
    names = {k: dag.node(k).name for k in nodes}
    cost = np.array([[ms[names[k]] * 1e-3] * 2 for k in nodes])
    return dag, CostTable(("d0", "d1"), tuple(nodes), cost)


@pytest.mark.parametrize("branch_ms,kept", [(1.0, False), (4.0, True)])
def test_latency_plan_keeps_cuts_only_for_a_gain_above_the_tolerance(branch_ms, kept):
    """Shedding (``solve.shed_latency_cuts``): with 0.2 ms per hop, overlapping two 1 ms branches on two devices
    saves 0.6 of 22 ms (2.7 %, under ``LATENCY_CUT_TOLERANCE``): the plan keeps no cut and says so; two 4 ms
    branches save 3.6 of 28 ms (13 %): the cuts stay. Checked against brute force over all 16 placements."""
    from torch_tessera.scheduler.solve import LATENCY_CUT_TOLERANCE

    dag, costs = _fork_join(branch_ms)
    tp = charged_topo(2, hop=2e-4, bw=1e9, lat=1e-6)
    scored = [(_ref_latency_hop(dag, costs, tp, pl), _cuts(dag, pl)) for pl in all_placements(dag, 2)]
    best = min(s for s, _ in scored)
    homo = (2 * 10.0 + 2 * branch_ms) * 1e-3
    assert (best < homo / (1 + LATENCY_CUT_TOLERANCE)) == kept  # the case is what its name says
    p = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert p.predicted_seconds == pytest.approx(_ref_latency_hop(dag, costs, tp, p.placement), rel=1e-9)
    assert p.predicted_seconds <= best * (1 + LATENCY_CUT_TOLERANCE) * (1 + 1e-9)
    if kept:
        assert _cuts(dag, p.placement) > 0
        assert p.predicted_seconds == pytest.approx(best, rel=1e-9)
    else:
        assert _cuts(dag, p.placement) == 0
        assert p.predicted_seconds == pytest.approx(homo, rel=1e-9)
        assert any("cut edges" in n and "tolerance" in n for n in p.solver.notes)


def test_chain_latency_plan_sheds_a_small_gain():
    """The exact chain DP (``solve_latency``'s first path) goes through the same shedding: moving the middle of
    three 10 ms kernels (11 ms on the other device) to the other device, where it takes 9.5 ms, saves 0.5 ms minus two 20 us hops (1.5 %): no cut kept,
    method ``dp+shed``; with the tolerance at 0 the DP's 2-cut optimum comes back."""
    from conftest import MB
    from torch_tessera.lowering.program import BufferKind
    from torch_tessera.scheduler import solve
    from torch_tessera.scheduler.synthetic import SynthKernel, _buf, dag_from_kernels

    buffers: dict = {}
    t = [_buf(buffers, f"t{i}", BufferKind.TEMP, 4000) for i in range(3)]
    w = [_buf(buffers, f"w{i}", BufferKind.PARAMETER, MB) for i in range(3)]
    dag = dag_from_kernels([SynthKernel(f"k{i}", "gemm", ([t[i - 1]] if i else []) + [w[i]], [t[i]], 0.0)
                            for i in range(3)], buffers)
    nodes = sorted(dag.graph.nodes)
    costs = CostTable(("d0", "d1"), tuple(nodes), np.array([[10e-3, 11e-3], [10e-3, 9.5e-3], [10e-3, 11e-3]]))
    tp = charged_topo(2, hop=2e-5, bw=1e9, lat=1e-6)
    p = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert p.solver.method == "dp+shed" and _cuts(dag, p.placement) == 0
    assert p.predicted_seconds == pytest.approx(30e-3, rel=1e-9)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(solve, "LATENCY_CUT_TOLERANCE", 0.0)
        exact = plan(dag, costs, tp, policy="latency", cache_dir=False)
    assert exact.solver.method == "dp" and _cuts(dag, exact.placement) == 2
    assert exact.predicted_seconds < p.predicted_seconds


def test_fill_drain_choice_on_saved_runs():
    """The saved MMDiT run at 24 SMs (2026-11-30, two H200s): with the fill/drain term its planner's placement scores
    worse than homo-L's (homo-L measured faster), and the term brings the predictions of that run's spanning plans
    closer to the measured steps on average (``tessera report step-model``, docs/BENCHMARKS.md)."""
    from pathlib import Path

    from torch_tessera.measure.report import step_model as check

    root = Path(__file__).resolve().parents[2]
    recs = {r["plan"]: r for r in check.records([root / "docs/results/2026-11-30-s7/5/d24"])}
    own, home = recs["tessera"], recs["homo-L"]
    assert own["cycle"] < home["cycle"] and own["cycle"] + own["fill"] > home["cycle"] + home["fill"]
    assert home["fill"] == 0.0 and home["measured"] < own["measured"]
    spanning = [r for r in recs.values() if r["fill"] > 0]
    with_term = np.mean([abs(r["measured"] / (r["cycle"] + r["fill"]) - 1) for r in spanning])
    without = np.mean([abs(r["measured"] / r["cycle"] - 1) for r in spanning])
    assert len(spanning) >= 2 and with_term < without
