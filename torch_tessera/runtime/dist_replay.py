"""The process-per-device runtime replays an explicit pipelined schedule: rank ``r`` issues device ``r``'s steps of a
:class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`, in the schedule's order, through the runtime's
one loop (:func:`~torch_tessera.runtime.realize.run_schedule`) with runners of its own:

* a :class:`RunStep` is the launch, in its micro-batch's pool, on the rank's one stream;
* a :class:`TransferStep` is an ``isend`` of the edge's byte ranges to the consumer's rank, from a private copy of
  the bytes (so no later local launch ever waits for a send);
* a :class:`WaitStep` is where the receives it consumes land: every transfer whose first ordered-after step on this
  rank's stream is this step (:func:`~torch_tessera.scheduler.pipeline_schedule.receive_points`) is received
  (``irecv``) and waited for here. Every step of this rank the transfer must follow (a reader of the old bytes: a
  WAR edge) was issued before, every reader of the new bytes comes after;
* a :class:`RecordStep` issues nothing: the ranks share no memory, so an event between them orders only the bytes
  that travel, and those are ordered by the receive points above.

Around the steps, as :class:`~torch_tessera.runtime.replay.ScheduleReplay` does in one process: the inputs other
ranks read are sent from the home rank before the steps (received lazily, before the first launch that touches
them), and the outputs and state are gathered to the home rank after them.

Messages go through one process group per direction (sends to a higher rank on the default group, to a lower rank on
a second group), so one NCCL communicator carries each ordered pair's messages, which both ranks post in the same
order (:func:`receive_points`). A rank blocks only on receives, each from a send the schedule orders before it, so
the ranks cannot deadlock when the schedule does not (:func:`check_schedule` refuses it otherwise).

Failure: every wait on a peer is bounded by ``timeout_s``; a receive that does not complete raises
:class:`~torch_tessera.errors.PeerFailureError` (a :class:`~torch_tessera.errors.TransferTimeout`) naming this rank,
the peer, the edge and the micro-batch.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from torch_tessera.errors import RendezvousError, TesseraError
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime.executor import launch_buffers
from torch_tessera.runtime.realize import ExecItem, Runner, run_schedule
from torch_tessera.runtime.schedule import CopyStep, LaunchStep
from torch_tessera.scheduler.pipeline_schedule import (
    PipelinedSchedule,
    RecordStep,
    RunStep,
    TransferStep,
    WaitStep,
    check_schedule,
    receive_points,
)

log = logging.getLogger(__name__)


def probe_group(group: Any, device: torch.device, timeout_s: float) -> None:
    """One small ``all_reduce`` on ``group`` (``None``: the default group), polled for at most ``timeout_s`` seconds.

    With NCCL this creates the group's communicator eagerly, so that a broken setup fails here, bounded, and the
    first point-to-point operation on the group is not a ``batch_isend_irecv`` (which NCCL requires of every rank).

    Raises:
        RuntimeError: the all_reduce did not complete in time.
    """
    work = dist.all_reduce(torch.ones(1, device=device), group=group, async_op=True)
    deadline = time.monotonic() + timeout_s
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the first all_reduce on a new process group did not complete within {timeout_s:g} s")
        time.sleep(1e-3)
    work.wait()


@dataclass
class RankReplayContext:
    """One replay on one rank: the state of each micro-batch (a ``_Call`` of the executor) and the trace.

    Attributes:
        calls: one call state per micro-batch of the replay (its pool, pending messages, cut edges).
        trace: when a list, every step this rank ran is appended as ``(kind, step)``.
        free_after: item index -> ``(micro-batch, buffer)`` temporaries of this rank no longer needed after it.
        waited: the transfers received so far, in order.
    """

    calls: list
    trace: list | None = None
    free_after: Mapping[int, Sequence[tuple[int, str]]] = field(default_factory=dict)
    waited: list = field(default_factory=list)

    def note(self, kind: str, step: Any) -> None:
        if self.trace is not None:
            self.trace.append((kind, step))

    def release_after(self, index: int) -> None:
        """Free the temporaries whose last use on this rank was item ``index`` (nothing of theirs is in flight:
        sends go from private copies, receives have landed)."""
        for m, buffer in self.free_after.get(index, ()):
            self.calls[m].pool.free(buffer)


def transfer_copies(steps: Sequence[TransferStep]) -> tuple[CopyStep, ...]:
    """Transfers' byte ranges as copy steps, in order (what the executor's messages carry and its errors name)."""
    return tuple(CopyStep(t.src, t.dst, b, s, e, t.purpose, t.edge) for t in steps for b, s, e in t.ranges)


def messages(schedule: PipelinedSchedule,
             points: Mapping[int, Mapping[int, Sequence[TransferStep]]]) -> dict[int, tuple[TransferStep, ...]]:
    """The message each transfer travels in: transfers issued one right after the other on a stream, to one
    destination, of one micro-batch, landing at one receive point (``points``: :func:`receive_points`) share one.
    The same on every rank.

    Returns:
        ``id(transfer)`` -> the transfers of its message, in issue order.
    """
    land = {id(t): (d, p) for d, at in points.items() for p, ts in at.items() for t in ts}
    out: dict[int, tuple[TransferStep, ...]] = {}
    for stream in schedule.streams:
        run: list[TransferStep] = []
        for s in list(stream) + [None]:
            joins = run and isinstance(s, TransferStep) and id(s) in land and s.dst == run[-1].dst and \
                s.micro_batch == run[-1].micro_batch and land[id(s)] == land[id(run[-1])]
            if joins:
                run.append(s)
                continue
            out.update((id(t), tuple(run)) for t in run)
            run = [s] if isinstance(s, TransferStep) and id(s) in land else []
    return out


class RankRunRunner(Runner):
    """One launch of one micro-batch, after the receives of its buffers (inputs) have landed."""

    kind = "run"

    def __call__(self, step: RunStep, ctx: RankReplayContext) -> None:
        ex, launch = self.machine.executor, LaunchStep(step.launch, step.device)
        call = ctx.calls[step.micro_batch]
        ex.hook(call, launch)
        ex.launch(launch, call)
        ctx.note(self.kind, step)


class RankSendRunner(Runner):
    """A transfer issued on this rank; at the last transfer of its message (:func:`messages`) the message's ranges
    are sent, packed into one private copy, to the consumer's rank."""

    kind = "transfer"

    def __call__(self, step: TransferStep, ctx: RankReplayContext) -> None:
        message = self.machine.messages[id(step)]
        if step is message[-1]:
            copies = transfer_copies(message)
            call = ctx.calls[step.micro_batch]
            for c in copies:
                self.machine.executor.hook(call, c)
            self.machine.post(copies, call)
        ctx.note(self.kind, step)


