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
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.scheduler.pipeline_schedule import (PipelinedSchedule, RecordStep, RunStep, TransferStep,
                                                       WaitStep, step_maker)
from torch_tessera.target.costs import CostTable, Topology

#: Seconds one cross-device wait adds to the waiting stream (an event wait resolved on the GPU): one
#: cross-partition event wait inside one CUDA graph on an H200 split 104 + 24 SMs. Source: docs/BENCHMARKS.md, cut
#: diagnosis.
WAIT_SECONDS = 0.63e-6

_RUN, _TRANSFER, _RECORD, _WAIT = map(step_maker, (RunStep, TransferStep, RecordStep, WaitStep))

#: orders among ready launches of one device: ``"micro-batch"`` (lowest micro-batch first, then program order) or
#: ``"critical-path"`` (longest remaining path first, then micro-batch)
PRIORITIES = ("micro-batch", "critical-path")


def placement_map(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int] | np.ndarray) -> dict[int, int]:
    """``placement`` as ``launch -> device``: a mapping, or a sequence in sorted launch order.

    Raises:
        ConfigError: a launch of the DAG has no device.
    """
    return _placement_of(sorted(dag.graph.nodes), placement)


def _placement_of(nodes: Sequence[int], placement) -> dict[int, int]:
    """:func:`placement_map` over the sorted launches ``nodes``."""
    if isinstance(placement, Mapping):
        out = {int(k): int(v) for k, v in placement.items()}
    else:
        arr = np.asarray(placement)
        seq = arr.tolist()
        if len(seq) != len(nodes):
            raise ConfigError(f"placement has {len(seq)} devices for {len(nodes)} launches")
        if arr.dtype.kind in "iu" and arr.ndim == 1:  # Python ints already, one per launch: nothing is missing
            return dict(zip(nodes, seq))
        out = dict(zip(nodes, (int(x) for x in seq)))
    missing = [n for n in nodes if n not in out]
    if missing:
        raise ConfigError(f"placement has no device for launches {missing[:10]}")
    return out


def transfer_seconds(topology: Topology | None, src: int, dst: int, nbytes: int) -> float:
    """Link time of one transfer (0 without a topology)."""
    return topology.transfer_seconds(src, dst, nbytes) if topology is not None else 0.0


@dataclass(frozen=True)
class DagIndex:
    """A DAG's edges by launch position, independent of any placement (compute once per DAG, reuse per placement).

    Attributes:
        nodes: the launches in sorted order (position ``i`` is launch ``nodes[i]``).
        edges: ``(i, j, RAW ranges, RAW bytes)`` per edge, in the DAG's edge order; ranges ``()`` and bytes 0 for an
            edge that only orders (WAR/WAW, or RAW without ranges).
    """

    nodes: tuple[int, ...]
    edges: tuple[tuple[int, int, tuple, int], ...]


