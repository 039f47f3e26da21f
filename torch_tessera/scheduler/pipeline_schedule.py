"""The explicit pipelined schedule: per device, the exact issue order of (micro-batch, launch), each transfer, and the
records and waits between devices. The single source of truth for what runs: the simulator
(:mod:`torch_tessera.scheduler.simulate`) predicts it, the runtime replays it, the Gantt chart draws it.

Contract of a :class:`PipelinedSchedule` (what :func:`check_schedule` enforces):

* Every device has ONE in-order stream (``streams[d]``): a step starts after the step before it on that stream.
* Micro-batches touch disjoint storage except PARAMETER buffers (read only), so every hazard is between two launches
  of ONE micro-batch: the DAG's RAW/WAR/WAW edges, replicated per micro-batch. One replay of the schedule runs every
  micro-batch once (one pipeline step); the runtime fences between replays.
* An edge ``(u, v)`` of micro-batch ``m`` with both launches on one device is covered by the issue order (``u``
  before ``v`` on the stream).
* An edge across devices is covered by a :class:`WaitStep` on ``v``'s device, issued before ``v``, that NAMES the
  edge (in ``edges`` when the wait is micro-batch ``m``'s, else in ``other_edges``), and whose event is recorded
  (:class:`RecordStep`) after ``u`` ran (happens-before through streams and earlier waits).
* A RAW edge carrying bytes between devices of different memory domains also needs a :class:`TransferStep` of that
  edge and micro-batch, after ``u`` and before ``v``. Between devices of one memory domain (SM partitions of one GPU)
  the consumer reads the producer's bytes in place: the cut is an event wait with no bytes. The same holds for WAR
  and WAW edges (ordering only): every dependency across devices is a wait.
* Inputs, weights, static inputs and gathers (the purposes of :class:`torch_tessera.runtime.schedule.CopyStep`) are
  the runtime's per-call and setup copies around the pipelined steps; a :class:`TransferStep` of purpose
  ``"input"`` / ``"gather"`` (``edge=None``) may carry them in a stream, and is not checked against the DAG.

The runtime imports this module; it never imports the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Mapping, Sequence

import numpy as np

from torch_tessera.errors import ScheduleError
from torch_tessera.graph.types import DependencyGraph

#: purposes of a :class:`TransferStep` (the vocabulary of ``runtime.schedule.CopyStep.purpose``)
TRANSFER_PURPOSES = ("cut", "input", "gather")


@dataclass(frozen=True)
class RunStep:
    """Launch ``launch`` (program index) of micro-batch ``micro_batch`` on device ``device``'s stream."""

    device: int
    micro_batch: int
    launch: int


@dataclass(frozen=True)
class TransferStep:
    """Move the bytes of one cut edge of one micro-batch from device ``src`` to ``dst`` (a push: issued on ``src``'s
    stream, after the producer, writing into ``dst``'s storage of the buffers).

    Attributes:
        src / dst: device indices.
        micro_batch: the micro-batch whose storage moves.
        edge: the DAG edge ``(producer, consumer)``; ``None`` for ``"input"`` / ``"gather"`` transfers.
        ranges: ``(buffer, start, end)`` byte ranges (half-open) moved, the edge's RAW ranges for a cut.
        nbytes: total bytes moved (sum of the ranges' lengths).
        purpose: one of :data:`TRANSFER_PURPOSES`.
    """

    src: int
    dst: int
    micro_batch: int
    edge: tuple[int, int] | None
    ranges: tuple[tuple[str, int, int], ...]
    nbytes: int
    purpose: str = "cut"

    @property
    def device(self) -> int:
        """The stream the transfer is issued on (``src``)."""
        return self.src


@dataclass(frozen=True)
class RecordStep:
    """Record event ``event_id`` on device ``device``'s stream: it completes when everything issued before it there
    has completed. Each event is recorded exactly once per replay."""

    device: int
    micro_batch: int
    event_id: int


@dataclass(frozen=True)
class WaitStep:
    """Make device ``device``'s stream wait for event ``event_id`` (recorded on another device's stream).

    Attributes:
        device: the waiting stream.
        micro_batch: the micro-batch whose edges the wait covers.
        event_id: the :class:`RecordStep` waited for.
        edges: the DAG edges ``(producer, consumer)`` (RAW, WAR or WAW) this wait covers: each producer ran before
            the event, each consumer is issued after the wait on this stream.
        other_edges: edges of OTHER micro-batches this wait covers too, as ``(producer, consumer, micro_batch)``
            (their producer ran before the event: a later micro-batch's consumer after an earlier one's wait).
    """

    device: int
    micro_batch: int
    event_id: int
    edges: tuple[tuple[int, int], ...] = ()
    other_edges: tuple[tuple[int, int, int], ...] = ()


