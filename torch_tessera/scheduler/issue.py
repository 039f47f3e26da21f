"""The host's issue order of an explicit pipelined schedule: the order in which the runtime's eager replay issues
every step (:mod:`torch_tessera.runtime.replay`), which a one-graph capture keeps (:mod:`torch_tessera.runtime.
captured`), and which the simulator's host model follows (:func:`~torch_tessera.scheduler.simulate.simulate`); and
the issue models the simulator takes: :class:`HostIssue` (eager replay) and :class:`GraphIssue` (one CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torch_tessera.errors import ConfigError, ScheduleError, TesseraError
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, RunStep, TransferStep, WaitStep

#: host issue orders of :func:`issue_order`: ``"round-robin"`` (one step per device in turn) or ``"lazy:D"``
HOST_ORDERS = ("round-robin", "lazy:D")


def issue_order(schedule: PipelinedSchedule, host_order: str = "round-robin") -> list[Any]:
    """The host's issue order of every step: each device's steps in schedule order, every record before the waits
    on its event.

    Args:
        schedule: the schedule.
        host_order: ``"round-robin"`` (one step per device in turn, skipping a device blocked on a wait) or
            ``"lazy:D"`` (device ``D`` as far as it can; the others only as far as its waits need).

    Raises:
        ScheduleError: a wait for an event no step records, or waits that deadlock.
        TesseraError: an unknown ``host_order``.
    """
    streams = schedule.streams
    record_at = {s.event_id: (d, i) for d, st in enumerate(streams) for i, s in enumerate(st)
                 if isinstance(s, RecordStep)}
    pos = [0] * len(streams)
    out: list[Any] = []
    recorded: set[int] = set()

    def ready(d: int) -> bool:
        s = streams[d][pos[d]]
        if not isinstance(s, WaitStep) or s.event_id in recorded:
            return True
        if s.event_id not in record_at:
            raise ScheduleError(f"device {d} waits for event {s.event_id} (micro-batch {s.micro_batch}) that no "
                                "step records", micro_batch=s.micro_batch)
        return False

    def issue(d: int) -> None:
        s = streams[d][pos[d]]
        out.append(s)
        if isinstance(s, RecordStep):
            recorded.add(s.event_id)
        pos[d] += 1

    def advance(d: int, until: int, visiting: tuple) -> None:
        """Issue device ``d``'s steps up to position ``until`` (inclusive), advancing producers on demand."""
        while pos[d] <= until and pos[d] < len(streams[d]):
            if not ready(d):
                w = streams[d][pos[d]]
                rd, ri = record_at[w.event_id]
                if rd in visiting or rd == d:
                    raise ScheduleError(f"the waits deadlock: device {d} waits for event {w.event_id} (micro-batch "
                                        f"{w.micro_batch}) that device {rd} records only after waiting itself",
                                        edge=w.edges[0] if w.edges else None, micro_batch=w.micro_batch)
                advance(rd, ri, visiting + (d,))
                continue
            issue(d)

    if host_order.startswith("lazy:"):
        first = int(host_order.split(":", 1)[1])
        for d in [first] + [e for e in range(len(streams)) if e != first]:
            advance(d, len(streams[d]) - 1, ())
        return out
    if host_order != "round-robin":
        raise TesseraError(f"host_order={host_order!r}: use one of {HOST_ORDERS}")
    total = sum(len(st) for st in streams)
    while len(out) < total:
        moved = False
        for d in range(len(streams)):
            if pos[d] < len(streams[d]) and ready(d):
                issue(d)
                moved = True
        if not moved:
            blocked = [streams[d][pos[d]] for d in range(len(streams)) if pos[d] < len(streams[d])]
            w = blocked[0]
            raise ScheduleError(f"the waits deadlock: devices {[s.device for s in blocked]} each wait for an event "
                                f"not recorded yet (first: event {w.event_id}, micro-batch {w.micro_batch})",
                                edge=w.edges[0] if w.edges else None, micro_batch=w.micro_batch)
    return out


@dataclass(frozen=True)
class HostIssue:
    """Host seconds the runtime's eager replay (:class:`~torch_tessera.runtime.replay.ScheduleReplay`) spends issuing
    one step of each kind; a replay captured as one CUDA graph has none (the simulator's ``host=None``).

    Defaults: fitted to the measured host issue of the eager replay on one H200 split 104 + 24 SMs (docs/BENCHMARKS.md,
    cut diagnosis). Transfers are assumed to cost what a launch does (none were measured).

    Attributes:
        run: seconds per launch (:class:`RunStep`).
        transfer: seconds per transfer (:class:`TransferStep`).
        record: seconds per event record.
        wait: seconds per event wait.
    """

    run: float = 118e-6
    transfer: float = 118e-6
    record: float = 20e-6
    wait: float = 20e-6

    def seconds(self, step: Any) -> float:
        """Host seconds of issuing ``step``."""
        t = type(step)
        return self.run if t is RunStep else self.transfer if t is TransferStep else \
            self.record if t is RecordStep else self.wait


