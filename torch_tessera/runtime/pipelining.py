"""Micro-batch pipelining: several independent micro-batches in flight through one placed program.

With one call in flight, each device idles while its peer computes and while activations cross the link.
:meth:`InProcessPipeline.run` keeps ``slots`` micro-batches in flight through the in-process executor, in waves,
when no explicit schedule is given. (With one, the executor replays it:
:mod:`torch_tessera.runtime.replay`; the process-per-device runtime always does: :mod:`torch_tessera.runtime.
dist_replay`.)

1. **Slots.** Slot ``k`` (a :class:`~torch_tessera.runtime.streams.Lane`) has its own compute stream per device and
   its own copy stream per link, all at the slot's priority: slot 0 most urgent (:func:`slot_priorities`), so the
   earlier micro-batch wins when two compete for a device and the slots' compute and transfer phases fall out of
   step.
2. **Waves.** Micro-batches are taken ``slots`` at a time, in order; the ``k``-th of a wave runs on slot ``k``. Two
   micro-batches that pass the same state storage (a KV cache both write) never share a wave: the later one starts
   after everything before it has finished (logged).
3. **Interleaved issue.** The schedule is cut into chunks: the copies and waits a device segment needs, then the
   segment (consecutive launches on one device). Chunk ``c`` is issued for every micro-batch of the wave before chunk
   ``c + 1`` (:func:`issue_round_robin`), so while slot 0's activations cross a link, slot 1's launches of the
   previous stage are already queued on the other device. Events between streams are exactly those of a single
   call, per slot.
4. **Buffers.** Each micro-batch has its own pools: temporaries and copies of its INPUT buffers on each device, its
   outputs; weights (PARAMETER inputs) and static INPUTs (``KernelProgram.static_inputs``: module buffers), which
   must be the same tensors in every micro-batch, are copied to each device once and shared (a static INPUT again,
   before the run's first wave, when the caller moved or modified it since, or is an inference tensor; never by a
   micro-batch, whose copy would overwrite a storage other slots' launches may be reading). With
   ``static_inputs="copy"`` static INPUTs are copied per micro-batch like other inputs. Temporaries are allocated on
   the slot's stream of the device that first needs them and freed after their last use in the schedule (for devices
   sharing memory, the last use on any of them), after being marked as in use by the slot's other streams
   (``record_stream``) so that the allocator never hands them out early.
5. **CUDA graphs** (``cuda_graphs=True``): each slot has its own static pools and its own graphs
   (:meth:`torch_tessera.runtime.graphs.CUDAGraphWrapper.issue_wave`); before a slot is reused its streams wait for
   all of its previous work (a device-side barrier, no host synchronisation).

On CPU virtual devices streams are stand-ins and every step runs at once, so the results, the copies and the counts are
those of the GPU run; the overlap is not.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime.executor import launch_buffers
from torch_tessera.runtime.realize import CallContext, report_transfers, run_schedule
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep
from torch_tessera.runtime.streams import (  # noqa: F401 - part of this module's interface
    CPU_GREATEST_PRIORITY,
    PRIORITY_CLASSES,
    Lane,
    greatest_priority,
    make_lanes,
    single_priority,
    slot_priorities,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wave:
    """Micro-batches issued together, the ``k``-th on slot ``k``; ``barrier``: wait for all earlier ones first."""

    batches: tuple[int, ...]
    barrier: bool = False


def plan_waves(program: Any, batches: Sequence[Sequence[Any]], slots: int) -> list[Wave]:
    """Group micro-batches into waves of at most ``slots``, in order.

    A micro-batch whose STATE inputs share a storage with any input (other than weights) of a micro-batch still in
    flight, or the reverse, starts a new wave behind a barrier: micro-batches that write the same state run in order.
    """
    kinds = [program.buffers[s.buffer].kind if isinstance(s, TensorArg) else None for s in program.inputs]

    def storages(inputs: Sequence[Any], wanted: set) -> set[int]:
        return {v.untyped_storage().data_ptr() for k, v in zip(kinds, inputs)
                if k in wanted and isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() != 0}

    writes = [storages(b, {BufferKind.STATE}) for b in batches]
    touches = [storages(b, {BufferKind.STATE, BufferKind.INPUT}) for b in batches]
    waves: list[Wave] = []
    current: list[int] = []
    barrier = False
    pending: list[int] = []  # issued since the last barrier
    for m in range(len(batches)):
        clash = [p for p in pending if writes[m] & touches[p] or writes[p] & touches[m]]
        if clash or len(current) == slots:
            if current:
                waves.append(Wave(tuple(current), barrier))
            current, barrier = [], bool(clash)
            if clash:
                log.info("micro-batch %d shares state storage with micro-batch %d: running it after those before it",
                         m, clash[0])
                pending = []
        current.append(m)
        pending.append(m)
    if current:
        waves.append(Wave(tuple(current), barrier))
    return waves


def schedule_chunks(steps: Sequence[Any]) -> list[tuple[int, int]]:
    """Cut ``steps`` into chunks ``[start, end)``: the copies and waits before a device segment, then the segment.

    Args:
        steps: schedule steps (:class:`LaunchStep` runs on one device form a segment) or CUDA-graph items (each
            ``Segment`` is one); anything that is not a copy or a wait counts as a launch with a ``device``.
    """
    chunks: list[tuple[int, int]] = []
    start = 0
    for i, step in enumerate(steps):
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if _is_launch(step) and not (nxt is not None and _is_launch(nxt) and _device(nxt) == _device(step)):
            chunks.append((start, i + 1))
            start = i + 1
    if start < len(steps):
        chunks.append((start, len(steps)))
    return chunks


def _is_launch(item: Any) -> bool:
    return not isinstance(item, (CopyStep, SyncStep))


def _device(item: Any) -> int:
    return item.device


def issue_round_robin(chunks: Sequence[Any], flights: Sequence[Any], issue: Callable[[Any, Any], None]) -> None:
    """Issue chunk ``c`` for every flight (micro-batch) before chunk ``c + 1``: ``issue(flight, chunk)``."""
    for chunk in chunks:
        for flight in flights:
            issue(flight, chunk)


def domain_last_uses(executor: Any) -> dict[int, list[tuple[int, str]]]:
    """Step index after which each temporary of a memory domain is no longer needed by any device of the domain.

    Returns ``{step index: [(device, buffer)]}`` with ``device`` any device of the domain (they share one pool).
    Outputs are kept on the home domain.
    """
    program, dom = executor.program, executor.domains
    temps = {b.name for b in program.buffers.values() if b.kind == BufferKind.TEMP}
    outputs = {o.buffer for o in program.outputs if isinstance(o, TensorArg)}
    last: dict[tuple[int, str], tuple[int, int]] = {}
    for i, step in enumerate(executor.schedule.steps):
        if isinstance(step, LaunchStep):
            for b in launch_buffers(program.launches[step.launch]):
                last[(dom[step.device], b)] = (i, step.device)
        elif isinstance(step, CopyStep):
            last[(dom[step.src], step.buffer)] = (i, step.src)
            last[(dom[step.dst], step.buffer)] = (i, step.dst)
    out: dict[int, list[tuple[int, str]]] = {}
    for (d, b), (i, dev) in last.items():
        if b in temps and not (d == dom[executor.home] and b in outputs):
            out.setdefault(i, []).append((dev, b))
    return out


def check_disjoint_state(program: Any, batches: Sequence[Sequence[Any]], size: int, remedy: str) -> None:
    """Raise :class:`TesseraError` if the micro-batches of a group of ``size`` (``batches[g:g + size]``) pass
    overlapping state storages (a KV cache both write): one replay of a schedule runs its micro-batches side by side,
    in disjoint storage. ``remedy`` ends the message (the caller's other way to run them)."""
    for g in range(0, len(batches), size):
        if len(plan_waves(program, batches[g:g + size], size)) > 1:
            raise TesseraError(f"micro-batches {g}..{min(g + size, len(batches)) - 1} pass overlapping state storages "
                               "(a KV cache both write): one replay runs its micro-batches in disjoint storage; give "
                               f"each its own state, or {remedy}")


def check_shared_weights(program: Any, batches: Sequence[Sequence[Any]], static: bool = True) -> None:
    """Raise :class:`TesseraError` if a micro-batch passes another tensor than micro-batch 0 for a weight
    (PARAMETER) or, with ``static`` (``static_inputs="place"``), a static INPUT (``program.static_inputs``): the
    micro-batches share one placed copy of each."""
    static = set(getattr(program, "static_inputs", ())) if static else set()
    for i, spec in enumerate(program.inputs):
        if not isinstance(spec, TensorArg):
            continue
        kind = program.buffers[spec.buffer].kind
        if kind == BufferKind.PARAMETER or (kind == BufferKind.INPUT and spec.buffer in static):
            first = batches[0][i] if batches else None
            what = "weight" if kind == BufferKind.PARAMETER else "static"
            for m, b in enumerate(batches[1:], 1):
                if not isinstance(b[i], torch.Tensor) or b[i].data_ptr() != first.data_ptr():
                    raise TesseraError(
                        f"micro-batch {m} passes another tensor for {what} input {i} ({spec.buffer}) than micro-batch "
                        f"0: pipelined micro-batches share one copy of the {what} inputs; pass the same tensors")


class InProcessPipeline:
    """The in-process executor's micro-batch waves (:meth:`run`; a
    :class:`~torch_tessera.runtime.placed.PlacedExecutor`'s public interface only).

    After a run, ``executor.cut_edges_per_batch`` holds the distinct cut edges copied for each micro-batch,
    ``executor.cut_edges_transferred`` their sum, and ``executor.calls`` counts every micro-batch.
    """

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self._lanes: dict[tuple[int, str], list[Lane]] = {}
        steps = executor.schedule.steps
        self.chunks = [executor.items[s:e] for s, e in schedule_chunks(steps)]
        self.free_after = domain_last_uses(executor)

    def run(self, batches: Sequence[Sequence[Any]], slots: int) -> list[list]:
        """Run each micro-batch of ``batches``, ``slots`` in flight, in waves (the module docstring).

        Args:
            batches: one input list per micro-batch (see
                :meth:`~torch_tessera.runtime.placed.PlacedExecutor.run_pipelined`).
            slots: micro-batches in flight at once, ``>= 1``.

        Returns:
            the outputs of each micro-batch, in order.

        Raises:
            TesseraError: ``slots < 1`` or what :meth:`check` refuses.
            TransferTimeout: a transfer did not complete within the executor's ``timeout_s``.
        """
        if slots < 1:
            raise TesseraError(f"slots must be at least 1, got {slots}")
        batches = self.check(batches)
        n, waves = self.waves(batches, slots)
        if n == 0:
            return self.finish([], 0)
        lanes = self.lanes(slots)
        self.begin(batches, lanes)
        done: list = []
        pending: list = []  # flights issued since the last drain
        for wave in waves:
            if wave.barrier:
                self.drain(pending, lanes)
                pending = []
            flights = self.issue_wave(wave, batches, lanes)
            done += flights
            pending += flights
        self.drain(pending, lanes)
        return self.finish(done, n)

    def lanes(self, slots: int) -> list[Lane]:
        """The ``slots`` lanes of this executor's priority class (made once per slot count)."""
        ex = self.executor
        key = (slots, ex.priority_class)
        if key not in self._lanes:
            self._lanes[key] = make_lanes(ex.devices, slots, key[1])
        return self._lanes[key]

    def check(self, batches: Sequence[Sequence[Any]]) -> list[list]:
        ex = self.executor
        batches = [list(b) for b in batches]
        for m, b in enumerate(batches):
            if len(b) != len(ex.program.inputs):
                raise TesseraError(f"micro-batch {m}: program expects {len(ex.program.inputs)} inputs, got {len(b)}")
        check_shared_weights(ex.program, batches, static=ex.static_inputs == "place")
        return batches

    def waves(self, batches: Sequence[Sequence[Any]], slots: int) -> tuple[int, list[Wave]]:
        return len(batches), plan_waves(self.executor.program, batches, slots)

    def begin(self, batches: Sequence[Sequence[Any]], lanes: Sequence[Lane]) -> None:
        """Join the caller's streams; place weights and static inputs once (a static input again if the caller
        changed it, or an inference tensor), before any slot reads them: the previous run ended with every stream
        waited on, so nothing reads them now. The micro-batches then bind without placing."""
        ex = self.executor
        for lane in lanes:
            lane.join(ex.devices)
        if not ex.setup_done or ex.stale_static(batches[0], ex.static_placed):
            ex.join_caller()
            ex.bind_call(batches[0])
            ex.wait([], ex.streams)
            for d in ex.devices:
                d.synchronize()

    def issue_wave(self, wave: Wave, batches: Sequence[Sequence[Any]], lanes: Sequence[Lane]) -> list[CallContext]:
        """Issue one wave; returns one context per micro-batch, its ``outputs`` set."""
        ex = self.executor
        if ex.graphs is not None:
            return ex.graphs.issue_wave([(m, batches[m]) for m in wave.batches], lanes)
        flights = []
        for k, m in enumerate(wave.batches):
            lane = lanes[k]
            # placed by begin(); placing here could overwrite a storage other slots are reading
            ctx = ex.call_context(ex.bind_call(batches[m], place=False), lane.streams, lane=lane, batch=m)
            ctx.free_after = self.free_after
            ctx.release = functools.partial(release, ex.domains, ctx)
            flights.append(ctx)
        issue_round_robin(self.chunks, flights, lambda ctx, chunk: run_schedule(chunk, ctx))
        for ctx in flights:
            ctx.outputs = ex.outputs(ctx.pools[ex.home])
        return flights

    def drain(self, flights: Sequence[CallContext], lanes: Sequence[Lane]) -> None:
        """Wait for the flights' copies and every stream of the slots."""
        ex = self.executor
        ex.wait([e for f in flights for e in f.events],
                [s for lane in lanes for s in [*lane.streams, *lane.copy_streams.values()]])
        for f in flights:
            report_transfers(ex.machine, f)

    def finish(self, flights: Sequence[CallContext], n: int) -> list[list]:
        ex = self.executor
        flights = sorted(flights, key=lambda f: f.batch)
        ex.cut_edges_per_batch = [len(f.edges) for f in flights]
        ex.cut_edges_transferred = sum(ex.cut_edges_per_batch)
        ex.calls += n
        return [f.outputs for f in flights]


def release(domains: Sequence[int], ctx: CallContext, dev: int, name: str) -> None:
    """Free a temporary of micro-batch ``ctx`` after its last use, marking it in use by every stream of the slot
    on its memory domain (so the allocator does not hand it out while another stream may still use it)."""
    pool = ctx.pools[dev]
    t = pool.storages.get(name)
    if t is None:
        return
    if t.is_cuda:
        for d, s in enumerate(ctx.lane.streams):
            if domains[d] == domains[dev] and isinstance(s, torch.cuda.Stream):
                t.record_stream(s)
    pool.free(name)