Step = RunStep | TransferStep | RecordStep | WaitStep


def step_maker(cls: type) -> "Callable[..., Step]":
    """A function ``make(*values)`` equal to ``cls(*values)`` (every field given, in order) for a step class: the same
    object, its fields in its ``__dict__`` as the generated ``__init__`` leaves them, without that ``__init__``'s
    ``object.__setattr__`` per field (frozen dataclasses), which dominates building a schedule of thousands of steps.

    Raises:
        TypeError: ``cls`` is not one of the step classes.
    """
    if cls not in (RunStep, TransferStep, RecordStep, WaitStep):
        raise TypeError(f"step_maker: {cls!r} is not a step class")
    names = tuple(f.name for f in fields(cls))
    new = object.__new__
    if len(names) == 3:  # RunStep, RecordStep: the hot case, without zip
        a, b, c = names

        def make3(x, y, z):
            obj = new(cls)
            d = obj.__dict__
            d[a] = x
            d[b] = y
            d[c] = z
            return obj
        return make3

    def make(*values):
        obj = new(cls)
        obj.__dict__.update(zip(names, values))
        return obj
    return make


@dataclass(frozen=True)
class PipelinedSchedule:
    """One pipeline step: every micro-batch's launches, transfers, records and waits, per device in issue order.

    Attributes:
        devices: number of devices (streams).
        micro_batches: micro-batches in flight per step, ``M >= 1``; micro-batch ``m`` runs every launch once.
        streams: ``streams[d]`` is device ``d``'s steps in the exact order they are issued.
        placement: launch index -> device index (the same for every micro-batch).
        domains: memory domain of each device (devices of one domain share storage: SM partitions of one GPU).
        cut_edges: DAG edges ``(u, v)`` whose launches are on different devices (any kind), per micro-batch.
        source: what built it (``"modulo"``, ``"hand"``...), for reports.
    """

    devices: int
    micro_batches: int
    streams: tuple[tuple[Step, ...], ...]
    placement: Mapping[int, int]
    domains: tuple[int, ...] = ()
    cut_edges: tuple[tuple[int, int], ...] = ()
    source: str = "unspecified"
    notes: tuple[str, ...] = field(default=())

    def steps(self, kind: type | None = None) -> list[Step]:
        """Every step (optionally only those of type ``kind``), device by device in issue order."""
        return [s for st in self.streams for s in st if kind is None or isinstance(s, kind)]

    @property
    def num_waits(self) -> int:
        return sum(isinstance(s, WaitStep) for st in self.streams for s in st)

    @property
    def transfer_bytes(self) -> int:
        """Bytes moved per step by all transfers."""
        return sum(s.nbytes for st in self.streams for s in st if isinstance(s, TransferStep))

    def domain(self, device: int) -> int:
        return self.domains[device] if self.domains else device


