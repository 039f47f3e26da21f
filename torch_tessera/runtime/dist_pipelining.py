"""Micro-batch pipelining for the process-per-device runtime: several micro-batches in flight on every rank.

The same design as the in-process :mod:`torch_tessera.runtime.pipelining`, seen from one rank
(:meth:`DistributedExecutor.run_pipelined <torch_tessera.runtime.distributed.DistributedExecutor.run_pipelined>`):

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
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from torch_tessera.errors import RendezvousError, TesseraError
from torch_tessera.runtime.pipelining import Lane, Wave, _check_shared_weights, make_lanes, plan_waves

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _RankDevice:
    """This rank's device as :func:`make_lanes` sees one: a torch device that makes streams."""

    torch_device: torch.device

    def new_stream(self, priority: int) -> Any:
        return torch.cuda.Stream(self.torch_device, priority=priority)


def run_pipelined(executor: Any, batches: Sequence[Sequence[Any]] | None, slots: int) -> list[list] | None:
    """Run ``batches`` through ``executor`` (a ``DistributedExecutor``), ``slots`` micro-batches in flight.

    See the module docstring for the design and ``DistributedExecutor.run_pipelined`` for the arguments. After the
    run, ``executor.stats.batch_cut_edges_sent`` / ``batch_cut_edges_received`` hold the cut edges of each micro-batch
    on this rank, and ``executor.calls`` counts every micro-batch.
    """
    if slots < 1:
        raise TesseraError(f"slots must be at least 1, got {slots}")
    batches = None if batches is None else [list(b) for b in batches]
    if batches:
        for m, b in enumerate(batches):
            if len(b) != len(executor.program.inputs):
                raise TesseraError(f"micro-batch {m}: program expects {len(executor.program.inputs)} inputs, "
                                   f"got {len(b)}")
        static = getattr(executor, "static_inputs", "place") == "place"  # sent once, shared by the micro-batches
        _check_shared_weights(executor.program, batches, static=static)
    n, waves = _agree(executor, batches, slots)
    if n == 0:
        return [] if executor.rank == executor.home else None
    lanes, groups = _lanes(executor, slots), _groups(executor, slots)
    device = [_RankDevice(executor.ctx.device)]
    for lane in lanes:
        lane.join(device)
    inputs = (lambda m: None) if batches is None else (lambda m: batches[m])  # noqa: E731
    with _on(lanes[0]):
        executor.setup(executor.new_call(inputs(0), executor.calls))
    outputs: list[list] = [[] for _ in range(n)]
    done: list = []
    for wave in waves:
        if wave.barrier:
            _drain(executor, done, lanes)
        flights = []
        for k, m in enumerate(wave.batches):
            with _on(lanes[k]):
                flights.append(executor.new_call(inputs(m), executor.calls + m, batch=m, slot=k, group=groups[k]))
        for chunk in executor.chunk_items():
            for k, call in enumerate(flights):
                with _on(lanes[k]):
                    executor.issue(call, chunk)
        for k, call in enumerate(flights):
            with _on(lanes[k]):
                executor.finish(call, final=False)
                if executor.rank == executor.home:
                    outputs[call.batch] = executor.outputs(call)
        done += flights
    _drain(executor, done, lanes)
    done.sort(key=lambda c: c.batch)
    stats = executor.stats
    stats.batch_cut_edges_sent = [c.sent for c in done]
    stats.batch_cut_edges_received = [c.received for c in done]
    stats.cut_edges_sent = set().union(*stats.batch_cut_edges_sent)
    stats.cut_edges_received = set().union(*stats.batch_cut_edges_received)
    executor.calls += n
    return outputs if executor.rank == executor.home else None


def _agree(executor: Any, batches: list | None, slots: int) -> tuple[int, list[Wave]]:
    """Every rank's (number of micro-batches, slots); the home rank's waves. Raises on every rank if they differ."""
    ctx = executor.ctx
    home = executor.rank == executor.home
    if home and batches is None:
        raise TesseraError(f"rank {executor.rank} is home: it needs every micro-batch's inputs")
    waves = plan_waves(executor.program, batches, slots) if home else None
    mine = (None if batches is None else len(batches), slots, waves)
    every: list = [None] * ctx.world_size
    try:
        dist.all_gather_object(every, mine, group=ctx.control)
    except RuntimeError as e:
        raise RendezvousError(f"rank {executor.rank}: the ranks could not exchange the micro-batch plan of a pipelined "
                              f"run ({e}); check the other ranks' logs") from e
    n, want, waves = every[executor.home]
    bad = [r for r, (count, s, _) in enumerate(every) if s != want or count not in (None, n)]
    if bad:
        raise TesseraError(
            f"pipelined run: ranks {bad} disagree with home rank {executor.home} on the micro-batches or slots "
            f"(each rank's (micro-batches, slots): {[(c, s) for c, s, _ in every]}); every rank must call "
            f"run_pipelined with the same slots and as many micro-batches (or None where allowed)")
    return n, waves


def _lanes(executor: Any, slots: int) -> list[Lane]:
    cache = executor.__dict__.setdefault("_lanes", {})
    if slots not in cache:
        cache[slots] = make_lanes([_RankDevice(executor.ctx.device)], slots)
    return cache[slots]


def _groups(executor: Any, slots: int) -> list[Any]:
    """The process group of each slot: the default group for slot 0, one new group per further slot (made once, in
    slot order, by every rank: ``new_group`` is collective)."""
    groups = executor.__dict__.setdefault("_slot_groups", [None])
    ctx = executor.ctx
    backstop = datetime.timedelta(seconds=max(2 * ctx.timeout_s, ctx.timeout_s + 30))
    while len(groups) < slots:
        try:
            group = dist.new_group(backend=ctx.backend, timeout=backstop)
            if ctx.backend == "nccl":
                from torch_tessera.runtime.distributed import probe_group

                probe_group(group, ctx.device, ctx.timeout_s)
        except RuntimeError as e:
            raise RendezvousError(f"rank {executor.rank}: could not make the process group of pipeline slot "
                                  f"{len(groups)} ({e}); check the other ranks' logs") from e
        groups.append(group)
        log.info("rank %d: process group for pipeline slot %d made", executor.rank, len(groups) - 1)
    return groups[:slots]


def _on(lane: Lane) -> Any:
    """The slot's stream as the current stream (CUDA); nothing on CPU."""
    import contextlib

    stream = lane.streams[0]
    return torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else contextlib.nullcontext()


def _drain(executor: Any, calls: list, lanes: Sequence[Lane]) -> None:
    """Everything issued so far has finished: messages polled to completion (bounded), slot streams synchronised."""
    executor.check_completed(calls)
    for lane in lanes:
        for s in lane.cuda_streams():
            s.synchronize()
