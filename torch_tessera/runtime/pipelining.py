"""Micro-batch pipelining: several independent micro-batches in flight through one placed program.

With one call in flight, each device idles while its peer computes and while activations cross the link (the paper's
ablation: ~50 % of the zero-communication optimum). :func:`run_pipelined` keeps ``slots`` micro-batches in flight:

1. **Slots.** Slot ``k`` (a :class:`Lane`) has its own compute stream per device and its own copy stream per link, all
   at the slot's priority: slot 0 most urgent (:func:`slot_priorities`), so the earlier micro-batch wins when two
   compete for a device and the slots' compute and transfer phases fall out of step.
2. **Waves.** Micro-batches are taken ``slots`` at a time, in order; the ``k``-th of a wave runs on slot ``k``. Two
   micro-batches that pass the same state storage (a KV cache both write) never share a wave: the later one starts
   after everything before it has finished (logged).
3. **Interleaved issue.** The schedule is cut into chunks: the copies and waits a device segment needs, then the
   segment (consecutive launches on one device). Chunk ``c`` is issued for every micro-batch of the wave before chunk
   ``c + 1``, so while slot 0's activations cross a link, slot 1's launches of the previous stage are already queued
   on the other device. Events between streams are exactly those of a single call, per slot.
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
   (:func:`torch_tessera.runtime.graphs.issue_wave_with_graphs`); before a slot is reused its streams wait for all of
   its previous work (a device-side barrier, no host synchronisation).

On CPU virtual devices streams are stand-ins and every step runs at once, so the results, the copies and the counts are
those of the GPU run; the overlap is not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime.executor import BufferPool, launch_buffers
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep

log = logging.getLogger(__name__)

#: Most urgent stream priority assumed where CUDA cannot be asked (CPU virtual devices): CUDA's range on recent GPUs.
CPU_GREATEST_PRIORITY = -5


#: Priority classes of a program's streams (``PlacedExecutor.priority_class``): when several programs share the devices
#: (an LLM's prefill and decode served at the same time), the one on a request's per-token path is ``"urgent"`` and
#: the bulk one ``"background"``, so a decode kernel waiting behind a prefill GEMM gets the SMs as soon as blocks
#: retire. The paper's pipelining ablation staggers priorities across micro-batches (96.6 % of the zero-communication
#: optimum vs about 50 % without pipelining, arXiv 2604.10180 section 5); this carries the idea across programs.
from torch_tessera.options import PRIORITY_CLASSES  # noqa: E402  (the home is options)


def slot_priorities(slots: int, greatest: int, priority_class: str = "normal") -> list[int]:
    """Stream priority of each slot (lower is more urgent).

    ``"normal"``: slot 0 the most urgent, each later slot one level less, the last at 0. ``"urgent"``: the same
    staggering one level more urgent, so no slot is at 0 (where a ``"normal"`` program's last slot and every
    ``"background"`` stream run). ``"background"``: every slot at 0. All are clipped at ``greatest``.

    Args:
        slots: number of slots (>= 1).
        greatest: the most urgent priority the device allows (CUDA: negative, e.g. -5; lower is more urgent).
        priority_class: one of :data:`PRIORITY_CLASSES`.

    Raises:
        ValueError: an unknown ``priority_class``.
    """
    if priority_class not in PRIORITY_CLASSES:
        raise ValueError(f"priority_class={priority_class!r}: use one of {PRIORITY_CLASSES}")
    if priority_class == "background":
        return [0] * slots
    shift = 1 if priority_class == "urgent" else 0
    return [max(greatest, -(slots - 1 - k) - shift) for k in range(slots)]


def single_priority(priority_class: str, greatest: int) -> int:
    """Priority of a program's own (non-pipelined) compute streams: 0, or one level more urgent for ``"urgent"``."""
    return slot_priorities(1, greatest, priority_class)[0]


def greatest_priority(devices: Sequence[Any]) -> int:
    """The most urgent stream priority the devices allow (CUDA's, or :data:`CPU_GREATEST_PRIORITY` on CPU)."""
    if any(d.torch_device.type == "cuda" for d in devices):
        return torch.cuda.Stream.priority_range()[1]
    return CPU_GREATEST_PRIORITY