def happens_before_clocks(schedule: PipelinedSchedule) -> list[np.ndarray]:
    """Vector clocks of every step: ``clocks[d][i, e]`` is the largest position on device ``e``'s stream that
    happens before (or is) step ``i`` of device ``d`` (-1: none), through stream order and record -> wait.

    Raises:
        ScheduleError: an event is recorded twice or never, or the waits deadlock (names the blocked waits).
    """
    D = schedule.devices
    if len(schedule.streams) != D:
        raise ScheduleError(f"schedule has {len(schedule.streams)} streams for {D} devices")
    records: dict[int, tuple[int, int]] = {}
    for d, st in enumerate(schedule.streams):
        for i, s in enumerate(st):
            if isinstance(s, RecordStep):
                if s.event_id in records:
                    raise ScheduleError(f"event {s.event_id} is recorded twice (device {records[s.event_id][0]} "
                                        f"and device {d}); each event is recorded once per step",
                                        micro_batch=s.micro_batch)
                records[s.event_id] = (d, i)
    for d, st in enumerate(schedule.streams):
        for s in st:
            if isinstance(s, WaitStep) and s.event_id not in records:
                raise ScheduleError(f"device {d} waits for event {s.event_id} (micro-batch {s.micro_batch}, edges "
                                    f"{list(s.edges)[:4]}) that no step records", micro_batch=s.micro_batch)
    clocks = [np.full((len(st), D), -1, dtype=np.int64) for st in schedule.streams]
    pos = [0] * D
    done = 0
    total = sum(len(st) for st in schedule.streams)
    while done < total:
        progressed = False
        for d, st in enumerate(schedule.streams):
            while pos[d] < len(st):
                i, s = pos[d], st[pos[d]]
                vc = clocks[d][i - 1].copy() if i else np.full(D, -1, dtype=np.int64)
                if isinstance(s, WaitStep):
                    rd, ri = records[s.event_id]
                    if ri >= pos[rd]:
                        break  # its record is not issued yet
                    np.maximum(vc, clocks[rd][ri], out=vc)
                vc[d] = i
                clocks[d][i] = vc
                pos[d] += 1
                done += 1
                progressed = True
        if not progressed:
            blocked = [(d, schedule.streams[d][pos[d]]) for d in range(D) if pos[d] < len(schedule.streams[d])]
            d, w = blocked[0]
            raise ScheduleError(f"the waits deadlock: device {d} waits for event {w.event_id} (micro-batch "
                                f"{w.micro_batch}, edges {list(w.edges)[:4]}), recorded after a wait that can never "
                                f"complete; blocked streams: {[b for b, _ in blocked]}",
                                edge=w.edges[0] if w.edges else None, micro_batch=w.micro_batch)
    return clocks


def check_schedule(schedule: PipelinedSchedule, dag: DependencyGraph) -> None:
    """Refuse a schedule that does not compute what the program computes (see the module's contract).

    Args:
        schedule: the schedule.
        dag: the program's dependency DAG (its edges, per micro-batch, are what must be covered).

    Raises:
        ScheduleError: naming the first problem found: a launch missing, run twice or on the wrong device; an edge
            on one device issued out of order; an edge across devices no wait names or whose named wait does not
            follow the producer / precede the consumer; a cut with no transfer, or one outside its producer and
            consumer; an event recorded twice or never; a deadlock.
    """
    clocks = happens_before_clocks(schedule)
    M, D = schedule.micro_batches, schedule.devices
    place = schedule.placement
    run_at: dict[tuple[int, int], tuple[int, int]] = {}
    waits_by_edge: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    transfers: dict[tuple[int, int, int], tuple[int, int, TransferStep]] = {}
    for d, st in enumerate(schedule.streams):
        for i, s in enumerate(st):
            if isinstance(s, RunStep):
                key = (s.launch, s.micro_batch)
                if key in run_at:
                    raise ScheduleError(f"launch {s.launch} of micro-batch {s.micro_batch} is run twice",
                                        micro_batch=s.micro_batch)
                if s.device != d or place.get(s.launch) != d:
                    raise ScheduleError(f"launch {s.launch} of micro-batch {s.micro_batch} is on device {d}'s "
                                        f"stream, but placed on device {place.get(s.launch)}",
                                        micro_batch=s.micro_batch)
                run_at[key] = (d, i)
            elif isinstance(s, WaitStep):
                for u, v in s.edges:
                    waits_by_edge.setdefault((u, v, s.micro_batch), []).append((d, i))
                for u, v, m in s.other_edges:
                    waits_by_edge.setdefault((u, v, m), []).append((d, i))
            elif isinstance(s, TransferStep) and s.purpose == "cut" and s.edge is not None:
                transfers[(s.edge[0], s.edge[1], s.micro_batch)] = (d, i, s)
    for n in dag.graph.nodes:
        for m in range(M):
            if (n, m) not in run_at:
                raise ScheduleError(f"launch {n} of micro-batch {m} is never run (placed on device {place.get(n)})",
                                    micro_batch=m)
    if len(run_at) != dag.graph.number_of_nodes() * M:
        extra = sorted(k for k in run_at if k[0] not in dag.graph or not 0 <= k[1] < M)
        raise ScheduleError(f"runs of launches or micro-batches the program does not have: {extra[:5]}")

    def hb(a: tuple[int, int], b: tuple[int, int]) -> bool:
        return clocks[b[0]][b[1], a[0]] >= a[1]

    for u, v, data in dag.graph.edges(data=True):  # the issue order on one device first
        for m in range(M):
            ru, rv = run_at[(u, m)], run_at[(v, m)]
            if ru[0] == rv[0] and ru[1] > rv[1]:
                raise ScheduleError(f"{'/'.join(sorted(data['kinds']))} edge ({u}, {v}) of micro-batch {m}: both on "
                                    f"device {ru[0]}, but launch {v} is issued before launch {u}",
                                    edge=(u, v), micro_batch=m)
    for u, v, data in dag.graph.edges(data=True):
        kinds = "/".join(sorted(data["kinds"]))
        for m in range(M):
            ru, rv = run_at[(u, m)], run_at[(v, m)]
            if ru[0] == rv[0]:
                continue
            named = [w for w in waits_by_edge.get((u, v, m), []) if w[0] == rv[0] and w[1] < rv[1]]
            if not named:
                raise ScheduleError(f"{kinds} edge ({u}, {v}) of micro-batch {m}, device {ru[0]} -> {rv[0]}: no wait "
                                    f"on device {rv[0]} before launch {v} covers it", edge=(u, v), micro_batch=m)
            if not any(hb(ru, w) for w in named):
                raise ScheduleError(f"{kinds} edge ({u}, {v}) of micro-batch {m}, device {ru[0]} -> {rv[0]}: the "
                                    f"wait naming it waits for an event recorded before launch {u} ran",
                                    edge=(u, v), micro_batch=m)
            if "RAW" in data["kinds"] and data["ranges"] and schedule.domain(ru[0]) != schedule.domain(rv[0]):
                _check_transfer(transfers.get((u, v, m)), data["ranges"], (u, v), m, ru, rv, hb)


