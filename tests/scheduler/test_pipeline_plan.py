"""Placements scored by the simulated pipelined schedule: the workload step, its lower bound, the planner's use."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from torch_tessera.errors import ConfigError
from torch_tessera.scheduler import Workload, WorkloadProgram, plan
from torch_tessera.scheduler.gantt import schedule_intervals, simulated_schedule, write_gantt
from torch_tessera.scheduler.modulo import build_pipelined_schedule, predicted_step
from torch_tessera.scheduler.pipeline_plan import (PipelineModel, program_simulations, simulated_seconds,
                                                   surrogate_topology)
from torch_tessera.scheduler.pipeline_schedule import check_schedule
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.simulate import simulate
from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag


def _problem(dag, devs=("big", "small")):
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    wl = as_workload(dag, costs)
    return wl, compile_problem(wl, tp, micro_batches=2), tp, costs


def test_domains_from_names():
    m = PipelineModel.from_names(["cuda:0@104sm", "cuda:0@24sm", "cuda:1", "cpu:0"])
    assert m.domains == (0, 0, 1, 2)


def test_one_program_is_its_simulated_step_per_micro_batch():
    dag = transformer_dag(2)
    wl, pb, tp, costs = _problem(dag)
    rng = np.random.default_rng(0)
    model = PipelineModel.from_names(tp.devices)
    for _ in range(3):
        place = rng.integers(0, 2, pb.n)
        placement = dict(zip(pb.launch.tolist(), place.tolist()))
        s = build_pipelined_schedule(dag, placement, 2, costs=costs, topology=tp)
        check_schedule(s, dag)
        r = simulate(s, costs, tp)
        assert simulated_seconds(pb, wl, place, tp, model, 2, exact=True) == pytest.approx(r.step_seconds / 2)
        # no simulated step is below the busiest device's load (what the planner prunes candidates with)
        load = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=2)
        assert r.step_seconds / 2 >= load.max() * (1 - 1e-12)


def test_programs_on_their_own_devices_add_like_the_cycle_model():
    a, b = transformer_dag(1), transformer_dag(1)
    devs = ("big", "small")
    wl = Workload((WorkloadProgram("a", a, roofline_costs(a, devs), 1.0, stream=0),
                   WorkloadProgram("b", b, roofline_costs(b, devs), 2.0, stream=1)))
    tp = nvlink_topology(devs)
    pb = compile_problem(wl, tp, micro_batches=2)
    place = np.asarray(pb.prog, dtype=np.int64)  # program a on device 0, b on device 1
    load = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=2)
    assert simulated_seconds(pb, wl, place, tp, PipelineModel.from_names(devs), 2) == pytest.approx(load.max())


def test_surrogate_charges_one_wait_per_cut():
    tp = nvlink_topology(("cuda:0@104sm", "cuda:0@24sm"))
    st = surrogate_topology(tp, PipelineModel.from_names(tp.devices, wait_seconds=3e-6))
    assert st.hop_overhead[0, 1] == 3e-6 and st.hop_overhead[0, 0] == 0.0
    assert (st.copy_exposure == 0).all()  # one memory domain: no bytes move


def test_plan_scores_and_rejects_unknown_score():
    dag = layered_dag(40, width=4, seed=2)
    devs = ("big", "small")
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    p = plan(dag, costs, tp, cache_dir=False)
    old = plan(dag, costs, tp, cache_dir=False, score="cycle")
    assert p.simulated_seconds is not None and old.simulated_seconds is None
    wl, pb, _, _ = _problem(dag)
    place = np.array([p.placement[k] for k in pb.launch.tolist()])
    assert p.simulated_seconds == pytest.approx(simulated_seconds(pb, wl, place, tp, PipelineModel.from_names(devs),
                                                                  p.micro_batches, exact=True))
    with pytest.raises(ConfigError, match="score"):
        plan(dag, costs, tp, score="flat")


def test_gantt_draws_the_simulated_schedule(tmp_path):
    dag = transformer_dag(2)
    devs = ("big", "small")
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    p = plan(dag, costs, tp, policy="af", cache_dir=False)
    sim = simulated_schedule(p, dag, costs, tp)
    ivs = schedule_intervals(sim, p.devices)
    runs = [iv for iv in ivs if iv.lane in devs]
    assert len(runs) == dag.num_kernels * p.micro_batches
    assert {iv.micro_batch for iv in runs} == set(range(p.micro_batches))
    assert max(iv.end for iv in ivs) == pytest.approx(sim.result.step_seconds)
    out = write_gantt(p, dag, costs, tp, tmp_path / "g.png")
    assert out.stat().st_size > 1000


def test_list_schedule_surrogate_against_the_simulator():
    """The cheap surrogate the planner compares candidates with: 0-14 % below the simulated step, never above."""
    ratios = []
    for dag in (transformer_dag(2), transformer_dag(8), layered_dag(60, width=3, seed=2)):
        costs, tp = roofline_costs(dag, ("big", "small")), nvlink_topology(("big", "small"))
        rng = np.random.default_rng(0)
        nodes = sorted(dag.graph.nodes)
        for k in range(10):
            cut = int(rng.integers(1, len(nodes)))
            place = (dict(zip(nodes, rng.integers(0, 2, len(nodes)).tolist())) if k < 5
                     else {n: int(n >= cut) for n in nodes})
            for domains, M in itertools.product([(0, 1), (0, 0)], (1, 2, 3)):
                s = build_pipelined_schedule(dag, place, M, costs=costs, topology=tp, domains=domains)
                step, occupied = predicted_step(dag, place, M, costs=costs, topology=tp, domains=domains)
                ratios.append(step / simulate(s, costs, tp).step_seconds)
                assert max(occupied) <= step * (1 + 1e-12)
    assert 0.85 <= min(ratios) and max(ratios) <= 1 + 1e-9 and np.median(ratios) > 0.97