class RankRecordRunner(Runner):
    """An event record: nothing to issue across separate memories (see the module docstring)."""

    kind = "record"

    def __call__(self, step: RecordStep, ctx: RankReplayContext) -> None:
        ctx.note(self.kind, step)


class RankWaitRunner(Runner):
    """A wait: the transfers it consumes are received and waited for here (blocking on gloo, stream-ordered on
    NCCL).

    Args:
        machine: the replay.
        lands: the transfers that land at this step, in order.
    """

    kind = "wait"

    def __init__(self, machine: "DistReplay", lands: Sequence[TransferStep] = ()) -> None:
        super().__init__(machine)
        self.lands = tuple(lands)

    def __call__(self, step: WaitStep | None, ctx: RankReplayContext) -> None:
        receive(self.machine, self.lands, ctx)
        if step is not None:
            ctx.note(self.kind, step)


def receive(replay: "DistReplay", transfers: Sequence[TransferStep], ctx: RankReplayContext) -> None:
    """Receive ``transfers`` (whole messages, in order: :func:`messages`) and wait for each message."""
    ex = replay.executor
    for t in transfers:
        message = replay.messages[id(t)]
        if t is not message[0]:
            continue
        call = ctx.calls[t.micro_batch]
        replay.post(transfer_copies(message), call)
        ex.wait_pending(call.pending[-1], call, final=False)
        ctx.waited += message


