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

#: Seconds one cross-device wait adds to the waiting stream (an event wait resolved on the GPU): one
#: cross-partition event wait inside one CUDA graph on an H200 split 104 + 24 SMs. Source: docs/BENCHMARKS.md, cut
#: diagnosis.
WAIT_SECONDS = 0.63e-6

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
    adj = _Adjacency(dag, place, dom)
    secs = launch_seconds(dag, place, costs)
    order = _list_schedule(adj, micro_batches, [secs[v] for v in adj.nodes], topology, wait_seconds, priority, D)
    streams = _emit(adj, order, D, micro_batches)
    cut = tuple(sorted((u, v) for u, v in dag.graph.edges if place[u] != place[v]))
    return PipelinedSchedule(D, micro_batches, streams, place, dom, cut, source=f"modulo:{priority}")


class _Adjacency:
    """The DAG as integer lists in sorted launch order, with each edge's kind under the placement (internal).

    ``succ[i]``: ``(j, bytes)`` with -1 for an edge on one device, 0 for a wait only, else the bytes a
    cross-domain RAW edge moves; ``pred[i]``: ``j`` of the edges into ``i`` on other devices, ascending."""

    def __init__(self, dag: DependencyGraph, place: Mapping[int, int], dom: Sequence[int]):
        self.nodes, edges = _edge_list(dag)
        self.dev = [place[n] for n in self.nodes]
        n = len(self.nodes)
        self.succ: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        self.indeg = [0] * n
        self.moves: list[list[tuple[int, tuple, int]]] = [[] for _ in range(n)]  # (j, ranges, bytes) to transfer
        dev = self.dev
        for i, j, ranges, nb in edges:
            self.indeg[j] += 1
            du, dv = dev[i], dev[j]
            if du == dv:
                self.succ[i].append((j, -1))
                continue
            self.pred[j].append(i)
            if nb and dom[du] != dom[dv]:
                self.succ[i].append((j, nb))
                self.moves[i].append((j, ranges, nb))
            else:
                self.succ[i].append((j, 0))
        for lst in self.pred:
            lst.sort()
        for lst in self.moves:
            lst.sort()


def _edge_list(dag: DependencyGraph) -> tuple[list[int], list[tuple[int, int, tuple, int]]]:
    """``(sorted launches, [(i, j, RAW ranges, RAW bytes)])`` of the DAG's edges by launch position."""
    nodes = sorted(dag.graph.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    edges = []
    for u, v, d in dag.graph.edges(data=True):
        raw = "RAW" in d["kinds"] and bool(d["ranges"])
        ranges = tuple(tuple(r) for r in d["ranges"]) if raw else ()
        edges.append((idx[u], idx[v], ranges, sum(e - s for _, s, e in ranges)))
    return nodes, edges


def predicted_step(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int], micro_batches: int = 2, *,
                   costs: CostTable | None = None, topology: Topology | None = None,
                   domains: Sequence[int] | None = None, wait_seconds: float = WAIT_SECONDS,
                   devices: int | None = None) -> tuple[float, list[float]]:
    """The list scheduler's own timeline of the schedule :func:`build_pipelined_schedule` would build: ``(step
    seconds, per-device seconds its stream is occupied)``, without building the steps. A cheap surrogate of
    :func:`~torch_tessera.scheduler.simulate.simulate` without bandwidth sharing: it delays every cross-device edge
    by a wait but lets a wait overlap the stream's earlier work, where the schedule keeps fewer waits that each
    occupy the stream; on the test DAGs it came out 0-14 % below the simulated step, never above
    (tests/scheduler/test_pipeline_plan.py)."""
    place = placement_map(dag, placement)
    D = devices or (len(topology.devices) if topology is not None else max(place.values(), default=0) + 1)
    dom = tuple(domains) if domains is not None else tuple(range(D))
    adj = _Adjacency(dag, place, dom)
    secs = launch_seconds(dag, place, costs)
    timing: list = []
    _list_schedule(adj, micro_batches, [secs[v] for v in adj.nodes], topology, wait_seconds, "micro-batch", D, timing)
    return timing[0], timing[1]


