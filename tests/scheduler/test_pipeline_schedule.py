"""The pipelined schedule: the modulo scheduler builds schedules check_schedule accepts, check_schedule refuses any
schedule with one wait dropped or one hazard broken, and the simulator agrees with independent references."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from torch_tessera.errors import ScheduleError
from torch_tessera.lowering.program import BufferKind
from torch_tessera.scheduler.modulo import build_pipelined_schedule
from torch_tessera.scheduler.pipeline_schedule import (PipelinedSchedule, RecordStep, RunStep, TransferStep,
                                                       WaitStep, check_schedule, happens_before_clocks,
                                                       micro_batch_order, receive_points)
from torch_tessera.scheduler.simulate import MemoryShare, simulate, step_durations, water_fill
from torch_tessera.scheduler.synthetic import (SynthKernel, _buf, dag_from_kernels, layered_dag, nvlink_topology,
                                               roofline_costs, transformer_dag)
from torch_tessera.target.costs import CostTable


def _war_dag():
    """k0 writes a; k1 reads a writes b; k2 overwrites a (WAR on k1, WAW on k0); k3 reads a and b."""
    bufs: dict = {}
    a = _buf(bufs, "a", BufferKind.TEMP, 1000)
    b = _buf(bufs, "b", BufferKind.TEMP, 1000)
    c = _buf(bufs, "c", BufferKind.TEMP, 8)
    w = _buf(bufs, "w", BufferKind.PARAMETER, 1000)
    ks = [SynthKernel("k0", "gemm", [w], [a], 1e9), SynthKernel("k1", "norm", [a], [b], 1e9),
          SynthKernel("k2", "gemm", [w], [a], 1e9), SynthKernel("k3", "elementwise", [a, b], [c], 1e9)]
    return dag_from_kernels(ks, bufs)


def _cases():
    yield "layered", layered_dag(12, width=3, seed=3)
    yield "transformer", transformer_dag(1)


def _placements(dag, count=4, seed=0):
    rng = np.random.default_rng(seed)
    nodes = sorted(dag.graph.nodes)
    for _ in range(count):
        yield dict(zip(nodes, rng.integers(0, 2, len(nodes)).tolist()))


@pytest.mark.parametrize("domains", [(0, 1), (0, 0)], ids=["two-gpus", "one-gpu"])
@pytest.mark.parametrize("micro_batches", [1, 2, 3])
@pytest.mark.parametrize("priority", ["micro-batch", "critical-path"])
def test_built_schedules_are_accepted(domains, micro_batches, priority):
    for _, dag in _cases():
        costs = roofline_costs(dag, ["big", "small"])
        for place in _placements(dag):
            s = build_pipelined_schedule(dag, place, micro_batches, costs=costs, topology=nvlink_topology(["a", "b"]),
                                         domains=domains, priority=priority)
            check_schedule(s, dag)
            runs = s.steps(RunStep)
            assert len(runs) == micro_batches * dag.num_kernels
            transfers = s.steps(TransferStep)
            raw_cuts = [(u, v) for u, v, d in dag.graph.edges(data=True)
                        if place[u] != place[v] and "RAW" in d["kinds"] and d["ranges"]]
            # one transfer per cut RAW edge and micro-batch across memory domains, none inside one
            assert len(transfers) == (len(raw_cuts) * micro_batches if domains == (0, 1) else 0)


def test_war_and_waw_edges_across_devices_need_waits():
    dag = _war_dag()
    kinds = {(u, v): d["kinds"] for u, v, d in dag.graph.edges(data=True)}
    assert "WAR" in kinds[(1, 2)] and "WAW" in kinds[(0, 2)]
    place = {0: 0, 1: 1, 2: 0, 3: 1}
    s = build_pipelined_schedule(dag, place, 2, domains=(0, 0))
    check_schedule(s, dag)
    named = {e for w in s.steps(WaitStep) for e in w.edges} | {e[:2] for w in s.steps(WaitStep) for e in w.other_edges}
    assert (1, 2) in named  # the WAR edge: k2 must not overwrite a before k1 read it


def _drop(s: PipelinedSchedule, d: int, i: int) -> PipelinedSchedule:
    streams = list(s.streams)
    streams[d] = streams[d][:i] + streams[d][i + 1:]
    return replace(s, streams=tuple(streams))


@pytest.mark.parametrize("domains", [(0, 1), (0, 0)], ids=["two-gpus", "one-gpu"])
def test_dropping_any_wait_is_refused(domains):
    """Mutation test: every wait of the schedule is needed; without it check_schedule names an edge and micro-batch."""
    dag = layered_dag(12, width=3, seed=3)
    place = {n: (n // 2) % 2 for n in dag.graph.nodes}
    s = build_pipelined_schedule(dag, place, 2, costs=roofline_costs(dag, ["big", "small"]), domains=domains)
    check_schedule(s, dag)
    waits = [(d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, WaitStep)]
    assert len(waits) >= 6
    for d, i in waits:
        w = s.streams[d][i]
        with pytest.raises(ScheduleError) as err:
            check_schedule(_drop(s, d, i), dag)
        assert err.value.edge in set(w.edges) | {e[:2] for e in w.other_edges}
        assert err.value.micro_batch is not None and "edge" in str(err.value)


def test_refusals_name_the_problem():
    dag = layered_dag(9, width=3, seed=1)
    place = {n: n % 2 for n in dag.graph.nodes}
    s = build_pipelined_schedule(dag, place, 2, domains=(0, 1))
    # a transfer dropped
    d, i = next((d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, TransferStep))
    with pytest.raises(ScheduleError, match="has no transfer"):
        check_schedule(_drop(s, d, i), dag)
    # a run dropped
    d, i = next((d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, RunStep))
    with pytest.raises(ScheduleError, match="never run"):
        check_schedule(_drop(s, d, i), dag)
    # a record dropped: its waits name an event nobody records
    d, i = next((d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, RecordStep))
    with pytest.raises(ScheduleError, match="no step records"):
        check_schedule(_drop(s, d, i), dag)
    # two runs of one device swapped against their edge
    st = list(s.streams[0])
    runs = [i for i, x in enumerate(st) if isinstance(x, RunStep) and x.micro_batch == 0]
    for a, b in itertools.combinations(runs, 2):
        if dag.graph.has_edge(st[a].launch, st[b].launch):
            st[a], st[b] = st[b], st[a]
            break
    with pytest.raises(ScheduleError, match="issued before"):
        check_schedule(replace(s, streams=(tuple(st),) + s.streams[1:]), dag)


def test_deadlock_is_refused():
    dag = layered_dag(4, width=1, seed=0)  # a chain 0 -> 1 -> 2 -> 3
    place = {0: 0, 1: 1, 2: 0, 3: 1}
    s0 = (RunStep(0, 0, 0), RecordStep(0, 0, 0), WaitStep(0, 0, 1, ((1, 2),)), RunStep(0, 0, 2), RecordStep(0, 0, 2))
    s1 = (WaitStep(1, 0, 2, ((2, 3),)), WaitStep(1, 0, 0, ((0, 1),)), RunStep(1, 0, 1), RecordStep(1, 0, 1),
          RunStep(1, 0, 3))
    s = PipelinedSchedule(2, 1, (s0, s1), place, (0, 0))
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(s, dag)


# ------------------------------------------------------------------------------------------------------- simulator


def _reference_no_sharing(s: PipelinedSchedule, dur) -> float:
    """Longest path over the step graph, by recursion: each step ends at max(previous on its stream, its event's
    record when a wait) + its duration."""
    rec = {x.event_id: (d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, RecordStep)}
    memo: dict = {}

    def end(d, i):
        if i < 0:
            return 0.0
        if (d, i) not in memo:
            x = s.streams[d][i]
            t = end(d, i - 1)
            if isinstance(x, WaitStep):
                t = max(t, end(*rec[x.event_id]))
            memo[(d, i)] = t + dur[d][i]
        return memo[(d, i)]

    return max(end(d, len(st) - 1) for d, st in enumerate(s.streams))


def _reference_stepped(s: PipelinedSchedule, dur, demand, cap, dt) -> float:
    """Fixed-step time loop of the same fluid model: every ``dt``, each stream's head step progresses by ``dt``
    times its rate (the domain's bandwidth split max-min fairly among the running launches' demands)."""
    rec_done: dict = {}
    pos = [0] * len(s.streams)
    left = [None] * len(s.streams)
    t = 0.0
    while any(p < len(st) for p, st in zip(pos, s.streams)):
        for d, st in enumerate(s.streams):
            while pos[d] < len(st) and left[d] is None:
                x = st[pos[d]]
                if isinstance(x, RecordStep):
                    rec_done[x.event_id] = t
                    pos[d] += 1
                elif isinstance(x, WaitStep) and x.event_id not in rec_done:
                    break
                else:
                    left[d] = dur[d][pos[d]]
        running = [d for d in range(len(s.streams)) if left[d] is not None]
        dem = np.array([demand[d][pos[d]] for d in running])
        share = water_fill(dem, cap) if dem.sum() > cap else dem
        for k, d in enumerate(running):
            rate = share[k] / dem[k] if dem[k] > 0 else 1.0
            left[d] -= rate * dt
            if left[d] <= 1e-12:
                left[d] = None
                pos[d] += 1
        t += dt
    return t


@pytest.mark.parametrize("name,dag", list(_cases()))
def test_simulator_equals_longest_path_without_sharing(name, dag):
    costs = roofline_costs(dag, ["big", "small"])
    topo = nvlink_topology(["a", "b"])
    for k, place in enumerate(_placements(dag, 3, seed=7)):
        for M, domains in itertools.product((1, 2, 3), [(0, 1), (0, 0)]):
            s = build_pipelined_schedule(dag, place, M, costs=costs, topology=topo, domains=domains)
            r = simulate(s, costs, topo, wait_seconds=3e-6)
            dur = step_durations(s, costs, topo, 3e-6)
            assert r.step_seconds == pytest.approx(_reference_no_sharing(s, dur), rel=1e-9)
            assert np.allclose(r.busy + r.transfer + r.waiting + r.idle, r.step_seconds)
            assert (r.idle >= -1e-12).all() and np.abs(r.stretch).max() < 1e-15


def test_simulator_sharing_against_stepped_reference():
    dag = layered_dag(10, width=2, seed=5)
    costs = roofline_costs(dag, ["big", "small"])
    nodes = sorted(dag.graph.nodes)
    mem_bound = 0
    for place in _placements(dag, 3, seed=11):
        # memory-bound launches: each asks 3 TB/s on its device (capped at the partition's 1.7 TB/s on device 1)
        nbytes = {n: 3e12 * float(costs.row(n)[place[n]]) for n in nodes}
        mem = MemoryShare(nbytes, (4.0e12, 1.7e12), {0: 4.2e12})
        s = build_pipelined_schedule(dag, place, 2, costs=costs, domains=(0, 0))
        r = simulate(s, costs, None, wait_seconds=2e-6, memory=mem)
        dur = step_durations(s, costs, None, 2e-6)
        demand = [[min(nbytes[x.launch] / dur[d][i], mem.device_bandwidth[d]) if isinstance(x, RunStep) else 0.0
                   for i, x in enumerate(st)] for d, st in enumerate(s.streams)]
        ref = _reference_stepped(s, dur, demand, 4.2e12, dt=2e-7)
        assert r.step_seconds == pytest.approx(ref, rel=5e-3)
        free = simulate(s, costs, None, wait_seconds=2e-6)
        assert r.step_seconds >= free.step_seconds - 1e-12
        mem_bound += r.stretch[0] > 0.05 * r.busy[0]
    assert mem_bound >= 2  # the sharing shows in these cases (device 0 gives way: max-min fair to the smaller ask)


def test_two_memory_bound_partitions_stretch_each_other():
    """Two memory-bound launches alone on two partitions of one GPU: 3 + 2 TB/s asked of 4 TB/s; each gets 2 TB/s
    (max-min fair), so the 3 TB/s one runs at 2/3 speed until the other ends. Hand computation below."""
    dag = layered_dag(2, width=2, seed=0)  # two independent kernels
    place = {0: 0, 1: 1}
    costs = CostTable(("p0", "p1"), (0, 1), np.array([[1e-3, 1e-3], [1e-3, 1e-3]]))
    mem = MemoryShare({0: 3e9, 1: 2e9}, (3e12, 3e12), {0: 4e12})  # 3 GB in 1 ms = 3 TB/s; 2 TB/s
    s = build_pipelined_schedule(dag, place, 1, costs=costs, domains=(0, 0))
    r = simulate(s, costs, None, memory=mem)
    # launch 1 asks 2 TB/s, gets 2: ends at 1 ms; launch 0 gets 2 of 3 TB/s for 1 ms (2/3 done), then 1/3 ms alone
    assert r.end[1][-1] == pytest.approx(1e-3)
    assert r.step_seconds == pytest.approx(1e-3 + 1e-3 / 3)
    assert r.stretch[0] == pytest.approx(1e-3 / 3) and r.stretch[1] == pytest.approx(0.0, abs=1e-12)
    # the same launches on two GPUs (two domains) do not share
    s2 = build_pipelined_schedule(dag, place, 1, costs=costs, domains=(0, 1))
    assert simulate(s2, costs, None, memory=mem).step_seconds == pytest.approx(1e-3)


def test_two_micro_batches_overlap_a_layer_split():
    """Half the chain on each device: two micro-batches pipeline (step 3 halves, not 4)."""
    dag = layered_dag(8, width=1, seed=0)
    place = {n: int(n >= 4) for n in dag.graph.nodes}
    costs = CostTable(("a", "b"), tuple(range(8)), np.full((8, 2), 1e-3))
    s = build_pipelined_schedule(dag, place, 2, costs=costs, domains=(0, 0), wait_seconds=0.0)
    r = simulate(s, costs, None, wait_seconds=0.0)
    assert r.step_seconds == pytest.approx(12e-3)
    assert micro_batch_order(s, 1) == [(0, 4), (0, 5), (0, 6), (0, 7), (1, 4), (1, 5), (1, 6), (1, 7)]


@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("micro_batches", [1, 3])
def test_transfers_land_at_the_wait_that_consumes_them(devices, micro_batches):
    """Where a transport with one memory per device receives each transfer: at a wait of the destination, after
    every step of it the transfer follows, before the consumer; each transfer once; per (source, destination) pair
    in the order the source issues them (messages matched in posting order pair right)."""
    for _, dag in _cases():
        rng = np.random.default_rng(devices)
        nodes = sorted(dag.graph.nodes)
        for _ in range(3):
            place = dict(zip(nodes, rng.integers(0, devices, len(nodes)).tolist()))
            s = build_pipelined_schedule(dag, place, micro_batches, domains=tuple(range(devices)), devices=devices)
            clocks = happens_before_clocks(s)
            lands = receive_points(s)
            where = {id(t): (d, p) for d, at in lands.items() for p, ts in at.items() for t in ts}
            transfers = [(d, i, t) for d, st in enumerate(s.streams) for i, t in enumerate(st)
                         if isinstance(t, TransferStep)]
            assert len(where) == len(transfers) == sum(len(ts) for at in lands.values() for ts in at.values())
            for d, i, t in transfers:
                dst, p = where[id(t)]
                assert dst == t.dst and isinstance(s.streams[dst][p], WaitStep)
                assert clocks[dst][p, d] >= i and (p == 0 or clocks[dst][p - 1, d] < i)  # the first that knows
                consumer = s.streams[dst].index(RunStep(dst, t.micro_batch, t.edge[1]))
                assert p < consumer
            for dst, at in lands.items():
                order = [t for p in sorted(at) for t in at[p]]
                for src in range(devices):
                    mine = [t for t in order if t.src == src]
                    assert mine == [t for t in s.streams[src] if isinstance(t, TransferStep) and t.dst == dst]