def dag_index(dag: DependencyGraph) -> DagIndex:
    """The :class:`DagIndex` of ``dag`` (one pass over its edges)."""
    g = dag.graph
    nodes = sorted(g.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    edges = []
    for u, nbrs in g.adjacency():  # successors, in the order of g.edges
        i = idx[u]
        for v, d in nbrs.items():
            ranges = d["ranges"]
            if ranges and "RAW" in d["kinds"]:
                ranges = tuple(map(tuple, ranges))  # a tuple is kept as it is
                edges.append((i, idx[v], ranges, sum([e - s for _, s, e in ranges])))
            else:
                edges.append((i, idx[v], (), 0))
    return DagIndex(tuple(nodes), tuple(edges))


def build_pipelined_schedule(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int],
                             micro_batches: int = 2, *, costs: CostTable | np.ndarray | None = None,
                             topology: Topology | None = None, domains: Sequence[int] | None = None,
                             wait_seconds: float = WAIT_SECONDS, priority: str = "micro-batch",
                             devices: int | None = None, index: DagIndex | None = None,
                             timeline: "Timeline | None" = None) -> PipelinedSchedule:
    """The pipelined schedule of ``placement`` over ``micro_batches`` copies of ``dag``.

    Args:
        dag: the program's dependency DAG.
        placement: device of every launch (``launch -> device``, or a sequence in sorted launch order).
        micro_batches: micro-batches per step, ``>= 1``.
        costs: seconds of each launch on each device (columns in device order): a cost table or a dense
            ``[launches, D]`` array indexed by launch; ``None``: 1 us each.
        topology: links (bandwidth bytes/s, latency s) for the transfers' time; ``None``: transfers take no time.
        domains: memory domain of each device (SM partitions of one GPU share one); default: each its own.
        wait_seconds: cost of one cross-device wait (:data:`WAIT_SECONDS`).
        priority: one of :data:`PRIORITIES`.
        devices: number of devices (default: ``len(topology.devices)``, else the largest device index + 1).
        index: ``dag_index(dag)``, when the caller keeps it across placements (default: computed here).
        timeline: :func:`list_timeline` of the same placement, micro-batches and arguments, when the caller has it:
            its issue order is used instead of scheduling again (``"micro-batch"`` priority only).

    Returns:
        A schedule that :func:`~torch_tessera.scheduler.pipeline_schedule.check_schedule` accepts.

    Raises:
        ConfigError: ``micro_batches < 1``, an unknown priority, a launch without a device, or a timeline of another
            size or with another priority.
    """
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    if priority not in PRIORITIES:
        raise ConfigError(f"priority {priority!r} is not one of {PRIORITIES}")
    index, place, D, dom, adj = _prepare(dag, placement, topology, domains, devices, index,
                                         timeline.adjacency if timeline is not None else None)
    if timeline is None:
        dur = _durations(adj, place, costs)
        order = _list_schedule(adj, micro_batches, dur, topology, wait_seconds, priority, D)
    elif priority != "micro-batch" or len(timeline.order) != len(adj.nodes) * micro_batches:
        raise ConfigError(f"the timeline has {len(timeline.order)} ops, {len(adj.nodes) * micro_batches} expected "
                          f"({micro_batches} micro-batches, priority {priority!r}); build it with list_timeline for "
                          "this placement and micro-batch count")
    else:
        order = timeline.order
    streams = _emit(adj, order, D, micro_batches)
    nodes = index.nodes
    cut = tuple(sorted((nodes[i], nodes[j]) for j, into in enumerate(adj.pred) for i in into))  # across devices
    return PipelinedSchedule(D, micro_batches, streams, place, dom, cut, source=f"modulo:{priority}")


def serial_schedule(launches: Sequence[int], device: int, micro_batches: int, devices: int,
                    domains: Sequence[int] = ()) -> PipelinedSchedule:
    """The schedule of a program wholly on ``device``: its launches in program order, micro-batch after micro-batch,
    no transfers or waits. It is the schedule :func:`build_pipelined_schedule` builds for such a placement (with
    ``"micro-batch"`` priority every launch of a lower micro-batch is ready before the device is free, and launch
    indices follow the program order, which every DAG edge follows), without running the list scheduler.

    Args:
        launches: the program's launch indices.
        device: the device they all run on.
        micro_batches: micro-batches per step, ``>= 1``.
        devices: number of devices (streams).
        domains: memory domain of each device (default: each its own).

    Raises:
        ConfigError: ``micro_batches < 1`` or ``device`` not below ``devices``.
    """
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    if not 0 <= device < devices:
        raise ConfigError(f"device {device} is not one of the {devices} devices")
    order = sorted(int(v) for v in launches)
    run = tuple(_RUN(device, m, v) for m in range(micro_batches) for v in order)
    streams = tuple(run if d == device else () for d in range(devices))
    dom = tuple(domains) if len(domains) else tuple(range(devices))
    return PipelinedSchedule(devices, micro_batches, streams, dict.fromkeys(order, device), dom, (),
                             source="modulo:micro-batch")


def _prepare(dag, placement, topology, domains, devices, index, adj=None):
    """``(index, launch -> device, D, domains, adjacency)`` of a placement (shared by the entry functions); ``adj``
    (a timeline's) is reused when it was built from the same ``index``, devices and domains."""
    index = index if index is not None else dag_index(dag)
    place = _placement_of(index.nodes, placement)
    D = devices or (len(topology.devices) if topology is not None else max(place.values(), default=0) + 1)
    dom = tuple(domains) if domains is not None else tuple(range(D))
    if adj is None or adj.index is not index or adj.dom != dom or adj.dev != [place[n] for n in adj.nodes]:
        adj = _Adjacency(index, place, dom)
    return index, place, D, dom, adj


