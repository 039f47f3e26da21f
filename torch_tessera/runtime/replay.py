"""Replay an explicit pipelined schedule (:class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`)
exactly: per device, its steps in the schedule's issue order, every micro-batch in its own buffers.

The schedule's four step kinds each have a runner (:mod:`torch_tessera.runtime.realize`), and the host issues them
through the same :func:`~torch_tessera.runtime.realize.run_schedule` loop as every other mode:

* :class:`RunRunner`: launch ``launch`` of micro-batch ``m`` on its device's stream, in micro-batch ``m``'s pools;
* :class:`TransferRunner`: the cut edge's byte ranges, copied on the PRODUCER's stream (after the producer, before
  the event recorded after it) into the consumer's storage of micro-batch ``m``;
* :class:`RecordRunner`: record the step's event on its device's stream;
* :class:`WaitRunner`: the device's stream waits for that event (on a GPU an event wait resolved by the GPU; the
  host never waits inside a step).

Each device has ONE compute stream for all micro-batches, as the schedule's contract says. The host walks the
devices' step lists in an order that issues every record before the waits on it (:func:`issue_order`); on CPU
virtual devices each step runs when it is issued, so the walk decides which device runs ahead: ``"lazy:D"`` runs
device ``D`` as far as it can and the others only as far as its waits demand, which makes a missing wait on ``D``
show up as a wrong value. Around the pipelined steps run the executor's per-call copies of each micro-batch (its
graph inputs onto the devices that read them before, the gathers of outputs and state to their homes after) and,
once, the setup copies (weights, static inputs). At the end the host waits for every event the streams waited on,
bounded by ``timeout_s``: a wait that never completes raises :class:`~torch_tessera.errors.TransferTimeout` naming
its edges and micro-batch. With CUDA graphs, :class:`~torch_tessera.runtime.captured.CapturedReplay` captures these
very items, in this order, as one graph and replays it per call instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from torch_tessera.errors import TesseraError, TransferTimeout
from torch_tessera.runtime.executor import borrow_pools
from torch_tessera.runtime.pipelining import check_disjoint_state, check_shared_weights
from torch_tessera.runtime import realize
from torch_tessera.runtime.realize import (
    CallContext,
    CopyRunner,
    ExecItem,
    LaunchRunner,
    Machine,
    Runner,
    count_copy,
    report_transfers,
    run_schedule,
)
from torch_tessera.runtime.schedule import CopyStep, LaunchStep
from torch_tessera.runtime.streams import stream_ctx
from torch_tessera.scheduler.issue import HOST_ORDERS, issue_order  # noqa: F401  (re-exported: the runtime's order)
from torch_tessera.scheduler.pipeline_schedule import (
    PipelinedSchedule,
    RecordStep,
    RunStep,
    TransferStep,
    WaitStep,
    check_schedule,
)

log = logging.getLogger("torch_tessera.runtime")


@dataclass
class ReplayContext:
    """The state of one replay: a :class:`CallContext` per micro-batch and the events recorded so far.

    Attributes:
        flights: one context per micro-batch of the replay (its pools, edges, copy events, trace).
        streams: the compute stream of each device (``None`` on a CPU virtual device).
        events: event id -> the event its :class:`RecordStep` recorded.
        waited: ``(wait step, event)`` of every wait issued, in order (checked at the end of the call).
        trace: when a list, every step run is appended as ``(kind, step, micro-batch)``.
    """

    flights: list[CallContext]
    streams: Sequence[Any]
    events: dict = field(default_factory=dict)
    waited: list = field(default_factory=list)
    trace: list | None = None

    def note(self, kind: str, step: Any) -> None:
        if self.trace is not None:
            self.trace.append((kind, step, step.micro_batch))

    def release_after(self, index: int) -> None:
        """Nothing is freed inside a replay: each micro-batch's temporaries live until the call ends."""


