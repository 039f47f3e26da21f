"""Event-driven simulator of a :class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`: the predicted
step time, per-device busy and idle time, and every step's start and end.

Semantics (the schedule's contract): each device's stream runs its steps in order, one at a time.

* A :class:`RunStep` takes its launch's cost on its device (the cost table), stretched while partitions of the same
  memory domain (SM partitions of one GPU) together ask for more DRAM bandwidth than the GPU has, and while another
  partition of the domain runs a launch (below).
* A :class:`TransferStep` takes ``latency + bytes / bandwidth`` of its link on the producer's stream (a push).
* A :class:`RecordStep` takes no time: its event completes when the steps before it on its stream have.
* A :class:`WaitStep` starts once its event has completed and the stream is free, and takes ``wait_seconds``.

Bandwidth sharing. A launch of ``c`` seconds moving ``b`` bytes asks for ``b / c`` bytes/s (at most its device's own
bandwidth). While the launches running in one memory domain ask for more than the domain's bandwidth ``B``, ``B`` is
shared max-min fairly (water-filling), weighted by each device's :attr:`MemoryShare.weights` (a partition's SM
count: docs/BENCHMARKS.md, cut diagnosis), and each
launch progresses at ``granted / asked`` of its solo speed: a memory-bound launch stretches, a compute-bound one
(small ``b / c``) hardly does. This is the roofline ``time = max(compute, bytes / bandwidth)`` with the bandwidth a
launch gets at each moment.

Co-run. While launches of two or more devices of one memory domain run at once, each progresses at no more than
:attr:`MemoryShare.corun_rate` of its solo speed (the smaller of that and its bandwidth share): partitions of one GPU
slow each other down beyond their DRAM (docs/BENCHMARKS.md, partition co-run).

Host issue. With ``host`` (:class:`~torch_tessera.scheduler.issue.HostIssue`), the schedule is replayed step by step
from the host: the host issues the steps one after another in the runtime's order
(:func:`~torch_tessera.scheduler.issue.issue_order`), each at a host cost, and no step starts before it is issued; the
step then runs from the host's start (time 0). Without it (a replay captured as one CUDA graph) issue takes no time.

Graph overlap. With ``graph`` (:class:`~torch_tessera.scheduler.issue.GraphIssue`, a replay captured as one CUDA graph
with launch costs timed between CUDA events), a launch that follows another launch on its stream (records between
them skipped; a wait or transfer between them breaks the chain) takes ``graph.overlap`` seconds less than its cost,
never below 0 (:func:`graph_overlap`): its launch latency hides behind the previous kernel. With ``graph.call``
(:class:`~torch_tessera.scheduler.issue.CallCost`), the step also holds what each call costs outside the graph (host
work while the GPU idles, the input copies and output clones): added to the step and to every device's idle time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from torch_tessera.errors import ConfigError, ScheduleError
from torch_tessera.scheduler.issue import GraphIssue, HostIssue, issue_times
from torch_tessera.scheduler.modulo import WAIT_SECONDS
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, RunStep, TransferStep, WaitStep
from torch_tessera.target.costs import CostTable, Topology

_EPS = 1e-15


@dataclass(frozen=True)
class MemoryShare:
    """DRAM bandwidth figures for modelling partitions of one GPU that share its memory.

    Attributes:
        launch_bytes: bytes each launch moves to and from DRAM (launch index -> bytes).
        device_bandwidth: ``[D]`` bytes/s each device reaches alone (a partition's own figure).
        domain_bandwidth: memory domain -> bytes/s the whole domain (one GPU) has.
        weights: ``[D]`` each device's weight in the shared domain's bandwidth under contention: its SM count for a
            partition (the measured fit: docs/BENCHMARKS.md, cut diagnosis); ``()``: equal weights.
        corun_rate: in (0, 1]: the most a launch progresses (solo seconds per second) while a launch of another
            device of its memory domain runs (:data:`torch_tessera.target.devices.PARTITION_CORUN_RATE` for SM
            partitions of one GPU); 1: no co-run slowdown.

    ``device_bandwidth`` and ``domain_bandwidth`` may be empty (no bandwidth figures): then only the co-run rate
    applies.
    """

    launch_bytes: Mapping[int, float]
    device_bandwidth: Sequence[float]
    domain_bandwidth: Mapping[int, float]
    weights: Sequence[float] = ()
    corun_rate: float = 1.0


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` predicts for one replay of a schedule (every micro-batch once).

    Attributes:
        step_seconds: time from the first step's start to the last step's end.
        micro_batches: micro-batches in the step.
        busy: ``[D]`` seconds each device runs launches.
        transfer: ``[D]`` seconds each device's stream spends on transfers.
        waiting: ``[D]`` seconds each stream spends in waits (the wait cost only; blocked time is idle).
        idle: ``[D]`` ``step_seconds`` minus the three above.
        start / end: per device, ``[len(streams[d])]`` seconds of each step's start and end.
        stretch: ``[D]`` seconds the launches of each device lost to shared bandwidth (0 without sharing).
    """

    step_seconds: float
    micro_batches: int
    busy: np.ndarray
    transfer: np.ndarray
    waiting: np.ndarray
    idle: np.ndarray
    start: tuple[np.ndarray, ...]
    end: tuple[np.ndarray, ...]
    stretch: np.ndarray

    @property
    def seconds_per_micro_batch(self) -> float:
        return self.step_seconds / self.micro_batches


#: step kind codes of :func:`step_kinds`
RUN, TRANSFER, RECORD, WAIT = 0, 1, 2, 3


def step_kinds(schedule: PipelinedSchedule) -> list[np.ndarray]:
    """Per device, the kind code (:data:`RUN`, :data:`TRANSFER`, :data:`RECORD`, :data:`WAIT`) of every step."""
    code = {RunStep: RUN, TransferStep: TRANSFER, RecordStep: RECORD, WaitStep: WAIT}
    return [np.array([code[type(s)] for s in st], dtype=np.int8) for st in schedule.streams]


def step_durations(schedule: PipelinedSchedule, costs: CostTable | np.ndarray, topology: Topology | None,
                   wait_seconds: float) -> list[np.ndarray]:
    """Solo duration (seconds) of every step, per device; records take 0.

    ``costs`` is a cost table (columns in device order) or an array ``[launches, D]`` indexed by launch index."""
    return _durations_and_kinds(schedule, costs, topology, wait_seconds)[0]


def _durations_and_kinds(schedule: PipelinedSchedule, costs, topology, wait_seconds: float):
    """``(step_durations(...), step_kinds(schedule))`` in one pass over the steps."""
    out, kinds_out = [], []
    dense = not isinstance(costs, CostTable)
    link: dict = {}  # (src, dst, bytes) -> seconds, each computed once
    code = {RunStep: RUN, TransferStep: TRANSFER, RecordStep: RECORD, WaitStep: WAIT}
    for d, st in enumerate(schedule.streams):
        dur = np.zeros(len(st))
        kinds = [code[type(s)] for s in st]
        runs, launches = [], []
        for i, k in enumerate(kinds):
            if k == RUN:
                runs.append(i)
                launches.append(st[i].launch)
            elif k == TRANSFER:
                s = st[i]
                key = (s.src, s.dst, s.nbytes)
                secs = link.get(key)
                if secs is None:
                    same = schedule.domain(s.src) == schedule.domain(s.dst)
                    secs = link[key] = (0.0 if same or topology is None
                                        else topology.transfer_seconds(s.src, s.dst, s.nbytes))
                dur[i] = secs
            elif k == WAIT:
                dur[i] = wait_seconds
        if runs:
            dur[runs] = (costs[np.asarray(launches, dtype=np.int64), d] if dense
                         else [costs.row(v)[d] for v in launches])
        out.append(dur)
        kinds_out.append(np.array(kinds, dtype=np.int8))
    return out, kinds_out


def graph_overlap(schedule: PipelinedSchedule, dur: list[np.ndarray], overlap: float) -> list[np.ndarray]:
    """``dur`` (per device, every step's seconds: :func:`step_durations`) with ``overlap`` seconds taken off every
    launch that follows a launch on its stream, records between them skipped (never below 0); a wait or transfer
    between them, or none before, leaves the launch's cost whole (the module docstring's graph overlap)."""
    if overlap <= 0.0:
        return dur
    out = []
    for st, du in zip(schedule.streams, dur):
        du = du.copy()
        prev_run = False
        for i, s in enumerate(st):
            kind = type(s)
            if kind is RunStep:
                if prev_run:
                    du[i] = max(du[i] - overlap, 0.0)
                prev_run = True
            elif kind is not RecordStep:
                prev_run = False
        out.append(du)
    return out


def water_fill(demand: np.ndarray, capacity: float, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted max-min fair shares of ``capacity`` among ``demand``: ``share_i = min(demand_i, level x weight_i)``
    with the level that gives away all of ``capacity`` (every demand met if they fit). ``weights`` (positive,
    default all 1) scale each claimant's fair share."""
    if demand.sum() <= capacity:
        return demand.copy()
    w = np.ones_like(demand) if weights is None else np.asarray(weights, dtype=np.float64)
    share = np.zeros_like(demand)
    left, todo = capacity, list(np.argsort(demand / w))
    while todo:
        level = left / sum(w[j] for j in todo)
        i = todo[0]
        if demand[i] <= level * w[i]:
            share[i] = demand[i]
            left -= demand[i]
            todo.pop(0)
        else:
            for j in todo:
                share[j] = level * w[j]
            break
    return share


def simulate(schedule: PipelinedSchedule, costs: CostTable | np.ndarray, topology: Topology | None = None, *,
             wait_seconds: float = WAIT_SECONDS, memory: MemoryShare | None = None,
             host: HostIssue | None = None, graph: GraphIssue | None = None) -> SimResult:
    """Predict one replay of ``schedule`` (see the module docstring for the semantics).

    Args:
        schedule: the schedule (accepted by :func:`~torch_tessera.scheduler.pipeline_schedule.check_schedule`).
        costs: seconds of each launch on each device alone.
        topology: link bandwidth (bytes/s) and latency (s) for transfers; ``None``: transfers take no time.
        wait_seconds: seconds one wait costs the waiting stream (:data:`~torch_tessera.scheduler.modulo.WAIT_SECONDS`).
        memory: bandwidth figures for sharing within memory domains; ``None``: no sharing modelled.
        host: host seconds per issued step, for a replay issued step by step from the host; ``None`` (a replay
            captured as one CUDA graph): issue takes no time.
        graph: for a replay captured as one CUDA graph with event-timed costs, the seconds a launch that follows a
            launch does not pay (:func:`graph_overlap`) and, with ``graph.call``, what each call costs outside the
            graph; ``None``: every launch takes its cost, nothing outside the graph.

    Returns:
        The :class:`SimResult`.

    Raises:
        ScheduleError: the waits deadlock (a wait whose event is recorded after a wait that never completes).
        ConfigError: ``memory.weights`` not one per device, ``memory.corun_rate`` not in (0, 1], or both ``host``
            and ``graph`` given.
    """
    if host is not None and graph is not None:
        raise ConfigError("simulate: host= (an eager replay issued from the host) and graph= (one captured CUDA graph) "
                          "describe different replays: give one of them")
    D = schedule.devices
    if memory is not None and len(memory.weights) not in (0, D):
        raise ConfigError(f"MemoryShare.weights has {len(memory.weights)} entries for {D} devices: give one per "
                          "device (its SM count) or none")
    if memory is not None and not 0.0 < memory.corun_rate <= 1.0:
        raise ConfigError(f"MemoryShare.corun_rate={memory.corun_rate}: give a rate in (0, 1] (1: no co-run "
                          "slowdown)")
    result = _simulate(schedule, costs, topology, wait_seconds, memory, host, graph)
    if graph is None or graph.call is None:
        return result
    extra = graph.call.seconds
    return replace(result, step_seconds=result.step_seconds + extra, idle=result.idle + extra)


def _simulate(schedule: PipelinedSchedule, costs: CostTable | np.ndarray, topology: Topology | None,
              wait_seconds: float, memory: MemoryShare | None, host: HostIssue | None,
              graph: GraphIssue | None) -> SimResult:
    """:func:`simulate` after its checks, without the call cost (``graph.call``) it adds on top."""
    D = schedule.devices
    dur, kinds = _durations_and_kinds(schedule, costs, topology, wait_seconds)
    issued = issue_times(schedule, host) if host is not None else None
    if graph is not None:
        dur = graph_overlap(schedule, dur, graph.overlap)
    t_begin = 0.0 if host is not None else None
    if memory is None:  # nothing shared: every step takes its solo time, one pass in dependency order
        start, end, t = _longest_path(schedule, dur, issued)
        return _result(schedule, dur, start, end, t, t_begin, kinds)
    streams = schedule.streams
    demand = _demands(schedule, dur, memory)
    rec_time: dict[int, float] = {}
    start = [np.full(len(st), np.nan) for st in streams]
    end = [np.full(len(st), np.nan) for st in streams]
    pos = [0] * D
    left = [0.0] * D  # solo seconds left of the active step
    active = [False] * D
    t = 0.0
    while True:
        recorded = True
        while recorded:  # start what can start at t (a record may release a wait of a stream already passed)
            recorded = False
            for d in range(D):
                while not active[d] and pos[d] < len(streams[d]):
                    s = streams[d][pos[d]]
                    if isinstance(s, WaitStep) and rec_time.get(s.event_id, np.inf) > t + _EPS:
                        break
                    if issued is not None and issued[d][pos[d]] > t + _EPS:
                        break
                    start[d][pos[d]] = t
                    if isinstance(s, RecordStep):
                        rec_time[s.event_id] = t
                        end[d][pos[d]] = t
                        pos[d] += 1
                        recorded = True
                        continue
                    active[d], left[d] = True, dur[d][pos[d]]
        run = [d for d in range(D) if active[d]]
        # the next issue of a step some idle stream waits for (the host issues on its own clock)
        nxt = min((issued[d][pos[d]] for d in range(D) if issued is not None and not active[d]
                   and pos[d] < len(streams[d]) and issued[d][pos[d]] > t + _EPS), default=np.inf)
        if not run:
            if all(pos[d] == len(streams[d]) for d in range(D)):
                break
            if nxt < np.inf:
                t = nxt
                continue
            blocked = [d for d in range(D) if pos[d] < len(streams[d])]
            raise ScheduleError(f"simulation deadlock: streams {blocked} wait for events never recorded")
        rate = _rates(schedule, run, pos, demand, memory)
        dt = min(min(left[d] / rate[d] if rate[d] > 0 else np.inf for d in run), nxt - t)
        t += dt
        for d in run:
            left[d] -= rate[d] * dt
            if left[d] <= 1e-9 * dur[d][pos[d]] + 1e-18:
                end[d][pos[d]] = t
                active[d] = False
                pos[d] += 1
    return _result(schedule, dur, start, end, t, t_begin, kinds)


def _longest_path(schedule: PipelinedSchedule, dur: list[np.ndarray], issued: list[np.ndarray] | None = None):
    """Start and end of every step when none stretches: ``end = max(end of the previous step, the record's time
    for a wait, the step's issue time when ``issued``) + duration``, streams advanced round-robin until each blocks
    on a wait not yet recorded."""
    streams = schedule.streams
    D = len(streams)
    start: list[list[float]] = [[] for _ in streams]  # Python floats while walking, arrays at the end
    end: list[list[float]] = [[] for _ in streams]
    durs = [du.tolist() for du in dur]
    iss = [x.tolist() for x in issued] if issued is not None else None
    rec: dict[int, float] = {}
    pos = [0] * D
    last = [0.0] * D
    left = sum(len(st) for st in streams)
    while left:
        moved = False
        for d in range(D):
            st, du, sd, ed = streams[d], durs[d], start[d], end[d]
            isd = iss[d] if iss is not None else None
            i, t = pos[d], last[d]
            n = len(st)
            while i < n:
                s = st[i]
                kind = type(s)
                if kind is WaitStep:
                    r = rec.get(s.event_id)
                    if r is None:
                        break
                    if r > t:
                        t = r
                if isd is not None and isd[i] > t:
                    t = isd[i]
                sd.append(t)
                t += du[i]
                ed.append(t)
                if kind is RecordStep:
                    rec[s.event_id] = t
                i += 1
            if i != pos[d]:
                moved = True
                left -= i - pos[d]
                pos[d], last[d] = i, t
        if not moved:
            blocked = [d for d in range(D) if pos[d] < len(streams[d])]
            raise ScheduleError(f"simulation deadlock: streams {blocked} wait for events never recorded")
    return ([np.array(x, dtype=np.float64) for x in start], [np.array(x, dtype=np.float64) for x in end],
            max(last, default=0.0))


def _demands(schedule: PipelinedSchedule, dur: list[np.ndarray], memory: MemoryShare | None) -> list[np.ndarray]:
    """Bytes/s each run step asks for (0 for other steps or without ``memory``)."""
    out = []
    for d, st in enumerate(schedule.streams):
        dem = np.zeros(len(st))
        if memory is not None and len(memory.device_bandwidth):
            cap = float(memory.device_bandwidth[d])
            for i, s in enumerate(st):
                if isinstance(s, RunStep) and dur[d][i] > 0:
                    dem[i] = min(float(memory.launch_bytes.get(s.launch, 0.0)) / dur[d][i], cap)
        out.append(dem)
    return out


def _rates(schedule, run, pos, demand, memory) -> dict[int, float]:
    """Progress rate (solo seconds per second) of each active stream's step."""
    rate = {d: 1.0 for d in run}
    if memory is None:
        return rate
    if memory.corun_rate < 1.0:
        running: dict[int, list[int]] = {}
        for d in run:
            if isinstance(schedule.streams[d][pos[d]], RunStep):
                running.setdefault(schedule.domain(d), []).append(d)
        for devs in running.values():
            if len(devs) > 1:
                for d in devs:
                    rate[d] = memory.corun_rate
    by_dom: dict[int, list[int]] = {}
    for d in run:
        if demand[d][pos[d]] > 0:
            by_dom.setdefault(schedule.domain(d), []).append(d)
    for dm, devs in by_dom.items():
        cap = memory.domain_bandwidth.get(dm)
        if cap is None or len(devs) < 2:
            continue
        dem = np.array([demand[d][pos[d]] for d in devs])
        weights = np.array([float(memory.weights[d]) for d in devs]) if len(memory.weights) else None
        share = water_fill(dem, float(cap), weights)
        for d, a, b in zip(devs, share, dem):
            rate[d] = min(rate[d], float(a / b))
    return rate


def _result(schedule, dur, start, end, t_end, t_begin: float | None = None, kinds=None) -> SimResult:
    D = schedule.devices
    busy, transfer, waiting, stretch = (np.zeros(D) for _ in range(4))
    for d, kinds in enumerate(step_kinds(schedule) if kinds is None else kinds):
        took = end[d] - start[d]
        busy[d] = took[kinds == RUN].sum()
        stretch[d] = busy[d] - dur[d][kinds == RUN].sum()
        transfer[d] = took[kinds == TRANSFER].sum()
        waiting[d] = took[kinds == WAIT].sum()
    t0 = t_begin if t_begin is not None else min((float(s[0]) for s in start if len(s)), default=0.0)
    step = t_end - t0
    return SimResult(step, schedule.micro_batches, busy, transfer, waiting, step - busy - transfer - waiting,
                     tuple(start), tuple(end), stretch)
