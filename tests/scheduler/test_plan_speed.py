"""The fast paths of planning with the simulator in the loop change no result.

* The list scheduler (:func:`modulo.list_timeline`, :func:`modulo.build_pipelined_schedule`) gives the order and the
  timeline of a plain reference implementation of the same rule, written here over the networkx DAG.
* A timeline passed back to :func:`modulo.build_pipelined_schedule` gives the schedule built without it.
* :func:`pipeline_plan.step_lower_bound` is below every simulated step (surrogate and exact, 1-4 micro-batches, with
  and without shared DRAM), so the candidates and micro-batch counts it skips could not have won.
* ``plan(score="simulate")`` chooses the same placement, micro-batch count and simulated step as the full
  evaluation (every candidate and every micro-batch count simulated: the bound replaced by 0), on registry-model
  workloads and on random and transformer DAGs.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

import torch_tessera.scheduler as scheduler
from torch_tessera.errors import ConfigError
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.modulo import build_pipelined_schedule, list_timeline, predicted_step
from torch_tessera.scheduler.pipeline_plan import PipelineModel, simulated_seconds, step_lower_bound
from torch_tessera.scheduler.pipeline_schedule import RunStep
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag

DEVS = ("big", "mid", "small", "small")
_SOLVE, _SIMULATED = scheduler.solve_throughput, scheduler.simulated_seconds


def reference_order(dag, place, M, costs, topology, domains, wait_s, priority="micro-batch"):
    """The list scheduler's rule, plainly: ``(order, makespan, occupied per device)``. Each device, when free, takes
    the ready op of highest priority; an edge on one device delays by nothing, one across devices by a wait, and a
    RAW edge across memory domains also by its transfer, pushed on the producer's stream in edge order."""
    nodes = sorted(dag.graph.nodes)
    pos = {v: i for i, v in enumerate(nodes)}
    n, D = len(nodes), len(topology.devices)
    dom = domains or list(range(D))
    out = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v, d in dag.graph.edges(data=True):
        i, j = pos[u], pos[v]
        indeg[j] += 1
        nb = sum(e - s for _, s, e in d["ranges"]) if "RAW" in d["kinds"] else 0
        if place[u] == place[v]:
            out[i].append((j, "local", 0.0))
        elif nb and dom[place[u]] != dom[place[v]]:
            out[i].append((j, "move", topology.transfer_seconds(place[u], place[v], nb)))
        else:
            out[i].append((j, "wait", 0.0))
    dur = [float(costs.row(v)[place[v]]) for v in nodes]
    rank = [0.0] * n
    for i in range(n - 1, -1, -1):
        rank[i] = dur[i] + max((rank[j] for j, _, _ in out[i]), default=0.0)

    def prio(op):
        return (op,) if priority == "micro-batch" else (-rank[op % n], op)

    pending, ready = indeg * M, [0.0] * (n * M)
    waiting = [[] for _ in range(D)]
    avail = [[] for _ in range(D)]
    free, busy, order = [0.0] * D, [0.0] * D, []
    for op in range(n * M):
        if pending[op] == 0:
            heapq.heappush(waiting[place[nodes[op % n]]], (0.0, prio(op), op))
    while len(order) < n * M:
        times = [free[e] if avail[e] else max(free[e], waiting[e][0][0]) if waiting[e] else np.inf for e in range(D)]
        d = int(np.argmin(times))
        while waiting[d] and waiting[d][0][0] <= times[d]:
            r, p, op = heapq.heappop(waiting[d])
            heapq.heappush(avail[d], (p, r, op))
        _, r, op = heapq.heappop(avail[d])
        i, base = op % n, op - op % n
        finish = max(free[d], r) + dur[i]
        t = finish
        for j, kind, secs in out[i]:
            if kind == "move":
                t += secs
            arrive = finish if kind == "local" else (t if kind == "move" else finish) + wait_s
            ready[base + j] = max(ready[base + j], arrive)
            pending[base + j] -= 1
            if pending[base + j] == 0:
                heapq.heappush(waiting[place[nodes[j]]], (ready[base + j], prio(base + j), base + j))
        busy[d] += t - max(free[d], r)
        free[d] = t
        order.append(op)
    return order, max(free), busy


def _cases(count=12):
    rng = np.random.default_rng(7)
    for c in range(count):
        D = 2 + c % 3
        dag = transformer_dag(layers=1 + c % 3) if c % 3 == 0 else layered_dag(20 + 9 * c, width=2 + c % 4, seed=c)
        costs, tp = roofline_costs(dag, DEVS[:D], noise=0.3), nvlink_topology(DEVS[:D])
        nodes = sorted(dag.graph.nodes)
        place = dict(zip(nodes, rng.integers(0, D, len(nodes)).tolist()))
        domains = [0, 0, 1, 1][:D] if c % 2 else None  # partitions of one GPU share a domain: no bytes move there
        yield dag, costs, tp, place, domains, 1 + c % 4


