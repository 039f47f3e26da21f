"""The simulator's graph overlap (a replay captured as one CUDA graph, launch costs timed between CUDA events): a
hand-computed case, an independent fixpoint reference, where the term is off, and the offline re-simulation record."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import fixpoint_step, random_schedules
from torch_tessera.errors import ConfigError
from torch_tessera.scheduler.issue import GraphIssue, HostIssue
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, RunStep, TransferStep, WaitStep
from torch_tessera.scheduler.simrecord import (costs_to_json, links_to_json, memory_to_json, resimulate,
                                               schedule_from_json, schedule_to_json)
from torch_tessera.scheduler.simulate import MemoryShare, simulate, step_durations
from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag

US = 1e-6


def _hand_schedule() -> tuple[PipelinedSchedule, np.ndarray]:
    """Device 0: launches 0 (10 us), 1 (5 us), a record, 2 (1 us); device 1 waits for the record, then launches 3
    (4 us) and 4 (3 us)."""
    s0 = (RunStep(0, 0, 0), RunStep(0, 0, 1), RecordStep(0, 0, 7), RunStep(0, 0, 2))
    s1 = (WaitStep(1, 0, 7, ((1, 3),)), RunStep(1, 0, 3), RunStep(1, 0, 4))
    costs = np.zeros((5, 2))
    costs[:, 0] = costs[:, 1] = np.array([10, 5, 1, 4, 3]) * US
    return PipelinedSchedule(2, 1, (s0, s1), {0: 0, 1: 0, 2: 0, 3: 1, 4: 1}, (0, 0), ((1, 3),), "hand"), costs


@pytest.mark.parametrize("memory", [None, MemoryShare({}, (), {})], ids=["longest-path", "event-loop"])
def test_hand_computed_case(memory):
    """Overlap 2 us, wait 0.5 us. Device 0: 10 + (5 - 2) = 13, record at 13, launch 2 max(1 - 2, 0) = 0 -> 13.
    Device 1: wait 13 -> 13.5, launch 3 whole (after a wait) -> 17.5, launch 4 3 - 2 -> 18.5. Without the term:
    15, 16; 15.5, 19.5, 22.5."""
    s, costs = _hand_schedule()
    r = simulate(s, costs, None, wait_seconds=0.5 * US, memory=memory, graph=GraphIssue(overlap=2 * US))
    assert r.step_seconds == pytest.approx(18.5 * US, rel=1e-12)
    assert r.end[0] == pytest.approx(np.array([10, 13, 13, 13]) * US, rel=1e-12)
    assert r.end[1] == pytest.approx(np.array([13.5, 17.5, 18.5]) * US, rel=1e-12)
    whole = simulate(s, costs, None, wait_seconds=0.5 * US, memory=memory)
    assert whole.step_seconds == pytest.approx(22.5 * US, rel=1e-12)


def _reference(s: PipelinedSchedule, costs: np.ndarray, topo, wait: float, overlap: float) -> float:
    """Independent reference: each step's duration from its kind (a launch whose nearest earlier step on the stream
    that is not a record is a launch loses ``overlap``, floored at 0), then start = max(end of the previous step,
    the record's end for a wait), iterated to a fixpoint."""
    dur = []
    for d, st in enumerate(s.streams):
        row = []
        for i, x in enumerate(st):
            if isinstance(x, RunStep):
                before = [y for y in st[:i] if not isinstance(y, RecordStep)]
                c = costs[x.launch, d]
                row.append(max(c - overlap, 0.0) if before and isinstance(before[-1], RunStep) else c)
            elif isinstance(x, WaitStep):
                row.append(wait)
            elif isinstance(x, TransferStep):
                same = s.domain(x.src) == s.domain(x.dst)
                row.append(0.0 if same else topo.transfer_seconds(x.src, x.dst, x.nbytes))
            else:
                row.append(0.0)
        dur.append(row)
    return fixpoint_step(s, dur)


def _schedules():
    return random_schedules(11)


@pytest.mark.parametrize("overlap", [0.0, 1 * US, GraphIssue().overlap, 50 * US])
def test_matches_an_independent_reference(overlap):
    topo = nvlink_topology(["a", "b"])
    for dag, costs, s in _schedules():
        dense = np.array([costs.row(v) for v in range(max(costs.kernels) + 1)])
        got = simulate(s, costs, topo, wait_seconds=1e-6, graph=GraphIssue(overlap=overlap)).step_seconds
        assert got == pytest.approx(_reference(s, dense, topo, 1e-6, overlap), rel=1e-9, abs=1e-15)
        whole = simulate(s, costs, topo, wait_seconds=1e-6).step_seconds
        assert got <= whole + 1e-15
        launches = len(s.steps(RunStep))
        assert got >= whole - overlap * launches - 1e-12


def test_off_where_it_should_be():
    """No graph: the simulation is as before; overlap 0 equals none; an eager (host-issued) replay refuses it."""
    topo = nvlink_topology(["a", "b"])
    for dag, costs, s in _schedules():
        base = simulate(s, costs, topo, wait_seconds=1e-6)
        zero = simulate(s, costs, topo, wait_seconds=1e-6, graph=GraphIssue(overlap=0.0))
        assert zero.step_seconds == base.step_seconds
        for a, b in zip(zero.end, base.end):
            assert np.array_equal(a, b)
        with pytest.raises(ConfigError, match="give one of them"):
            simulate(s, costs, topo, wait_seconds=1e-6, host=HostIssue(), graph=GraphIssue())
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="GraphIssue.overlap"):
            GraphIssue(overlap=bad)