def _durations(adj: "_Adjacency", place: Mapping[int, int], costs) -> list[float]:
    """Seconds of each launch position on its device: a cost table, a dense ``[launches, D]`` array indexed by
    launch, or ``None`` (1 us each)."""
    if costs is None:
        return [1e-6] * len(adj.nodes)
    if isinstance(costs, np.ndarray):
        return costs[np.asarray(adj.nodes, dtype=np.int64), np.asarray(adj.dev, dtype=np.int64)].tolist()
    return [float(costs.row(v)[d]) for v, d in zip(adj.nodes, adj.dev)]


class _Adjacency:
    """The DAG as integer lists in sorted launch order, with each edge's kind under the placement (internal).

    Per launch position ``i``, its out-edges in the DAG's edge order by kind: ``local[i]``: ``j`` on the same device;
    ``waits[i]``: ``(j, device)`` on another device with nothing to move; ``sends[i]``: ``(j, device, bytes)`` a RAW
    edge across memory domains moves. ``pred[i]``: ``j`` of the edges into ``i`` on other devices, ascending;
    ``moves[i]``: ``(j, ranges, bytes)`` of ``sends[i]``, ascending (the order the transfers are emitted in)."""

    def __init__(self, index: DagIndex, place: Mapping[int, int], dom: Sequence[int]):
        self.nodes, edges = list(index.nodes), index.edges
        self.index, self.dom = index, tuple(dom)
        self.dev = dev = [place[n] for n in self.nodes]
        n = len(self.nodes)
        self.local: list[list[int]] = [[] for _ in range(n)]
        self.waits: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.sends: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        self.indeg = [0] * n
        self.cross = [False] * n  # has a consumer on another device
        self.moves: list[list[tuple[int, tuple, int]]] = [[] for _ in range(n)]
        for i, j, ranges, nb in edges:
            self.indeg[j] += 1
            du, dv = dev[i], dev[j]
            if du == dv:
                self.local[i].append(j)
                continue
            self.pred[j].append(i)
            self.cross[i] = True
            if nb and dom[du] != dom[dv]:
                self.sends[i].append((j, dv, nb))
                self.moves[i].append((j, ranges, nb))
            else:
                self.waits[i].append((j, dv))
        for lst in self.pred:
            if len(lst) > 1:
                lst.sort()
        for lst in self.moves:
            if len(lst) > 1:
                lst.sort()


@dataclass(frozen=True)
class Timeline:
    """The list scheduler's predicted timeline of one placement (see :func:`list_timeline`).

    Attributes:
        order: ops ``m * n + i`` (micro-batch ``m``, ``i``-th launch in sorted order) in issue order.
        step_seconds: the timeline's makespan.
        occupied: ``[D]`` seconds each device's stream is occupied (launches and the transfers it pushes).
        adjacency: the placement's edges as the list scheduler read them (internal: lets
            :func:`build_pipelined_schedule` skip classifying them again; not compared).
    """

    order: tuple[int, ...]
    step_seconds: float
    occupied: tuple[float, ...]
    adjacency: "_Adjacency | None" = field(default=None, compare=False, repr=False)


def list_timeline(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int], micro_batches: int = 2, *,
                  costs: CostTable | np.ndarray | None = None, topology: Topology | None = None,
                  domains: Sequence[int] | None = None, wait_seconds: float = WAIT_SECONDS,
                  devices: int | None = None, index: DagIndex | None = None) -> Timeline:
    """The timeline :func:`predicted_step` reads, with the issue order :func:`build_pipelined_schedule` takes
    (``"micro-batch"`` priority). Arguments as for :func:`build_pipelined_schedule`; ``costs`` may also be a dense
    ``[launches, D]`` array indexed by launch.

    Raises:
        ConfigError: ``micro_batches < 1`` or a launch without a device.
    """
    if micro_batches < 1:
        raise ConfigError(f"micro_batches must be >= 1, got {micro_batches}")
    _, place, D, _, adj = _prepare(dag, placement, topology, domains, devices, index)
    timing: list = []
    order = _list_schedule(adj, micro_batches, _durations(adj, place, costs), topology, wait_seconds, "micro-batch",
                           D, timing)
    return Timeline(tuple(order), timing[0], tuple(timing[1]), adj)