def _check_transfer(found, ranges, edge, m, ru, rv, hb) -> None:
    """The transfer of cut ``edge`` in micro-batch ``m`` exists, moves the edge's ranges, and runs between its
    producer (at stream position ``ru``) and consumer (``rv``)."""
    u, v = edge
    if found is None:
        raise ScheduleError(f"RAW edge ({u}, {v}) of micro-batch {m} crosses memory domains (device {ru[0]} -> "
                            f"{rv[0]}) but has no transfer", edge=edge, micro_batch=m)
    d, i, t = found
    if (t.src, t.dst) != (ru[0], rv[0]) or not set(tuple(r) for r in ranges) <= set(t.ranges):
        raise ScheduleError(f"the transfer of RAW edge ({u}, {v}) of micro-batch {m} moves {list(t.ranges)} "
                            f"{t.src} -> {t.dst}; the edge needs {list(ranges)} {ru[0]} -> {rv[0]}",
                            edge=edge, micro_batch=m)
    if not hb(ru, (d, i)) or not hb((d, i), rv):
        raise ScheduleError(f"the transfer of RAW edge ({u}, {v}) of micro-batch {m} is not ordered after launch "
                            f"{u} and before launch {v}", edge=edge, micro_batch=m)


def stream_summary(schedule: PipelinedSchedule) -> list[dict[str, int]]:
    """Per device: counts of runs, transfers, records and waits (for reports and logs)."""
    out = []
    for st in schedule.streams:
        out.append({k.__name__: sum(isinstance(s, k) for s in st)
                    for k in (RunStep, TransferStep, RecordStep, WaitStep)})
    return out


def micro_batch_order(schedule: PipelinedSchedule, device: int) -> Sequence[tuple[int, int]]:
    """``(micro_batch, launch)`` of device ``device``'s runs, in issue order."""
    return [(s.micro_batch, s.launch) for s in schedule.streams[device] if isinstance(s, RunStep)]


def receive_points(schedule: PipelinedSchedule) -> dict[int, dict[int, list[TransferStep]]]:
    """Where a transport with one memory per device lands each transfer: for every :class:`TransferStep` between
    different memory domains, the first step of the destination's stream that the transfer happens before (through
    stream order and record -> wait: in a checked schedule, the wait that consumes it).

    Landing the bytes just before that step is exactly as ordered as the schedule says: every step of the destination
    the transfer must follow (one reading the old bytes, a WAR edge) is issued before it, every step that reads the
    new bytes at or after it. Per (source, destination) pair the transfers land in the order the source issues them,
    so a transport that matches messages in posting order pairs them right.

    Args:
        schedule: the schedule.

    Returns:
        ``{destination device: {stream position: [transfers, in the order they land]}}``; a position equal to the
        length of the destination's stream means after its last step (the transfer precedes none of its steps).

    Raises:
        ScheduleError: as :func:`happens_before_clocks` (an event recorded twice or never, a deadlock).
    """
    clocks = happens_before_clocks(schedule)
    out: dict[int, dict[int, list[TransferStep]]] = {}
    for src, st in enumerate(schedule.streams):
        for i, s in enumerate(st):
            if not isinstance(s, TransferStep) or schedule.domain(s.src) == schedule.domain(s.dst):
                continue
            known = clocks[s.dst][:, src]  # nondecreasing along the destination's stream
            at = int(np.searchsorted(known, i, side="left"))
            out.setdefault(s.dst, {}).setdefault(at, []).append(s)
    return out