class RunRunner(Runner):
    """One launch of one micro-batch (in that micro-batch's pools, on its device's stream)."""

    kind = "run"

    def __init__(self, machine: Machine, count: bool = True) -> None:
        super().__init__(machine)
        self.launch = LaunchRunner(machine, count=count)

    def __call__(self, step: RunStep, ctx: ReplayContext) -> None:
        self.launch(LaunchStep(step.launch, step.device), ctx.flights[step.micro_batch])
        ctx.note(self.kind, step)


class TransferRunner(Runner):
    """A cut edge's byte ranges, on the producer's stream, into the consumer's storage of the micro-batch.

    Args:
        machine: what it runs on.
        move: copy the bytes; ``False`` ("null hop", a diagnosis mode: results are wrong) counts the transfer and
            keeps every wait, but moves nothing.
    """

    kind = "transfer"

    def __init__(self, machine: Machine, move: bool = True) -> None:
        super().__init__(machine)
        self.move = move

    def __call__(self, step: TransferStep, ctx: ReplayContext) -> None:
        m = self.machine
        flight = ctx.flights[step.micro_batch]
        stream = ctx.streams[step.src]
        for buffer, start, end in step.ranges:
            copy = CopyStep(step.src, step.dst, buffer, start, end, step.purpose, step.edge)
            m.ensure(flight.pools[step.dst], step.dst, buffer)
            src, dst = m.slices(copy, flight.pools)
            count_copy(m, copy, flight)
            if not self.move:
                continue
            timed = log.isEnabledFor(logging.DEBUG)
            t0 = time.perf_counter()
            with m.devices[step.src].guard(), stream_ctx(stream):
                start = torch.cuda.Event(enable_timing=True) if timed and stream is not None else None
                if start is not None:
                    start.record(stream)
                dst.copy_(src, non_blocking=stream is not None)
                if start is not None:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record(stream)
                    flight.timings.append((copy, start, end))
            if stream is None:
                if timed:
                    flight.timings.append((copy, t0, time.perf_counter()))
            else:
                src.record_stream(stream)
                dst.record_stream(stream)
        ctx.note(self.kind, step)


class RecordRunner(Runner):
    """Record the step's event on its device's stream."""

    kind = "record"

    def __call__(self, step: RecordStep, ctx: ReplayContext) -> None:
        stream = ctx.streams[step.device]
        ctx.events[step.event_id] = stream.record_event() if stream is not None else _HostEvent()
        ctx.note(self.kind, step)


class WaitRunner(Runner):
    """The device's stream waits for an event another device's stream recorded (no host wait)."""

    kind = "wait"

    def __call__(self, step: WaitStep, ctx: ReplayContext) -> None:
        ev = ctx.events.get(step.event_id)
        if ev is None:
            raise TesseraError(f"wait for event {step.event_id} (micro-batch {step.micro_batch}) issued before its "
                               "record: the host issue order is broken")
        stream = ctx.streams[step.device]
        if stream is not None:
            stream.wait_event(ev)
        ctx.waited.append((step, ev))
        ctx.note(self.kind, step)


class _HostEvent:
    """The event of a CPU virtual device: complete once recorded (work there runs when it is issued)."""

    def query(self) -> bool:
        return True


def note_cut_edges(executor: Any, per_batch: Sequence[int]) -> None:
    """Set the executor's ``cut_edges_per_batch`` (distinct cut edges copied for each micro-batch of the whole run,
    every replayed group) and ``cut_edges_transferred`` (their sum)."""
    executor.cut_edges_per_batch = list(per_batch)
    executor.cut_edges_transferred = sum(per_batch)


