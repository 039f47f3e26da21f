"""Micro-batch pipelining for the process-per-device runtime: several micro-batches in flight on every rank.

The same design as the in-process :mod:`torch_tessera.runtime.pipelining`, seen from one rank
(:class:`DistPipeline`, driven by :func:`torch_tessera.runtime.pipelining.run_pipelined`, the one driver of pipelined
runs):

1. **Slots.** Slot ``k`` (a :class:`~torch_tessera.runtime.pipelining.Lane` over this rank's device) has its own
   compute stream at the slot's priority (slot 0 most urgent, :func:`~torch_tessera.runtime.pipelining.slot_priorities`)
   and its own process group for point-to-point messages: slot 0 uses the default group, slot ``k >= 1`` a group made
   once per executor (every rank makes them in the same order). With NCCL each group has its own communicator and
   stream, so one slot's messages never queue behind another slot's (the in-process runtime's per-slot copy streams).
2. **Agreement.** At the start of a run the ranks exchange (over the gloo control group) their number of micro-batches
   and ``slots``; the home rank's waves
   (:func:`~torch_tessera.runtime.pipelining.plan_waves`: micro-batches whose state storages overlap never share a
   wave) are used by every rank. A disagreement raises :class:`TesseraError` on every rank.
3. **Interleaved issue, one global order.** The global schedule is cut into chunks
   (:func:`~torch_tessera.runtime.pipelining.schedule_chunks`); a wave is issued chunk by chunk, round-robin over its
   micro-batches, each rank doing only its part (its launches, its end of each transfer, a chunk's copies with one
   peer posted as one ``batch_isend_irecv``). Every rank walks the same (chunk, micro-batch) order and a micro-batch's
   messages go through its slot's group only, so sends and receives match in posting order (NCCL has no tags) and a
   micro-batch's bytes never land in another's buffers; a rank only waits on messages it posted earlier in that
   order, so the waits cannot form a cycle.
4. **Buffers and waits.** Each micro-batch has its own pool (temporaries, receive buffers, outputs; weights shared) and
   its own pending messages; waits are the single call's (a receive before the first launch that touches its buffer,
   a send before its buffer is overwritten or freed), made on the slot's stream. At the end of a wave every
   micro-batch's messages are waited on (gloo: blocking, bounded by ``timeout_s``; NCCL: stream-ordered). At a wave
   barrier and at the end of the run, every NCCL message is polled to completion (bounded) and the slot streams are
   synchronised.

Failure: as for a single call, :class:`~torch_tessera.errors.PeerFailureError` within ``timeout_s``, naming this rank,
the peer, the edge and the micro-batch (and its slot).
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from torch_tessera.errors import RendezvousError, TesseraError
from torch_tessera.runtime.pipelining import Wave, check_shared_weights, issue_round_robin, plan_waves
from torch_tessera.runtime.streams import Lane, make_lanes

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


@dataclass(frozen=True)
class _RankDevice:
    """This rank's device as :func:`make_lanes` sees one: a torch device that makes streams."""

    torch_device: torch.device

    def new_stream(self, priority: int) -> Any:
        return torch.cuda.Stream(self.torch_device, priority=priority)


