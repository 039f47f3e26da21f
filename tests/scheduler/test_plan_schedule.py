"""A plan carries the schedule its simulator scored: simulating it again gives the plan's simulated step, it
round-trips through JSON and the plan cache, and its consumers (Gantt, dist-run) take it instead of rebuilding."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from torch_tessera.scheduler import Plan, Workload, WorkloadProgram, plan, plan_streams
from torch_tessera.scheduler import pipeline_plan
from torch_tessera.scheduler.gantt import simulated_schedule, write_gantt
from torch_tessera.scheduler.modulo import build_pipelined_schedule, serial_schedule
from torch_tessera.scheduler.pipeline_plan import PipelineModel, device_share
from torch_tessera.scheduler.pipeline_schedule import (RunStep, WaitStep, check_schedule, schedule_from_data,
                                                       schedule_to_data)
from torch_tessera.scheduler.problem import compile_problem
from torch_tessera.scheduler.simulate import simulate
from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag

DEVS = ("big", "small")


def _case(layers=3):
    dag = transformer_dag(layers=layers, tokens=256, context=2048)
    return dag, roofline_costs(dag, DEVS), nvlink_topology(DEVS)


def _resimulated(p: Plan, wl: Workload, tp, model: PipelineModel) -> float:
    """The plan's simulated step from its own schedules: each program's schedule simulated again, its device share
    weighted by its frequency (the formula of pipeline_plan.simulated_seconds, written here from its docstring)."""
    pb = compile_problem(wl, tp, micro_batches=p.micro_batches)
    T = np.zeros(len(p.devices))
    for k, (name, s) in enumerate(p.schedules):
        assert name == wl.programs[k].name and s.micro_batches == p.micro_batches
        check_schedule(s, wl.programs[k].dag)
        sim = pipeline_plan.simulate_program(pb, k, wl.programs[k], s, tp, model)
        T += p.frequencies[name] * device_share(sim)
    return float(T.max())


@pytest.mark.parametrize("policy", ["throughput", "af", "layer", "homo-L", "homo-R", "latency"])
def test_simulating_the_plans_schedule_gives_its_simulated_step(policy):
    dag, costs, tp = _case()
    p = plan(dag, costs, tp, policy=policy, cache_dir=False)
    s = p.schedule_of()
    assert s is not None and s.micro_batches == p.micro_batches and s.placement == dict(p.placement)
    check_schedule(s, dag)
    r = simulate(s, costs, tp)
    assert r.step_seconds / p.micro_batches == pytest.approx(p.simulated_seconds, rel=1e-12)
    if len(set(p.placement.values())) > 1:
        assert s.num_waits > 0
    else:  # a program wholly on one device: its launches back to back, as the list scheduler would issue them
        assert s == build_pipelined_schedule(dag, p.placement, p.micro_batches, costs=costs, topology=tp, devices=2)


def test_a_workloads_schedules_give_its_simulated_step():
    a, b = transformer_dag(2), transformer_dag(1)
    wl = Workload((WorkloadProgram("prefill", a, roofline_costs(a, DEVS), 1.0, "prefill"),
                   WorkloadProgram("decode", b, roofline_costs(b, DEVS), 3.0, "decode")))
    tp = nvlink_topology(DEVS)
    model = PipelineModel.from_names(DEVS)
    for policy in ("throughput", "pd", "af"):
        p = plan(wl, None, tp, policy=policy, cache_dir=False)
        assert [name for name, _ in p.schedules] == ["prefill", "decode"]
        assert _resimulated(p, wl, tp, model) == pytest.approx(p.simulated_seconds, rel=1e-12)


def test_the_schedule_is_the_one_the_plan_scored_at_its_micro_batch_count():
    """Plans of more micro-batches (the planner's choice above 2) carry the schedule of that count."""
    seen = set()
    for seed in range(6):
        dag = layered_dag(60, width=4, seed=seed)
        costs, tp = roofline_costs(dag, DEVS, noise=0.3), nvlink_topology(DEVS)
        p = plan(dag, costs, tp, cache_dir=False)
        s = p.schedule_of()
        assert s.micro_batches == p.micro_batches
        assert simulate(s, costs, tp).step_seconds / p.micro_batches == pytest.approx(p.simulated_seconds, rel=1e-12)
        seen.add(p.micro_batches)
    assert max(seen) > 2, f"no plan took more micro-batches than planned ({seen}): the test covers nothing"


def test_plans_without_a_simulated_step_carry_no_schedule():
    dag, costs, tp = _case()
    assert plan(dag, costs, tp, cache_dir=False, score="cycle").schedules == ()
    rd = plan(dag, costs, tp, policy="request-dist", cache_dir=False)
    assert rd.replicas and rd.simulated_seconds is None and rd.schedules == () and rd.schedule_of() is None
    two = plan_streams(Workload.single(dag, costs), tp, policy="request-dist")
    assert len(two.schedules) == 2 and two.simulated_seconds is not None
    with pytest.raises(ValueError, match="schedule_of"):
        two.schedule_of()
    with pytest.raises(ValueError, match="not one of"):
        two.schedule_of("nope")


def test_serial_schedule_is_the_list_schedulers_for_one_device():
    dag = layered_dag(30, width=3, seed=1)
    costs = roofline_costs(dag, DEVS)
    for device in (0, 1):
        placement = {n: device for n in dag.graph.nodes}
        for m in (1, 3):
            assert serial_schedule(list(dag.graph.nodes), device, m, 2) == build_pipelined_schedule(
                dag, placement, m, costs=costs, devices=2)


def test_schedule_data_round_trip_keeps_every_step():
    dag, costs, tp = _case()
    p = plan(dag, costs, tp, policy="af", cache_dir=False, micro_batches=3)
    s = p.schedule_of()
    back = schedule_from_data(json.loads(json.dumps(schedule_to_data(s))))
    assert back == s and back.streams == s.streams
    assert {type(x) for x in back.steps()} == {type(x) for x in s.steps()} >= {RunStep, WaitStep}
    for bad in (["X", 0, 0, 0], ["T", 0, 1, 0, None, []], ["W", 0, 0, 1], ["R", 0, 0]):
        with pytest.raises(ValueError, match="not a step"):
            schedule_from_data({**schedule_to_data(s), "streams": [[bad]]})


def test_plan_json_writes_every_field_as_before():
    """``Plan.to_json`` (fields one level deep) writes what ``dataclasses.asdict`` of the plan wrote, plus the
    schedules."""
    from dataclasses import asdict, replace

    dag, costs, tp = _case()
    for p in (plan(dag, costs, tp, policy="af", cache_dir=False), plan(dag, costs, tp, cache_dir=False)):
        old = asdict(replace(p, schedules=()))
        old["placements"] = {q: {str(k): v for k, v in pl.items()} for q, pl in p.placements.items()}
        new = json.loads(p.to_json())
        assert [name for name, _ in new.pop("schedules")] == [name for name, _ in p.schedules]
        del old["schedules"]
        assert new == json.loads(json.dumps(old)) and list(new) == list(old)
        assert p.cut_edges and Plan.from_json(p.to_json()) == p


def test_plan_cache_round_trip_and_a_file_without_schedules_is_a_miss(tmp_path, caplog):
    dag, costs, tp = _case()
    first = plan(dag, costs, tp, cache_dir=tmp_path)
    assert first.schedules and not first.solver.method.startswith("cache")
    hit = plan(dag, costs, tp, cache_dir=tmp_path)
    assert hit.solver.method.startswith("cache:")
    assert hit.schedules == first.schedules and hit.simulated_seconds == first.simulated_seconds
    assert simulate(hit.schedule_of(), costs, tp).step_seconds / hit.micro_batches == pytest.approx(
        hit.simulated_seconds, rel=1e-12)
    # a file written before plans carried schedules: same key, no "schedules" field
    (path,) = tmp_path.glob("*.json")
    data = json.loads(path.read_text())
    old = json.loads(data["plan"])
    del old["schedules"]
    data["plan"] = json.dumps(old)
    path.write_text(json.dumps(data))
    assert Plan.from_json(data["plan"]).schedules == ()  # it still reads (dumps of older plans)
    with caplog.at_level(logging.INFO, logger="torch_tessera.scheduler.cache"):
        again = plan(dag, costs, tp, cache_dir=tmp_path)
    assert not again.solver.method.startswith("cache") and "predates" in caplog.text
    assert again.schedules == first.schedules
    assert '"schedules":' in json.loads(path.read_text())["plan"]  # written again, with them
    assert plan(dag, costs, tp, cache_dir=tmp_path).solver.method.startswith("cache:")


def test_gantt_and_consumers_take_the_plans_own_schedule(tmp_path, monkeypatch, caplog):
    dag, costs, tp = _case()
    p = plan(dag, costs, tp, policy="af", cache_dir=False)

    def no_rebuild(*a, **k):
        raise AssertionError("the schedule was built again")

    monkeypatch.setattr(pipeline_plan, "build_pipelined_schedule", no_rebuild)
    sim = simulated_schedule(p, dag, costs, tp)
    assert sim.schedule is p.schedule_of()
    assert sim.result.step_seconds / p.micro_batches == pytest.approx(p.simulated_seconds, rel=1e-12)
    assert write_gantt(p, dag, costs, tp, tmp_path / "g.png").stat().st_size > 1000
    monkeypatch.undo()
    # a plan without its schedule (read from an older file): built again, logged, the same schedule
    bare = Plan.from_json(json.dumps({k: v for k, v in json.loads(p.to_json()).items() if k != "schedules"}))
    with caplog.at_level(logging.INFO, logger="torch_tessera.scheduler.gantt"):
        again = simulated_schedule(bare, dag, costs, tp)
    assert "carries no schedule" in caplog.text and again.schedule == p.schedule_of()