def _list_schedule(adj: _Adjacency, M, dur, topology, wait_s, priority, D, timing: list | None = None) -> list[int]:
    """Ops ``m * n + i`` (micro-batch ``m``, launch ``adj.nodes[i]``) in the order the predicted timeline issues
    them (each device's issue order is its subsequence; every producer precedes its consumers). ``timing``, when
    given, receives the timeline's makespan and each device's occupied seconds."""
    n = len(adj.nodes)
    rank = _upward_rank(adj, dur) if priority == "critical-path" else None
    pending = adj.indeg * M
    ready_at = [0.0] * (n * M)
    waiting: list[list] = [[] for _ in range(D)]  # (ready time, prio, op)
    avail: list[list] = [[] for _ in range(D)]  # (prio, ready time, op)
    free = [0.0] * D
    busy = [0.0] * D
    link = {}

    def prio(op: int) -> tuple:
        return (op,) if rank is None else (-rank[op % n], op)

    for op in range(n * M):
        if pending[op] == 0:
            heapq.heappush(waiting[adj.dev[op % n]], (0.0, prio(op), op))
    order: list[int] = []
    inf = float("inf")
    while len(order) < n * M:
        d, best_t = -1, inf
        for e in range(D):
            t = free[e] if avail[e] else (max(free[e], waiting[e][0][0]) if waiting[e] else inf)
            if t < best_t:
                d, best_t = e, t
        wq, aq = waiting[d], avail[d]
        while wq and wq[0][0] <= best_t:
            r, p, op = heapq.heappop(wq)
            heapq.heappush(aq, (p, r, op))
        _, r, op = heapq.heappop(aq)
        i, base = op % n, op - op % n
        finish = max(free[d], r) + dur[i]
        t = finish
        for j, nbytes in adj.succ[i]:
            if nbytes > 0:
                key = (d, adj.dev[j], nbytes)
                if key not in link:
                    link[key] = transfer_seconds(topology, d, adj.dev[j], nbytes)
                t += link[key]
                arrive = t + wait_s
            else:
                arrive = finish if nbytes < 0 else finish + wait_s
            k = base + j
            if arrive > ready_at[k]:
                ready_at[k] = arrive
            pending[k] -= 1
            if pending[k] == 0:
                heapq.heappush(waiting[adj.dev[j]], (ready_at[k], prio(k), k))
        busy[d] += t - max(free[d], r)
        free[d] = t
        order.append(op)
    if timing is not None:
        timing[:] = [max(free, default=0.0), busy]
    return order


def _upward_rank(adj: _Adjacency, dur: Sequence[float]) -> list[float]:
    """Longest path (seconds of launches) from each launch to the end of the program."""
    rank = [0.0] * len(adj.nodes)
    for i in range(len(adj.nodes) - 1, -1, -1):
        rank[i] = dur[i] + max((rank[j] for j, _ in adj.succ[i]), default=0.0)
    return rank


def _emit(adj: _Adjacency, order: Sequence[int], D: int, M: int) -> tuple[tuple, ...]:
    """The streams of ``order``: runs, transfers after producers, records, and the waits vector clocks need."""
    n = len(adj.nodes)
    nodes, dev = adj.nodes, adj.dev
    streams: list[list] = [[] for _ in range(D)]
    know = [[-1] * D for _ in range(D)]  # know[d][e]: last position on e's stream known done on d's stream
    wait_know: list[list[list[int]]] = [[[] for _ in range(D)] for _ in range(D)]  # [d][e] -> know[e] after wait k
    wait_refs: list[list[tuple[int, list, list]]] = [[] for _ in range(D)]  # [d] -> (micro-batch, edges, others)
    record: dict[int, tuple[int, int, list[int]]] = {}  # op -> (event, position, clock)
    has_cross = [any(nb >= 0 for _, nb in adj.succ[i]) for i in range(n)]
    for op in order:
        m, i = divmod(op, n)
        d = dev[i]
        st = streams[d]
        v = nodes[i]
        kd = know[d]
        for j in adj.pred[i]:
            du = dev[j]
            ev, pos, clock = record[m * n + j]
            u = nodes[j]
            if kd[du] >= pos:  # an earlier wait already covers it: name the edge there
                k = bisect.bisect_left(wait_know[d][du], pos)
                wm, edges, others = wait_refs[d][k]
                if wm == m:
                    edges.append((u, v))
                else:
                    others.append((u, v, m))
                continue
            edges, others = [(u, v)], []
            st.append(("wait", m, ev, edges, others))
            kd = know[d] = [a if a > b else b for a, b in zip(kd, clock)]
            kd[d] = len(st) - 1
            wait_refs[d].append((m, edges, others))
            for e in range(D):
                wait_know[d][e].append(kd[e])
        st.append(RunStep(d, m, v))
        kd[d] = len(st) - 1
        if not has_cross[i]:
            continue
        for j, ranges, nb in adj.moves[i]:
            st.append(TransferStep(d, dev[j], m, (v, nodes[j]), ranges, nb))
        st.append(RecordStep(d, m, op))
        kd[d] = len(st) - 1
        record[op] = (op, len(st) - 1, list(kd))
    used = {s[2] for st in streams for s in st if isinstance(s, tuple)}
    return tuple(tuple(WaitStep(d, s[1], s[2], tuple(s[3]), tuple(s[4])) if isinstance(s, tuple) else s for s in st
                       if not (isinstance(s, RecordStep) and s.event_id not in used))
                 for d, st in enumerate(streams))