def test_list_scheduler_equals_the_reference():
    for dag, costs, tp, place, domains, M in _cases():
        order, step, busy = reference_order(dag, place, M, costs, tp, domains, 5e-6)
        tl = list_timeline(dag, place, M, costs=costs, topology=tp, domains=domains, wait_seconds=5e-6)
        assert list(tl.order) == order
        assert tl.step_seconds == pytest.approx(step, rel=1e-12) and tl.occupied == pytest.approx(busy, rel=1e-12)
        assert predicted_step(dag, place, M, costs=costs, topology=tp, domains=domains, wait_seconds=5e-6) == (
            tl.step_seconds, list(tl.occupied))
        n = dag.num_kernels
        nodes = sorted(dag.graph.nodes)
        for priority in ("micro-batch", "critical-path"):  # each stream runs its device's ops in the reference order
            ref = order if priority == "micro-batch" else reference_order(dag, place, M, costs, tp, domains, 5e-6,
                                                                           priority)[0]
            s = build_pipelined_schedule(dag, place, M, costs=costs, topology=tp, domains=domains,
                                         wait_seconds=5e-6, priority=priority)
            for d, st in enumerate(s.streams):
                runs = [(x.micro_batch, x.launch) for x in st if isinstance(x, RunStep)]
                want = [divmod(op, n) for op in ref if place[nodes[op % n]] == d]
                assert runs == [(m, nodes[i]) for m, i in want]


def test_a_timeline_passed_back_builds_the_same_schedule():
    for dag, costs, tp, place, domains, M in _cases(6):
        tl = list_timeline(dag, place, M, costs=costs, topology=tp, domains=domains)
        again = build_pipelined_schedule(dag, place, M, costs=costs, topology=tp, domains=domains, timeline=tl)
        assert again == build_pipelined_schedule(dag, place, M, costs=costs, topology=tp, domains=domains)
        with pytest.raises(ConfigError, match="timeline has"):
            build_pipelined_schedule(dag, place, M + 1, costs=costs, topology=tp, domains=domains, timeline=tl)


def _shared_model(D):
    """Two partitions of one GPU per domain, whose DRAM together asks more than the GPU has."""
    return PipelineModel(tuple(d // 2 for d in range(D)), (3.0e12,) * D, {0: 4.0e12, 1: 4.0e12})


@pytest.mark.parametrize("shared", [False, True])
def test_lower_bound_is_below_every_simulated_step(shared):
    rng = np.random.default_rng(3)
    checked = 0
    for c in range(6):
        D = 2 + c % 3
        dag = transformer_dag(layers=2) if c % 2 else layered_dag(60, width=3, seed=c)
        costs, tp = roofline_costs(dag, DEVS[:D], noise=0.2), nvlink_topology(DEVS[:D])
        wl = as_workload(dag, costs)
        pb = compile_problem(wl, tp, micro_batches=2)
        model = _shared_model(D) if shared else PipelineModel.from_names(tp.devices)
        for _ in range(3):
            place = rng.integers(0, D, pb.n)
            bound = step_lower_bound(pb, wl, place, tp, model)
            load = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=D).max()
            assert bound >= load * (1 - 1e-12)  # at least the busiest device's launches
            for M in (1, 2, 3, 4):
                for exact in (False, True):
                    assert simulated_seconds(pb, wl, place, tp, model, M, exact) >= bound * (1 - 1e-12)
                    checked += 1
    assert checked == 6 * 3 * 8


def _registry_workloads():
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.target.devices import parse_devices

    for name in ("mlp", "llama"):
        mw = model_workload(name, parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=16,
                            decode_batch=4, mean_output_tokens=8)
        yield name, mw.workload, mw.topology


def _synthetic_workloads():
    for D in (2, 3, 4):
        for name, dag, noise in (("transformer", transformer_dag(layers=4, tokens=256, context=2048), 0.0),
                                 ("random", layered_dag(80, width=4, seed=D), 0.3)):
            yield f"{name}-{D}", as_workload(dag, roofline_costs(dag, DEVS[:D], noise=noise)), nvlink_topology(DEVS[:D])


def _plan_both(monkeypatch, wl, tp, pipeline=None):
    """(fast plan, full-evaluation plan, simulations each ran) of one workload, from the same solver result (the
    solver's time limits make it depend on the machine's load)."""
    solved, runs = {}, []

    def counted(*args, **kwargs):
        runs[-1] += 1
        return _SIMULATED(*args, **kwargs)

    monkeypatch.setattr(scheduler, "simulated_seconds", counted)

    def once(*args, **kwargs):
        if "sol" not in solved:
            solved["sol"] = _SOLVE(*args, **kwargs)
        return solved["sol"]

    monkeypatch.setattr(scheduler, "solve_throughput", once)
    runs.append(0)
    fast = plan(wl, None, tp, cache_dir=False, pipeline=pipeline, time_limit=2.0)
    runs.append(0)
    with monkeypatch.context() as m:
        m.setattr(scheduler, "step_lower_bound", lambda *a, **k: 0.0)  # nothing skipped
        full = plan(wl, None, tp, cache_dir=False, pipeline=pipeline, time_limit=2.0)
    assert runs[0] <= runs[1]
    return fast, full, runs


def _same_choice(fast, full, what):
    assert fast.placements == full.placements, what
    assert fast.micro_batches == full.micro_batches, what
    assert fast.simulated_seconds == full.simulated_seconds, what


def test_plans_equal_the_full_evaluation_on_registry_workloads(monkeypatch):
    for name, wl, tp in _registry_workloads():
        fast, full, _ = _plan_both(monkeypatch, wl, tp)
        _same_choice(fast, full, name)


def test_plans_equal_the_full_evaluation_on_synthetic_dags(monkeypatch):
    split, skipped = 0, 0
    for name, wl, tp in _synthetic_workloads():
        for pipeline in (None, _shared_model(len(tp.devices))):
            fast, full, runs = _plan_both(monkeypatch, wl, tp, pipeline)
            _same_choice(fast, full, name)
            split += len({d for p in fast.placements.values() for d in p.values()}) > 1
            skipped += runs[0] < runs[1]
    assert split >= 4  # most of these plans cut the DAG, so the simulator chose them
    assert skipped >= 2  # and the bound skipped simulations in some of them