def check_replayable(schedule: PipelinedSchedule, placement: Mapping[int, int], world_size: int) -> None:
    """Refuse a schedule that ranks of separate memories cannot replay for ``placement``.

    Args:
        schedule: the schedule.
        placement: launch index -> device (= rank) of the executor.
        world_size: number of ranks.

    Raises:
        TesseraError: the schedule is for more devices than there are ranks, places a launch elsewhere than
            ``placement``, or puts two devices in one memory domain (its cuts between them then move no bytes, and
            separate processes share no memory).
    """
    if schedule.devices > world_size:
        raise TesseraError(f"the schedule is for {schedule.devices} devices, {world_size} ranks run: launch one rank "
                           "per device")
    differ = sorted(n for n, d in placement.items() if schedule.placement.get(n) != d)
    if differ:
        raise TesseraError(f"the schedule places launches {differ[:8]} elsewhere than the executor; build it from the "
                           "executor's placement")
    domains = [schedule.domain(d) for d in range(schedule.devices)]
    if len(set(domains)) < len(domains):
        raise TesseraError(f"the schedule puts devices in shared memory domains {tuple(domains)}: its cuts between "
                           "them move no bytes, and ranks share no memory; build it with one domain per rank "
                           f"(domains={tuple(range(schedule.devices))})")


class DistReplay:
    """A :class:`~torch_tessera.runtime.distributed.DistributedExecutor`'s replay of one explicit schedule (its
    public interface: ``program``, ``dag``, ``placement``, ``ctx``, ``rank``, ``home``, ``schedule``, ``stats``,
    ``trace``, ``new_call``, ``hook``, ``launch``, ``post``, ``wait_pending``, ``finish``, ``outputs``).

    Args:
        executor: the executor (every rank builds the same replay of the same schedule).
        schedule: the schedule, over at most as many devices as there are ranks, of the executor's placement.
        groups: the process group of each direction: ``groups[0]`` for sends to a higher rank, ``groups[1]`` to a
            lower one.
        check: refuse a schedule whose waits do not cover every RAW/WAR/WAW edge before anything runs.

    Raises:
        ScheduleError: ``check`` found an uncovered edge (named, with its micro-batch), or the waits deadlock.
        TesseraError: what :func:`check_replayable` refuses.
    """

    def __init__(self, executor: Any, schedule: PipelinedSchedule, groups: Sequence[Any], check: bool = True) -> None:
        self.executor, self.schedule, self.groups = executor, schedule, tuple(groups)
        ex = executor
        check_replayable(schedule, ex.placement, ex.ctx.world_size)
        if check:
            check_schedule(schedule, ex.dag)
        self.items = self.lower()
        steps = ex.schedule.steps
        self.inputs = [s for s in steps if isinstance(s, CopyStep) and s.purpose == "input" and ex.mine(s)]
        self.gathers = [s for s in steps if isinstance(s, CopyStep) and s.purpose == "gather" and ex.mine(s)]
        self.free_after = self.last_uses()
        self.last_calls: list = []

    def lower(self) -> list[ExecItem]:
        """This rank's stream of the schedule as items, in order, each transfer it receives landing at its receive
        point (a landing outside a wait, possible only in an unchecked schedule, gets an item of its own)."""
        rank, schedule = self.executor.rank, self.schedule
        mine = schedule.streams[rank] if rank < schedule.devices else ()
        points = receive_points(schedule)
        self.messages = messages(schedule, points)
        lands = points.get(rank, {})
        run, send, record = RankRunRunner(self), RankSendRunner(self), RankRecordRunner(self)
        pairs: list[tuple[Runner, Any]] = []
        for i, s in enumerate(mine):
            if isinstance(s, WaitStep):
                pairs.append((RankWaitRunner(self, lands.get(i, ())), s))
                continue
            if i in lands:
                pairs.append((RankWaitRunner(self, lands[i]), None))
            pairs.append((run if isinstance(s, RunStep) else send if isinstance(s, TransferStep) else record, s))
        if len(mine) in lands:
            pairs.append((RankWaitRunner(self, lands[len(mine)]), None))
        return [ExecItem(runner, s, k) for k, (runner, s) in enumerate(pairs)]

    def last_uses(self) -> dict[int, list[tuple[int, str]]]:
        """Item index after which each temporary of each micro-batch is no longer needed on this rank (outputs on
        the home rank and buffers this rank gathers to it are kept)."""
        ex = self.executor
        program = ex.program
        temps = {b.name for b in program.buffers.values() if b.kind == BufferKind.TEMP}
        keep = {s.buffer for s in self.gathers}
        if ex.rank == ex.home:
            keep |= {o.buffer for o in program.outputs if isinstance(o, TensorArg)}
        last: dict[tuple[int, str], int] = {}
        for item in self.items:
            for m, b in item_buffers(program, item):
                last[(m, b)] = item.index
        out: dict[int, list[tuple[int, str]]] = {}
        for (m, b), k in last.items():
            if b in temps and b not in keep:
                out.setdefault(k, []).append((m, b))
        return out

    def group(self, src: int, dst: int) -> Any:
        """The process group of messages from rank ``src`` to rank ``dst``."""
        return self.groups[0] if src < dst else self.groups[1]

    def post(self, copies: Sequence[CopyStep], call: Any) -> None:
        """This rank's end of ``copies`` (one source and destination) as one message on their direction's group."""
        c = copies[0]
        self.executor.post(copies, call, group=self.group(c.src, c.dst), stage=True)

    def post_by_pair(self, copies: Sequence[CopyStep], call: Any) -> None:
        """This rank's end of ``copies``: one message per (source, destination), in order of first appearance."""
        pairs: dict[tuple[int, int], list[CopyStep]] = {}
        for c in copies:
            self.executor.hook(call, c)
            pairs.setdefault((c.src, c.dst), []).append(c)
        for group in pairs.values():
            self.post(group, call)

    def replay(self, group: Sequence[Sequence[Any] | None], first: int | None) -> list | None:
        """One replay: every micro-batch of ``group`` (this rank's inputs of each, or ``None``) once.

        Args:
            group: exactly the schedule's micro-batches.
            first: the index of the group's first micro-batch in the caller's list (named in errors, and given to
                ``step_hook`` as ``executor.calls + first + k``); ``None`` for a single call (one micro-batch,
                named as no micro-batch).

        Returns:
            On the home rank each micro-batch's outputs, in order; ``None`` elsewhere.

        Raises:
            PeerFailureError: a peer died or a message did not complete within ``timeout_s`` (names the peer, the
                edge and the micro-batch).
        """
        ex = self.executor
        if first is None:
            calls = [ex.new_call(group[0], ex.calls)]
        else:
            calls = [ex.new_call(b, ex.calls + first + k, batch=first + k) for k, b in enumerate(group)]
        for call in calls:
            self.post_by_pair(self.inputs, call)
        ctx = RankReplayContext(calls, trace=ex.trace, free_after=self.free_after)
        run_schedule(self.items, ctx)
        for call in calls:
            self.post_by_pair(self.gathers, call)
        for call in calls:
            ex.finish(call, final=True)
        self.last_calls = calls
        return [ex.outputs(c) for c in calls] if ex.rank == ex.home else None