class ScheduleReplay:
    """Runs micro-batches through a placed executor exactly as an explicit pipelined schedule says.

    Args:
        executor: the :class:`~torch_tessera.runtime.placed.PlacedExecutor` whose placement the schedule is for
            (its public interface: ``program``, ``dag``, ``devices``, ``domains``, ``home``, ``schedule``,
            ``machine``, ``streams``, ``bind_call``, ``setup_done``, ``stale_static``, ``static_placed``,
            ``join_caller``, ``wait``, ``outputs``, ``trace``, ``timeout_s``).
        schedule: the schedule (:func:`torch_tessera.scheduler.modulo.build_pipelined_schedule`).
        check: refuse a schedule whose waits do not cover every RAW/WAR/WAW edge (:func:`check_schedule`) before
            anything runs. ``False`` only to test what a broken schedule does.
        host_order: see :func:`issue_order`.
        move_bytes: ``False`` for the "null hop" diagnosis (waits kept, no bytes moved: wrong results).

    Attributes:
        last_issue_seconds: host seconds the last replay took to issue its steps (without the final wait).
        last_pools: the buffer pools of each micro-batch of the last replay (see :meth:`run`'s ``pools``).

    Raises:
        ScheduleError: ``check`` found an uncovered edge (named, with its micro-batch), or the waits deadlock.
        TesseraError: the schedule is for another placement or number of devices.
    """

    def __init__(self, executor: Any, schedule: PipelinedSchedule, check: bool = True,
                 host_order: str = "round-robin", move_bytes: bool = True) -> None:
        self.executor = executor
        if schedule.devices != len(executor.devices):
            raise TesseraError(f"the schedule is for {schedule.devices} devices, the executor has "
                               f"{len(executor.devices)}")
        placed = dict(executor.schedule.placement)
        differ = sorted(n for n in placed if schedule.placement.get(n) != placed[n])
        if differ:
            raise TesseraError(f"the schedule places launches {differ[:8]} elsewhere than the executor; build it "
                               "from the executor's placement")
        if check:
            check_schedule(schedule, executor.dag)
        self.schedule = schedule
        self.move_bytes = move_bytes
        m = executor.machine
        self.last_issue_seconds = 0.0
        self.last_pools: list | None = None
        runners = {RunStep: RunRunner(m), TransferStep: TransferRunner(m, move_bytes), RecordStep: RecordRunner(m),
                   WaitStep: WaitRunner(m)}
        self.items = [ExecItem(runners[type(s)], s, i) for i, s in enumerate(issue_order(schedule, host_order))]
        copy = CopyRunner(m)
        steps = executor.schedule.steps
        self.inputs = [ExecItem(copy, s, -1) for s in steps if isinstance(s, CopyStep) and s.purpose == "input"]
        self.gathers = [ExecItem(copy, s, -1) for s in steps if isinstance(s, CopyStep) and s.purpose == "gather"]
        log.debug("replaying a %s schedule: %d micro-batches, %d steps, %d waits", schedule.source,
                  schedule.micro_batches, len(self.items), schedule.num_waits)

    def run(self, batches: Sequence[Sequence[Any]], pools: Sequence[Any] | None = None) -> list[list]:
        """Run ``batches`` (a multiple of the schedule's micro-batches), one replay per group of them.

        Args:
            batches: one input list per micro-batch, as for the executor's ``run``.
            pools: for one replay, each micro-batch's pools to run in (another replay's :attr:`last_pools`: every
                buffer exists and holds that run's values) instead of fresh ones, borrowed
                (:func:`~torch_tessera.runtime.executor.borrow_pools`: what this replay binds or allocates stays in
                its own pools, so a graph captured in the lender's keeps every address it holds). For diagnosis modes
                that drop steps, whose launches then read real data.

        Returns:
            the outputs of each micro-batch, in order, equal to what the executor's ``run`` returns for its inputs.

        Raises:
            TesseraError: a number of micro-batches that is not a multiple of the schedule's, wrong inputs, or
                micro-batches of one replay that share a state storage.
            TransferTimeout: a wait did not complete within the executor's ``timeout_s`` (names its edges and
                micro-batch).
        """
        batches = self.check_batches(batches)
        outputs: list[list] = []
        per_batch: list[int] = []
        for g in range(0, len(batches), self.schedule.micro_batches):
            outputs += self.replay_group(batches[g:g + self.schedule.micro_batches], g, pools)
            per_batch += self.executor.cut_edges_per_batch
        note_cut_edges(self.executor, per_batch)
        self.executor.calls += len(batches)
        return outputs

    def check_batches(self, batches: Sequence[Sequence[Any]]) -> list[list]:
        """``batches`` as lists, checked as :meth:`run` says (its ``Raises``)."""
        ex, M = self.executor, self.schedule.micro_batches
        batches = [list(b) for b in batches]
        if len(batches) % M:
            raise TesseraError(f"{len(batches)} micro-batches for a schedule of {M}: pass a multiple of {M}, or build "
                               f"the schedule for micro_batches={len(batches)}")
        for k, b in enumerate(batches):
            if len(b) != len(ex.program.inputs):
                raise TesseraError(f"micro-batch {k}: program expects {len(ex.program.inputs)} inputs, got {len(b)}")
        check_shared_weights(ex.program, batches, static=ex.static_inputs == "place")
        check_disjoint_state(ex.program, batches, M, "use run_pipelined without a schedule (waves in order)")
        return batches

    def replay_group(self, group: Sequence[Sequence[Any]], first: int, pools: Sequence[Any] | None = None) -> list[list]:
        """One replay of ``group`` (exactly the schedule's micro-batches, checked by :meth:`check_batches`; ``first``:
        the index of its first micro-batch, named in errors); see :meth:`run` for ``pools``. Returns the outputs."""
        ex = self.executor
        ex.join_caller()
        if not ex.setup_done or ex.stale_static(group[0], ex.static_placed):
            ex.bind_call(group[0])  # weights and static inputs placed once, before any micro-batch reads them
        if pools is None:
            pools = [ex.bind_call(b, place=False) for b in group]
        else:  # borrowed: re-binding an extern kernel's fresh output here leaves the lender's (a graph's) bound
            pools = [borrow_pools(p) for p in pools]
        flights = [CallContext(p, ex.streams, batch=first + k, trace=ex.trace) for k, p in enumerate(pools)]
        self.last_pools = [f.pools for f in flights]
        for f in flights:
            run_schedule(self.inputs, f)
        ctx = ReplayContext(flights, ex.streams, trace=ex.trace)
        t0 = time.perf_counter()
        run_schedule(self.items, ctx)
        self.last_issue_seconds = time.perf_counter() - t0
        for f in flights:
            run_schedule(self.gathers, f)
        self.wait_host(ctx, first)
        ex.wait([e for f in flights for e in f.events], ex.streams)
        for f in flights:
            report_transfers(ex.machine, f)
        ex.cut_edges_per_batch = [len(f.edges) for f in flights]
        ex.cut_edges_transferred = sum(ex.cut_edges_per_batch)
        return [ex.outputs(f.pools[ex.home]) for f in flights]

    def wait_host(self, ctx: ReplayContext, first: int) -> None:
        """Wait on the host for every event a stream waited on, bounded by the executor's ``timeout_s``.

        Raises:
            TransferTimeout: naming the first wait whose event did not complete: its edges and micro-batch.
        """
        timeout = self.executor.timeout_s
        deadline = time.monotonic() + timeout
        spin_until = time.monotonic() + realize.SPIN_S
        for step, ev in ctx.waited:
            while not ev.query():
                if time.monotonic() < spin_until:
                    continue
                if time.monotonic() > deadline:
                    raise TransferTimeout(
                        f"the wait of device {self.executor.devices[step.device].name} for event {step.event_id} "
                        f"(edges {list(step.edges)[:6]} of micro-batch {first + step.micro_batch}) did not complete "
                        f"within {timeout} s")
                time.sleep(20e-6)
