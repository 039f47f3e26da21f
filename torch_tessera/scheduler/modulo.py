"""Build the explicit pipelined schedule of a placement: a list (software-pipelining) scheduler over micro-batches.

The DAG is replicated once per micro-batch. A list scheduler issues the copies on the devices in the order a
predicted timeline runs them: each device, when free, takes the ready launch of highest priority (by default the
lowest micro-batch, then program order), so a later micro-batch fills the gaps an earlier one leaves while it waits
for the other device: the ping-pong of two micro-batches. Timing uses each launch's cost on its device, each
transfer's link time (latency + bytes / bandwidth, on the producer's stream) and a cost per wait.

From that order it emits the steps of :class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`: one
transfer per cut RAW edge across memory domains (after its producer), one record per producer run with consumers
on other devices, and a wait before a consumer only where the consumer's stream does not already know the
producer finished (vector clocks through earlier waits): no wait is redundant, each names the edges it covers.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Mapping, Sequence

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.scheduler.pipeline_schedule import (PipelinedSchedule, RecordStep, RunStep, TransferStep,
                                                       WaitStep)
from torch_tessera.target.costs import CostTable, Topology

#: Seconds one cross-device wait adds to the waiting stream (an event wait resolved on the GPU). Source: issue 23 /
#: docs/BENCHMARKS.md, cut cost between SM partitions of one H200 inside one CUDA graph: 2.3-6.9 us per cut edge,
#: about 1 us per bare hop (bench/gpu_hop_variants.py); the upper end of that range rounded down to 5 us.
WAIT_SECONDS = 5e-6

#: orders among ready launches of one device: ``"micro-batch"`` (lowest micro-batch first, then program order) or
#: ``"critical-path"`` (longest remaining path first, then micro-batch)
PRIORITIES = ("micro-batch", "critical-path")


def placement_map(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int] | np.ndarray) -> dict[int, int]:
    """``placement`` as ``launch -> device``: a mapping, or a sequence in sorted launch order.

    Raises:
        ConfigError: a launch of the DAG has no device.
    """
    nodes = sorted(dag.graph.nodes)
    if isinstance(placement, Mapping):
        out = {int(k): int(v) for k, v in placement.items()}
    else:
        seq = np.asarray(placement).tolist()
        if len(seq) != len(nodes):
            raise ConfigError(f"placement has {len(seq)} devices for {len(nodes)} launches")
        out = dict(zip(nodes, (int(x) for x in seq)))
    missing = [n for n in nodes if n not in out]
    if missing:
        raise ConfigError(f"placement has no device for launches {missing[:10]}")
    return out


def launch_seconds(dag: DependencyGraph, place: Mapping[int, int], costs: CostTable | None) -> dict[int, float]:
    """Seconds of each launch on its device (1 us each without a cost table)."""
    if costs is None:
        return {n: 1e-6 for n in dag.graph.nodes}
    return {n: float(costs.row(n)[place[n]]) for n in dag.graph.nodes}


def transfer_seconds(topology: Topology | None, src: int, dst: int, nbytes: int) -> float:
    """Link time of one transfer (0 without a topology)."""
    return topology.transfer_seconds(src, dst, nbytes) if topology is not None else 0.0


def build_pipelined_schedule(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int],
                             micro_batches: int = 2, *, costs: CostTable | None = None,
                             topology: Topology | None = None, domains: Sequence[int] | None = None,
                             wait_seconds: float = WAIT_SECONDS, priority: str = "micro-batch",
                             devices: int | None = None) -> PipelinedSchedule:
    """The pipelined schedule of ``placement`` over ``micro_batches`` copies of ``dag``.

    Args:
        dag: the program's dependency DAG.
        placement: device of every launch (``launch -> device``, or a sequence in sorted launch order).
        micro_batches: micro-batches per step, ``>= 1``.
        costs: seconds of each launch on each device (columns in device order); ``None``: 1 us each.
        topology: links (bandwidth bytes/s, latency s) for the transfers' time; ``None``: transfers take no time.
        domains: memory domain of each device (SM partitions of one GPU share one); default: each its own.
        wait_seconds: cost of one cross-device wait (:data:`WAIT_SECONDS`).
        priority: one of :data:`PRIORITIES`.
        devices: number of devices (default: ``len(topology.devices)``, else the largest device index + 1).

    Returns:
        A schedule that :func:`~torch_tessera.scheduler.pipeline_schedule.check_schedule` accepts.

    Raises:
        ConfigError: ``micro_batches < 1``, an unknown priority, or a launch without a device.
    """
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    if priority not in PRIORITIES:
        raise ConfigError(f"priority {priority!r} is not one of {PRIORITIES}")
    place = placement_map(dag, placement)
    D = devices or (len(topology.devices) if topology is not None else max(place.values(), default=0) + 1)
    dom = tuple(domains) if domains is not None else tuple(range(D))
    order = _list_schedule(dag, place, micro_batches, launch_seconds(dag, place, costs), topology, dom,
                           wait_seconds, priority, D)
    streams = _emit(dag, place, order, dom, D)
    cut = tuple(sorted((u, v) for u, v in dag.graph.edges if place[u] != place[v]))
    return PipelinedSchedule(D, micro_batches, streams, place, dom, cut, source=f"modulo:{priority}")


def _edge_kinds(dag: DependencyGraph, place: Mapping[int, int], dom: Sequence[int]):
    """Per launch: ``[(consumer, transfer bytes or -1)]``: -1 for an edge on one device, 0 for a wait only, else the
    bytes a cross-domain RAW edge moves."""
    g = dag.graph
    succ: dict[int, list[tuple[int, int]]] = {n: [] for n in g.nodes}
    for u, v, d in g.edges(data=True):
        if place[u] == place[v]:
            succ[u].append((v, -1))
        elif dom[place[u]] != dom[place[v]] and "RAW" in d["kinds"] and d["ranges"]:
            succ[u].append((v, sum(e - s for _, s, e in d["ranges"])))
        else:
            succ[u].append((v, 0))
    return succ


def _list_schedule(dag, place, M, dur, topology, dom, wait_s, priority, D) -> list[tuple[int, int]]:
    """``(micro_batch, launch)`` in the order the predicted timeline issues them (each device's issue order is its
    subsequence; every producer precedes its consumers)."""
    g = dag.graph
    succ = _edge_kinds(dag, place, dom)
    rank = _upward_rank(dag, dur) if priority == "critical-path" else None
    pending = {(m, n): g.in_degree(n) for m in range(M) for n in g.nodes}
    ready_at: dict[tuple[int, int], float] = {}
    waiting: list[list] = [[] for _ in range(D)]  # (ready time, prio, op)
    avail: list[list] = [[] for _ in range(D)]  # (prio, ready time, op)
    free = [0.0] * D

    def prio(m: int, n: int) -> tuple:
        return (m, n) if rank is None else (-rank[n], m, n)

    for m in range(M):
        for n in g.nodes:
            if pending[(m, n)] == 0:
                ready_at[(m, n)] = 0.0
                heapq.heappush(waiting[place[n]], (0.0, prio(m, n), (m, n)))
    order: list[tuple[int, int]] = []
    total = M * g.number_of_nodes()
    while len(order) < total:
        best, best_t = -1, float("inf")
        for d in range(D):
            t = free[d] if avail[d] else (max(free[d], waiting[d][0][0]) if waiting[d] else float("inf"))
            if t < best_t:
                best, best_t = d, t
        d = best
        while waiting[d] and waiting[d][0][0] <= best_t:
            r, p, op = heapq.heappop(waiting[d])
            heapq.heappush(avail[d], (p, r, op))
        _, r, (m, n) = heapq.heappop(avail[d])
        finish = max(free[d], r) + dur[n]
        t = finish
        for v, nbytes in succ[n]:
            if nbytes > 0:
                t += transfer_seconds(topology, d, place[v], nbytes)
            arrive = finish if nbytes < 0 else (t if nbytes > 0 else finish) + wait_s
            key = (m, v)
            ready_at[key] = max(ready_at.get(key, 0.0), arrive)
            pending[key] -= 1
            if pending[key] == 0:
                heapq.heappush(waiting[place[v]], (ready_at[key], prio(m, v), key))
        free[d] = t
        order.append((m, n))
    return order


def _upward_rank(dag: DependencyGraph, dur: Mapping[int, float]) -> dict[int, float]:
    """Longest path (seconds of launches) from each launch to the end of the program."""
    g = dag.graph
    rank: dict[int, float] = {}
    for n in sorted(g.nodes, reverse=True):
        rank[n] = dur[n] + max((rank[v] for v in g.successors(n)), default=0.0)
    return rank


def _emit(dag, place, order, dom, D) -> tuple[tuple, ...]:
    """The streams of ``order``: runs, transfers after producers, records, and the waits vector clocks need."""
    g = dag.graph
    streams: list[list] = [[] for _ in range(D)]
    know = [[-1] * D for _ in range(D)]  # know[d][e]: last position on e's stream known done on d's stream
    wait_know: list[list[list[int]]] = [[[] for _ in range(D)] for _ in range(D)]  # [d][e] -> know[e] after wait k
    wait_refs: list[list[tuple[int, list, list]]] = [[] for _ in range(D)]  # [d] -> (micro-batch, edges, others)
    record: dict[tuple[int, int], tuple[int, int, list[int]]] = {}  # (m, u) -> (event, position, clock)
    next_event = 0
    for m, v in order:
        d = place[v]
        st = streams[d]
        for u in sorted(g.predecessors(v)):
            du = place[u]
            if du == d:
                continue
            ev, pos, clock = record[(m, u)]
            if know[d][du] >= pos:  # an earlier wait already covers it: name the edge there
                k = bisect.bisect_left(wait_know[d][du], pos)
                wm, edges, others = wait_refs[d][k]
                (edges if wm == m else others).append((u, v) if wm == m else (u, v, m))
                continue
            edges, others = [(u, v)], []
            st.append(("wait", m, ev, edges, others))
            know[d] = [max(a, b) for a, b in zip(know[d], clock)]
            know[d][d] = len(st) - 1
            wait_refs[d].append((m, edges, others))
            for e in range(D):
                wait_know[d][e].append(know[d][e])
        st.append(RunStep(d, m, v))
        know[d][d] = len(st) - 1
        cross = [w for w in g.successors(v) if place[w] != d]
        if not cross:
            continue
        for w in sorted(cross):
            data = g.edges[v, w]
            if dom[place[w]] != dom[d] and "RAW" in data["kinds"] and data["ranges"]:
                ranges = tuple(tuple(r) for r in data["ranges"])
                st.append(TransferStep(d, place[w], m, (v, w), ranges, sum(e - s for _, s, e in ranges)))
        st.append(RecordStep(d, m, next_event))
        know[d][d] = len(st) - 1
        record[(m, v)] = (next_event, len(st) - 1, list(know[d]))
        next_event += 1
    used = {s[2] for st in streams for s in st if isinstance(s, tuple)}
    return tuple(tuple(WaitStep(d, s[1], s[2], tuple(s[3]), tuple(s[4])) if isinstance(s, tuple) else s for s in st
                       if not (isinstance(s, RecordStep) and s.event_id not in used))
                 for d, st in enumerate(streams))