def predicted_step(dag: DependencyGraph, placement: Mapping[int, int] | Sequence[int], micro_batches: int = 2, *,
                   costs: CostTable | None = None, topology: Topology | None = None,
                   domains: Sequence[int] | None = None, wait_seconds: float = WAIT_SECONDS,
                   devices: int | None = None, index: DagIndex | None = None) -> tuple[float, list[float]]:
    """The list scheduler's own timeline of the schedule :func:`build_pipelined_schedule` would build: ``(step
    seconds, per-device seconds its stream is occupied)``, without building the steps. A cheap surrogate of
    :func:`~torch_tessera.scheduler.simulate.simulate` without bandwidth sharing: it delays every cross-device edge
    by a wait but lets a wait overlap the stream's earlier work, where the schedule keeps fewer waits that each
    occupy the stream; on the test DAGs it came out 0-14 % below the simulated step, never above
    (tests/scheduler/test_pipeline_plan.py). Arguments as for :func:`build_pipelined_schedule`."""
    tl = list_timeline(dag, placement, micro_batches, costs=costs, topology=topology, domains=domains,
                       wait_seconds=wait_seconds, devices=devices, index=index)
    return tl.step_seconds, list(tl.occupied)


def _list_schedule(adj: _Adjacency, M, dur, topology, wait_s, priority, D, timing: list | None = None) -> list[int]:
    """Ops ``m * n + i`` (micro-batch ``m``, launch ``adj.nodes[i]``) in the order the predicted timeline issues
    them (each device's issue order is its subsequence; every producer precedes its consumers). ``timing``, when
    given, receives the timeline's makespan and each device's occupied seconds.

    Each device, when free, takes its ready op of lowest key (``op``, or ``(-rank, op)`` for ``"critical-path"``;
    keys are unique, so the order does not depend on how ties in ready time are pushed)."""
    n = len(adj.nodes)
    dev = adj.dev
    local, waits, pushes = adj.local, adj.waits, _pushes(adj, topology)
    if priority == "critical-path":
        rank = _upward_rank(adj, dur)
        key: list = [(-rank[op % n], op) for op in range(n * M)]
    else:
        key = list(range(n * M))
    pending = adj.indeg * M
    ready_at = [0.0] * (n * M)
    waiting: list[list] = [[] for _ in range(D)]  # (ready time, key, op)
    avail: list[list] = [[] for _ in range(D)]  # (key, ready time, op)
    free = [0.0] * D
    busy = [0.0] * D
    push, pop = heapq.heappush, heapq.heappop
    for op in range(n * M):
        if pending[op] == 0:
            push(waiting[dev[op % n]], (0.0, key[op], op))
    order: list[int] = []
    inf = float("inf")
    devices = range(D)
    for _ in range(n * M):
        d, best_t = -1, inf
        for e in devices:
            if avail[e]:
                t = free[e]
            elif waiting[e]:
                t = waiting[e][0][0]
                if free[e] > t:
                    t = free[e]
            else:
                continue
            if t < best_t:
                d, best_t = e, t
        wq, aq = waiting[d], avail[d]
        while wq and wq[0][0] <= best_t:
            r, p, op = pop(wq)
            push(aq, (p, r, op))
        _, r, op = pop(aq)
        i = op % n
        base = op - i
        began = free[d] if free[d] > r else r
        finish = began + dur[i]
        t = finish
        for _, _, secs in pushes[i]:
            t += secs
        busy[d] += t - began
        free[d] = t
        # A successor whose last input arrives by the time its device is free goes straight to that device's
        # ready heap: it would be moved there the next time the device is chosen anyway (free[e] only changes then).
        for j in local[i]:  # consumers on this device: ready when the launch ends
            k = base + j
            if finish > ready_at[k]:
                ready_at[k] = finish
            pending[k] -= 1
            if not pending[k]:
                if ready_at[k] <= t:
                    push(aq, (key[k], ready_at[k], k))
                else:
                    push(wq, (ready_at[k], key[k], k))
        arrive = finish + wait_s
        for j, e in waits[i]:  # on another device, nothing to move: a wait after the launch
            k = base + j
            if arrive > ready_at[k]:
                ready_at[k] = arrive
            pending[k] -= 1
            if not pending[k]:
                if ready_at[k] <= free[e]:
                    push(avail[e], (key[k], ready_at[k], k))
                else:
                    push(waiting[e], (ready_at[k], key[k], k))
        sent = finish
        for j, e, secs in pushes[i]:  # transfers, one after another on this stream, then a wait
            sent += secs
            a = sent + wait_s
            k = base + j
            if a > ready_at[k]:
                ready_at[k] = a
            pending[k] -= 1
            if not pending[k]:
                if ready_at[k] <= free[e]:
                    push(avail[e], (key[k], ready_at[k], k))
                else:
                    push(waiting[e], (ready_at[k], key[k], k))
        order.append(op)
    if timing is not None:
        timing[:] = [max(free, default=0.0), busy]
    return order