class DistPipeline:
    """A ``DistributedExecutor``'s side of :func:`~torch_tessera.runtime.pipelining.run_pipelined` (its public
    interface: ``program``, ``ctx``, ``rank``, ``home``, ``calls``, ``stats``, ``static_inputs``, ``new_call``,
    ``setup``, ``chunk_items``, ``issue``, ``finish``, ``outputs``, ``check_completed``).

    After a run, ``executor.stats.batch_cut_edges_sent`` / ``batch_cut_edges_received`` hold the cut edges of each
    micro-batch on this rank, and ``executor.calls`` counts every micro-batch.
    """

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.batches: list | None = None
        self._lanes: dict[int, list[Lane]] = {}
        self._groups: list[Any] = [None]  # slot 0: the default group

    def check(self, batches: Sequence[Sequence[Any]] | None) -> list | None:
        ex = self.executor
        batches = None if batches is None else [list(b) for b in batches]
        if batches:
            for m, b in enumerate(batches):
                if len(b) != len(ex.program.inputs):
                    raise TesseraError(f"micro-batch {m}: program expects {len(ex.program.inputs)} inputs, "
                                       f"got {len(b)}")
            check_shared_weights(ex.program, batches, static=ex.static_inputs == "place")
        return batches

    def waves(self, batches: list | None, slots: int) -> tuple[int, list[Wave]]:
        """Every rank's (number of micro-batches, slots); the home rank's waves. Raises on every rank if they
        differ."""
        ex = self.executor
        home = ex.rank == ex.home
        if home and batches is None:
            raise TesseraError(f"rank {ex.rank} is home: it needs every micro-batch's inputs")
        waves = plan_waves(ex.program, batches, slots) if home else None
        mine = (None if batches is None else len(batches), slots, waves)
        every: list = [None] * ex.ctx.world_size
        try:
            dist.all_gather_object(every, mine, group=ex.ctx.control)
        except RuntimeError as e:
            raise RendezvousError(f"rank {ex.rank}: the ranks could not exchange the micro-batch plan of a pipelined "
                                  f"run ({e}); check the other ranks' logs") from e
        n, want, waves = every[ex.home]
        bad = [r for r, (count, s, _) in enumerate(every) if s != want or count not in (None, n)]
        if bad:
            raise TesseraError(
                f"pipelined run: ranks {bad} disagree with home rank {ex.home} on the micro-batches or slots "
                f"(each rank's (micro-batches, slots): {[(c, s) for c, s, _ in every]}); every rank must call "
                f"run_pipelined with the same slots and as many micro-batches (or None where allowed)")
        self.slots = slots
        return n, waves

    def lanes(self, slots: int) -> list[Lane]:
        if slots not in self._lanes:
            self._lanes[slots] = make_lanes([_RankDevice(self.executor.ctx.device)], slots)
        return self._lanes[slots]

    def groups(self, slots: int) -> list[Any]:
        """The process group of each slot: the default group for slot 0, one new group per further slot (made once,
        in slot order, by every rank: ``new_group`` is collective)."""
        ex = self.executor
        groups = self._groups
        ctx = ex.ctx
        backstop = datetime.timedelta(seconds=max(2 * ctx.timeout_s, ctx.timeout_s + 30))
        while len(groups) < slots:
            try:
                group = dist.new_group(backend=ctx.backend, timeout=backstop)
                if ctx.backend == "nccl":
                    probe_group(group, ctx.device, ctx.timeout_s)
            except RuntimeError as e:
                raise RendezvousError(f"rank {ex.rank}: could not make the process group of pipeline slot "
                                      f"{len(groups)} ({e}); check the other ranks' logs") from e
            groups.append(group)
            log.info("rank %d: process group for pipeline slot %d made", ex.rank, len(groups) - 1)
        return groups[:slots]

    def begin(self, batches: list | None, lanes: Sequence[Lane]) -> None:
        ex = self.executor
        self.batches = batches
        self.slot_groups = self.groups(self.slots)
        device = [_RankDevice(ex.ctx.device)]
        for lane in lanes:
            lane.join(device)
        with _on(lanes[0]):
            ex.setup(ex.new_call(self._inputs(0), ex.calls))

    def _inputs(self, m: int) -> list | None:
        return None if self.batches is None else self.batches[m]

    def issue_wave(self, wave: Wave, batches: list | None, lanes: Sequence[Lane]) -> list:
        """Issue one wave chunk by chunk, round-robin over its micro-batches, each on its slot's stream and group;
        then wait for its messages and take the outputs (home rank)."""
        ex = self.executor
        flights = []
        for k, m in enumerate(wave.batches):
            with _on(lanes[k]):
                call = ex.new_call(self._inputs(m), ex.calls + m, batch=m, slot=k, group=self.slot_groups[k])
            flights.append((call, lanes[k]))

        def issue(flight: tuple, chunk: Sequence[int]) -> None:
            with _on(flight[1]):
                ex.issue(flight[0], chunk)

        issue_round_robin(ex.chunk_items(), flights, issue)
        for call, lane in flights:
            with _on(lane):
                ex.finish(call, final=False)
                if ex.rank == ex.home:
                    call.outputs = ex.outputs(call)
        return [call for call, _ in flights]

    def drain(self, calls: Sequence[Any], lanes: Sequence[Lane]) -> None:
        """Everything issued so far has finished: messages polled to completion (bounded), slot streams
        synchronised."""
        self.executor.check_completed(calls)
        for lane in lanes:
            for s in lane.cuda_streams():
                s.synchronize()

    def finish(self, calls: Sequence[Any], n: int) -> list[list] | None:
        ex = self.executor
        home = ex.rank == ex.home
        if n == 0:
            return [] if home else None
        calls = sorted(calls, key=lambda c: c.batch)
        stats = ex.stats
        stats.batch_cut_edges_sent = [c.sent for c in calls]
        stats.batch_cut_edges_received = [c.received for c in calls]
        stats.cut_edges_sent = set().union(*stats.batch_cut_edges_sent)
        stats.cut_edges_received = set().union(*stats.batch_cut_edges_received)
        ex.calls += n
        return [c.outputs for c in calls] if home else None


def _on(lane: Lane) -> Any:
    """The slot's stream as the current stream (CUDA); nothing on CPU."""
    import contextlib

    stream = lane.streams[0]
    return torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else contextlib.nullcontext()