@dataclass
class Lane:
    """One pipeline slot's streams.

    Attributes:
        slot: slot index (0 = most urgent).
        priority: the stream priority of all its streams (lower is more urgent).
        streams: compute stream per device (index as the executor's devices); None on a CPU virtual device.
        copy_streams: copy stream per link ``(src, dst)``, made at first use.
    """

    slot: int
    priority: int
    devices: list[Any]
    streams: list[Any]
    copy_streams: dict[tuple[int, int], Any] = field(default_factory=dict)

    def copy_stream(self, src: int, dst: int) -> Any:
        """The slot's copy stream for link ``src -> dst`` (on the destination device when it is a GPU)."""
        key = (src, dst)
        if key not in self.copy_streams:
            dev = self.devices[dst] if self.devices[dst].torch_device.type == "cuda" else self.devices[src]
            self.copy_streams[key] = dev.new_stream(priority=self.priority) if dev.torch_device.type == "cuda" else None
        return self.copy_streams[key]

    def cuda_streams(self) -> list[Any]:
        """Every CUDA stream of the slot: compute, then copy."""
        return [s for s in [*self.streams, *self.copy_streams.values()] if isinstance(s, torch.cuda.Stream)]

    def barrier(self) -> None:
        """Make every compute stream of the slot wait for all work queued so far on all the slot's streams."""
        every = self.cuda_streams()
        for s in self.streams:
            if isinstance(s, torch.cuda.Stream):
                for t in every:
                    if t is not s:
                        s.wait_stream(t)

    def join(self, devices: Sequence[Any]) -> None:
        """Every compute stream waits for the caller's current stream on its device (inputs may be in flight)."""
        for dev, s in zip(devices, self.streams):
            if isinstance(s, torch.cuda.Stream):
                caller = torch.cuda.current_stream(dev.torch_device)
                if s.cuda_stream != caller.cuda_stream:
                    s.wait_stream(caller)


def make_lanes(devices: Sequence[Any], slots: int, priority_class: str = "normal") -> list[Lane]:
    """``slots`` lanes over ``devices`` with staggered priorities (see :func:`slot_priorities`)."""
    greatest = greatest_priority(devices)
    return [Lane(k, p, list(devices), [d.new_stream(priority=p) if d.torch_device.type == "cuda" else None
                                        for d in devices])
            for k, p in enumerate(slot_priorities(slots, greatest, priority_class))]


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


@dataclass
class _Flight:
    """One micro-batch being issued: its index, slot, pools and the cut edges it copied."""

    batch: int
    lane: Lane
    pools: list[BufferPool]
    edges: set = field(default_factory=set)