@dataclass(frozen=True)
class GraphIssue:
    """A replay captured as ONE CUDA graph (:mod:`torch_tessera.runtime.captured`) with launch costs timed between CUDA
    events: the part of each such cost the graph does not pay.

    A launch timed between events pays its whole launch latency and ramp after the event before it; in a graph, a
    launch that follows another launch on its stream has its latency hidden behind the previous kernel, so each such
    launch takes ``overlap`` seconds less than its event-timed cost (never below 0). A launch first on its stream, or
    right after a wait (a dependency on another stream), pays its whole cost; records in between change nothing.

    Use it only with costs timed one launch at a time between events (``bench/gpu_cut_diagnose.py``'s
    ``launch_costs``, ``torch_tessera.measure.kernel_times``): costs calibrated to a graph replay of the whole
    program (:func:`~torch_tessera.target.profiler.calibrate_to_total`) already exclude it.

    Default: the back-to-back sums of session 11's kernel times against the same programs replayed as one graph
    (docs/BENCHMARKS.md, graph overlap).

    Attributes:
        overlap: seconds hidden per launch that follows a launch, >= 0.
        source: where ``overlap`` comes from.
        call: what each call costs outside the graph (:class:`CallCost`), added to the step; ``None``: nothing (the
            graph's replay alone).
    """

    overlap: float = 2.76e-6
    source: str = "docs/BENCHMARKS.md, graph overlap"
    call: "CallCost | None" = None

    def __post_init__(self) -> None:
        if not (self.overlap >= 0.0 and np.isfinite(self.overlap)):
            raise ConfigError(f"GraphIssue.overlap={self.overlap}: give seconds >= 0 hidden per launch (0: none)")
        if self.call is not None and not isinstance(self.call, CallCost):
            raise ConfigError(f"GraphIssue.call={self.call!r}: give a CallCost (or None)")


@dataclass(frozen=True)
class CallCost:
    """What one call of a replay captured as one CUDA graph costs outside the graph
    (:meth:`torch_tessera.runtime.captured.CapturedReplay.run`): the host's work before the graph starts and after it
    ends (checks, the graph launch, the wake-up from its wait), during which the GPU idles, and the device copies
    around the graph (the INPUT-kind inputs copied into the static storages, the outputs cloned out), each byte read
    and written once at the home device's DRAM bandwidth.

    The host part is a property of the runtime and the host CPU, not of the schedule: measure it on the machine that
    runs the replay (``bench/gpu_cut_diagnose.py``: host wall time of a call minus its graph's device time).

    Attributes:
        host: host seconds per call, >= 0.
        copy_bytes: bytes copied in and cloned out per call (all micro-batches), >= 0.
        bandwidth: the home device's DRAM bytes/s, > 0.
        source: where ``host`` comes from.
    """

    host: float = 0.0
    copy_bytes: float = 0.0
    bandwidth: float = 1.0
    source: str = "not measured"

    def __post_init__(self) -> None:
        for name in ("host", "copy_bytes"):
            v = getattr(self, name)
            if not (v >= 0.0 and np.isfinite(v)):
                raise ConfigError(f"CallCost.{name}={v}: give a finite value >= 0")
        if not (self.bandwidth > 0.0 and np.isfinite(self.bandwidth)):
            raise ConfigError(f"CallCost.bandwidth={self.bandwidth}: give the home device's DRAM bytes/s (> 0)")

    @property
    def seconds(self) -> float:
        """Seconds one call adds to its graph's replay: ``host + 2 x copy_bytes / bandwidth``."""
        return self.host + 2.0 * self.copy_bytes / self.bandwidth


def issue_times(schedule: PipelinedSchedule, host: HostIssue, host_order: str = "round-robin") -> list[np.ndarray]:
    """Per device, the host time (seconds from the replay's start) at which each step has been issued: the host
    issues the steps one after another in :func:`issue_order`, each taking :meth:`HostIssue.seconds`, and never
    waits for the devices inside a replay."""
    where = {id(s): (d, i) for d, st in enumerate(schedule.streams) for i, s in enumerate(st)}
    out = [np.zeros(len(st)) for st in schedule.streams]
    t = 0.0
    for s in issue_order(schedule, host_order):
        t += host.seconds(s)
        d, i = where[id(s)]
        out[d][i] = t
    return out