def test_durations_untouched():
    """step_durations (what the planner's own simulations read) is unchanged by the term: it lives in simulate."""
    s, costs = _hand_schedule()
    dur = step_durations(s, costs, None, 0.5 * US)
    assert np.allclose(dur[0], np.array([10, 5, 0, 1]) * US) and np.allclose(dur[1], np.array([0.5, 4, 3]) * US)


@pytest.mark.parametrize("issue", [{}, {"graph": GraphIssue()}, {"host": HostIssue()}], ids=["whole", "graph", "eager"])
def test_record_resimulates_exactly(issue):
    """A schedule, costs, links and DRAM figures written as JSON and read back simulate to the same step."""
    topo = nvlink_topology(["a", "b"])
    for dag, costs, s in _schedules():
        nodes = sorted(dag.graph.nodes)
        mem = MemoryShare({n: 1e6 * (1 + n % 3) for n in nodes}, (4e12, 1.7e12), {0: 3e12, 1: 3e12}, (104, 24), 0.75)
        want = simulate(s, costs, topo, wait_seconds=1e-6, memory=mem, **issue).step_seconds
        inputs = json.loads(json.dumps({"costs": costs_to_json(costs), "links": links_to_json(topo),
                                        "memory": memory_to_json(mem), "wait_seconds": 1e-6}))
        record = json.loads(json.dumps(schedule_to_json(s)))
        assert resimulate(record, inputs, **issue) == want
        back = schedule_from_json(record)
        assert [[type(x) for x in st] for st in back.streams] == [[type(x) for x in st] for st in s.streams]


def test_record_errors_name_the_problem():
    s, costs = _hand_schedule()
    record = schedule_to_json(s)
    with pytest.raises(ConfigError, match="misses \\['costs'"):
        resimulate(record, {"links": None, "memory": None, "wait_seconds": 0.0})
    record["streams"][0][0] = ["launch", 0, 0]
    with pytest.raises(ConfigError, match="not a step"):
        schedule_from_json(record)


@pytest.mark.parametrize("dag", [transformer_dag(2), layered_dag(40, width=4, seed=2)], ids=["transformer", "layered"])
def test_planner_choices_unchanged_with_the_term_in_its_exact_simulations(dag, monkeypatch):
    """The planner never passes ``graph`` (its measured costs are calibrated to a graph replay, which already hides
    the overlap). Were its exact simulations given the default term, it would choose the same placements on these
    models and predict no slower a step."""
    import torch_tessera.scheduler.pipeline_plan as pipeline_plan
    from torch_tessera.scheduler import plan

    devs = ("big", "small")
    costs, tp = roofline_costs(dag, devs), nvlink_topology(devs)
    base = plan(dag, costs, tp, cache_dir=False)
    calls = []

    def with_term(*args, **kwargs):
        calls.append(1)
        return simulate(*args, graph=GraphIssue(), **kwargs)

    monkeypatch.setattr(pipeline_plan, "simulate", with_term)
    term = plan(dag, costs, tp, cache_dir=False)
    assert calls, "the planner's exact simulations did not go through pipeline_plan.simulate"
    assert term.placements == base.placements
    assert term.simulated_seconds <= base.simulated_seconds