def run_pipelined(executor: Any, batches: Sequence[Sequence[Any]], slots: int) -> list[list]:
    """Run each micro-batch of ``batches`` through ``executor`` (a :class:`PlacedExecutor`), ``slots`` in flight.

    See the module docstring for the design. After the call, ``executor.cut_edges_per_batch`` holds the distinct cut
    edges copied for each micro-batch and ``executor.cut_edges_transferred`` their sum; ``executor.calls`` counts
    every micro-batch.

    Raises:
        TesseraError: ``slots < 1``, a micro-batch with the wrong number of inputs, or with other weights (or,
            with ``static_inputs="place"``, static INPUTs) than the first micro-batch.
        TransferTimeout: a transfer did not complete within ``executor.timeout_s``.
    """
    if slots < 1:
        raise TesseraError(f"slots must be at least 1, got {slots}")
    program = executor.program
    batches = [list(b) for b in batches]
    for m, b in enumerate(batches):
        if len(b) != len(program.inputs):
            raise TesseraError(f"micro-batch {m}: program expects {len(program.inputs)} inputs, got {len(b)}")
    _check_shared_weights(program, batches, static=getattr(executor, "static_inputs", "place") == "place")
    if not batches:
        return []
    lanes = _lanes(executor, slots)
    for lane in lanes:
        lane.join(executor.devices)
    if not executor._setup_done or executor.stale_static(batches[0], executor._static_placed):
        # weights and static inputs onto their devices once (a static input again if the caller changed it, or an
        # inference tensor), before any slot reads them: the previous run ended with every stream waited on, so
        # nothing reads them now; the micro-batches then bind without placing (``_issue_wave``)
        executor._join_caller()
        executor._bind_call(batches[0])
        executor._wait([], executor.streams)
        for d in executor.devices:
            d.synchronize()
    outputs: list[list] = [[] for _ in batches]
    edges: list[set] = [set() for _ in batches]
    events: list[tuple[CopyStep, Any]] = []
    every_stream = lambda: [s for lane in lanes for s in [*lane.streams, *lane.copy_streams.values()]]  # noqa: E731
    for wave in plan_waves(program, batches, slots):
        if wave.barrier:
            executor._wait(events, every_stream())
            events = []
        if executor.cuda_graphs:
            from torch_tessera.runtime.graphs import issue_wave_with_graphs

            issue_wave_with_graphs(executor, [(m, batches[m]) for m in wave.batches], lanes, outputs, edges, events)
        else:
            _issue_wave(executor, [(m, batches[m]) for m in wave.batches], lanes, outputs, edges, events)
    executor._wait(events, every_stream())
    executor.cut_edges_per_batch = [len(e) for e in edges]
    executor.cut_edges_transferred = sum(executor.cut_edges_per_batch)
    executor.calls += len(batches)
    return outputs


def _lanes(executor: Any, slots: int) -> list[Lane]:
    cache = executor.__dict__.setdefault("_lanes", {})
    key = (slots, getattr(executor, "priority_class", "normal"))
    if key not in cache:
        cache[key] = make_lanes(executor.devices, slots, key[1])
    return cache[key]


def _check_shared_weights(program: Any, batches: Sequence[Sequence[Any]], static: bool = True) -> None:
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


def _issue_wave(executor: Any, wave: Sequence[tuple[int, Sequence[Any]]], lanes: Sequence[Lane],
                outputs: list[list], edges: list[set], events: list) -> None:
    """Eager issue of one wave: chunk by chunk, round-robin over its micro-batches."""
    steps = executor.schedule.steps
    cache = executor.__dict__.setdefault("_pipeline_plan", {})
    if "chunks" not in cache:
        cache["chunks"] = schedule_chunks(steps)
        cache["free_after"] = domain_last_uses(executor)
    chunks, free_after = cache["chunks"], cache["free_after"]
    # placed by run_pipelined before the first wave; placing here could overwrite a storage other slots are reading
    flights = [_Flight(m, lanes[k], executor._bind_call(inputs, place=False)) for k, (m, inputs) in enumerate(wave)]
    for start, end in chunks:
        for f in flights:
            for i in range(start, end):
                step = steps[i]
                if isinstance(step, LaunchStep):
                    executor._launch(step, f.pools, f.lane)
                elif isinstance(step, SyncStep):
                    executor._sync(step, f.lane)
                else:
                    ev = executor._copy(step, f.pools, f.lane, f.edges)
                    if ev is not None:
                        events.append((step, ev))
                for dev, b in free_after.get(i, ()):
                    _release(executor, f, dev, b)
    home = executor.home
    for f in flights:
        pool = f.pools[home]
        for o in executor.program.outputs:
            if isinstance(o, TensorArg) and o.buffer not in pool:
                executor._ensure(pool, home, o.buffer)
        outputs[f.batch] = [pool.view(o) if isinstance(o, TensorArg) else o.value for o in executor.program.outputs]
        edges[f.batch] = f.edges


def _release(executor: Any, flight: _Flight, dev: int, name: str) -> None:
    """Free a temporary after its last use, marking it in use by every stream of the slot on its memory domain."""
    pool = flight.pools[dev]
    t = pool.storages.get(name)
    if t is None:
        return
    if t.is_cuda:
        dom = executor.domains
        for d, s in enumerate(flight.lane.streams):
            if dom[d] == dom[dev] and isinstance(s, torch.cuda.Stream):
                t.record_stream(s)
    pool.free(name)