def item_buffers(program: Any, item: ExecItem) -> list[tuple[int, str]]:
    """``(micro-batch, buffer)`` pairs one item of a rank's replay touches."""
    step = item.step
    if isinstance(step, RunStep):
        return [(step.micro_batch, b) for b in launch_buffers(program.launches[step.launch])]
    if isinstance(step, TransferStep):  # the whole message: its last transfer reads every range
        return [(t.micro_batch, b) for t in item.runner.machine.messages[id(step)] for b, _, _ in t.ranges]
    runner = item.runner
    if isinstance(runner, RankWaitRunner):
        return [(t.micro_batch, b) for t in runner.lands for b, _, _ in t.ranges]
    return []


def direction_groups(ctx: Any) -> tuple[Any, Any]:
    """The process groups of the two directions: the default group (to a higher rank) and a new one (to a lower
    rank). Collective: every rank calls it, once.

    Raises:
        RendezvousError: the new group could not be made.
    """
    backstop = datetime.timedelta(seconds=max(2 * ctx.timeout_s, ctx.timeout_s + 30))
    try:
        group = dist.new_group(backend=ctx.backend, timeout=backstop)
        if ctx.backend == "nccl":
            probe_group(group, ctx.device, ctx.timeout_s)
    except RuntimeError as e:
        raise RendezvousError(f"rank {ctx.rank}: could not make the process group of messages to lower ranks ({e}); "
                              "check the other ranks' logs") from e
    return None, group