# -- JSON-ready data (plan cache, dumps) ----------------------------------------------------------------------------

_TAGS = {RunStep: "R", TransferStep: "T", RecordStep: "C", WaitStep: "W"}


def schedule_to_data(schedule: PipelinedSchedule) -> dict:
    """``schedule`` as JSON-ready lists and dicts (:func:`schedule_from_data` reads it back equal).

    Each step is one short list, tagged ``"R"`` (runs: device, micro-batch, then the launches of consecutive runs of
    that device and micro-batch), ``"T"`` (transfer: src, dst, micro-batch, edge or ``None``, ranges, bytes,
    purpose), ``"C"`` (record: device, micro-batch, event) or ``"W"`` (wait: device, micro-batch, event, edges, other
    edges). ``placement`` is flat: launch, device, launch, device..."""
    def rows(st) -> list:
        out: list = []
        last = None  # the open "R" row
        for s in st:
            tag = _TAGS[type(s)]
            if tag == "R":
                if last is not None and last[1] == s.device and last[2] == s.micro_batch:
                    last.append(s.launch)
                else:
                    last = [tag, s.device, s.micro_batch, s.launch]
                    out.append(last)
                continue
            last = None
            if tag == "C":
                out.append([tag, s.device, s.micro_batch, s.event_id])
            elif tag == "T":
                out.append([tag, s.src, s.dst, s.micro_batch, None if s.edge is None else list(s.edge),
                            [list(r) for r in s.ranges], s.nbytes, s.purpose])
            else:
                out.append([tag, s.device, s.micro_batch, s.event_id, [list(e) for e in s.edges],
                            [list(e) for e in s.other_edges]])
        return out

    return {"devices": schedule.devices, "micro_batches": schedule.micro_batches,
            "streams": [rows(st) for st in schedule.streams],
            "placement": [int(x) for kv in schedule.placement.items() for x in kv],
            "domains": list(schedule.domains), "cut_edges": [list(e) for e in schedule.cut_edges],
            "source": schedule.source, "notes": list(schedule.notes)}


_MAKERS = tuple(step_maker(c) for c in (RunStep, RecordStep, TransferStep, WaitStep))


def schedule_from_data(data: Mapping) -> PipelinedSchedule:
    """The schedule :func:`schedule_to_data` wrote.

    Raises:
        ValueError: a step with an unknown tag or a wrong number of entries.
        KeyError / TypeError: a field missing or of the wrong shape.
    """
    run, record, transfer, wait = _MAKERS

    def steps(st: Sequence) -> tuple:
        out: list = []
        for r in st:
            tag = r[0]
            if tag == "R" and len(r) >= 4:
                d, m = r[1], r[2]
                out += [run(d, m, v) for v in r[3:]]
            elif tag == "C" and len(r) == 4:
                out.append(record(r[1], r[2], r[3]))
            elif tag == "T" and len(r) == 8:
                out.append(transfer(r[1], r[2], r[3], None if r[4] is None else (r[4][0], r[4][1]),
                                    tuple((b, s, e) for b, s, e in r[5]), r[6], r[7]))
            elif tag == "W" and len(r) == 6:
                out.append(wait(r[1], r[2], r[3], tuple((u, v) for u, v in r[4]),
                                tuple((u, v, m) for u, v, m in r[5])))
            else:
                raise ValueError(f"schedule step {list(r)[:8]!r}: not a step (tags R: 4 entries or more, C: 4, "
                                 "T: 8, W: 6)")
        return tuple(out)

    flat = data["placement"]
    return PipelinedSchedule(int(data["devices"]), int(data["micro_batches"]),
                             tuple(steps(st) for st in data["streams"]),
                             dict(zip(flat[0::2], flat[1::2])), tuple(data["domains"]),
                             tuple((u, v) for u, v in data["cut_edges"]), data["source"], tuple(data["notes"]))