def _pushes(adj: _Adjacency, topology) -> list[list[tuple[int, int, float]]]:
    """Per launch position, its transfers in stream order as ``(j, device, seconds)``."""
    dev = adj.dev
    link: dict = {}
    out: list[list] = []
    for i, sends in enumerate(adj.sends):
        row = []
        for j, e, nbytes in sends:
            k = (dev[i], e, nbytes)
            secs = link.get(k)
            if secs is None:
                secs = link[k] = transfer_seconds(topology, dev[i], e, nbytes)
            row.append((j, e, secs))
        out.append(row)
    return out


def _upward_rank(adj: _Adjacency, dur: Sequence[float]) -> list[float]:
    """Longest path (seconds of launches) from each launch to the end of the program."""
    rank = [0.0] * len(adj.nodes)
    for i in range(len(adj.nodes) - 1, -1, -1):
        after = [rank[j] for j in adj.local[i]] + [rank[w[0]] for w in adj.waits[i]]
        after += [rank[x[0]] for x in adj.sends[i]]
        rank[i] = dur[i] + max(after, default=0.0)
    return rank


def _emit(adj: _Adjacency, order: Sequence[int], D: int, M: int) -> tuple[tuple, ...]:
    """The streams of ``order``: runs, transfers after producers, records, and the waits vector clocks need."""
    n = len(adj.nodes)
    nodes, dev, pred, moves, has_cross = adj.nodes, adj.dev, adj.pred, adj.moves, adj.cross
    streams: list[list] = [[] for _ in range(D)]
    know = [[-1] * D for _ in range(D)]  # know[d][e]: last position on e's stream known done on d's stream
    wait_know: list[list[list[int]]] = [[[] for _ in range(D)] for _ in range(D)]  # [d][e] -> know[e] after wait k
    wait_refs: list[list[tuple[int, list, list]]] = [[] for _ in range(D)]  # [d] -> (micro-batch, edges, others)
    wait_at: list[list[tuple[int, int, int]]] = [[] for _ in range(D)]  # [d] -> (position, micro-batch, event)
    record_at: list[list[tuple[int, int]]] = [[] for _ in range(D)]  # [d] -> (position, event)
    record: dict[int, tuple[int, int, list[int]]] = {}  # op -> (event, position, clock)
    run_step, transfer_step, record_step = _RUN, _TRANSFER, _RECORD
    for op in order:
        m, i = divmod(op, n)
        d = dev[i]
        st = streams[d]
        v = nodes[i]
        kd = know[d]
        for j in pred[i]:
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
            wait_at[d].append((len(st), m, ev))
            st.append(None)  # the WaitStep, made once its edges are all known
            kd = know[d] = [a if a > b else b for a, b in zip(kd, clock)]
            kd[d] = len(st) - 1
            wait_refs[d].append((m, edges, others))
            for known, x in zip(wait_know[d], kd):
                known.append(x)
        st.append(run_step(d, m, v))
        kd[d] = len(st) - 1
        if not has_cross[i]:
            continue
        for j, ranges, nb in moves[i]:
            st.append(transfer_step(d, dev[j], m, (v, nodes[j]), ranges, nb, "cut"))
        record_at[d].append((len(st), op))
        st.append(record_step(d, m, op))
        kd[d] = len(st) - 1
        record[op] = (op, len(st) - 1, list(kd))
    used = {ev for at in wait_at for _, _, ev in at}
    out = []
    for d, st in enumerate(streams):
        for (k, m, ev), (_, edges, others) in zip(wait_at[d], wait_refs[d]):
            st[k] = _WAIT(d, m, ev, tuple(edges), tuple(others))
        drop = [k for k, ev in record_at[d] if ev not in used]  # ascending
        if not drop:
            out.append(tuple(st))
            continue
        kept: list = []
        at = 0
        for k in drop:
            kept += st[at:k]
            at = k + 1
        kept += st[at:]
        out.append(tuple(kept))
    return tuple(out)
