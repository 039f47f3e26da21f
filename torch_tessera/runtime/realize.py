"""The runtime's one loop: small runners that each run one kind of step, and :func:`run_schedule` over them.

A schedule (:mod:`torch_tessera.runtime.schedule`: launches, copies, syncs; or an explicit pipelined schedule's
run, transfer, record and wait steps) is lowered once to :class:`ExecItem` s, each a step with the :class:`Runner`
that knows how to run it. Every execution mode runs the same items through the same loop, with a different
:class:`CallContext` (the per-call state) or different runners:

* a single call on CPU virtual devices or GPUs (eager: launches on each device's stream, copies on a copy stream per
  link ordered by events);
* a pipelined micro-batch (the context carries its slot's streams and pools);
* CUDA-graph warm-up, capture and replay (:mod:`torch_tessera.runtime.graphs` swaps in its capture and replay
  runners);
* the process-per-device transport (:mod:`torch_tessera.runtime.dist_replay`: each rank runs its stream of an
  explicit pipelined schedule with runners that launch, send and receive).

On a GPU the host only queues work: a dependency between two devices is a stream waiting on an event, never a host
wait. The host waits once, at the end of a call (:func:`wait_events`), bounded by a timeout.

Debug trace: with the ``torch_tessera.runtime`` logger at DEBUG, every transfer is timed (CUDA events on its copy
stream, or the host clock on CPU) and :func:`report_transfers` logs its bytes and achieved GB/s after the call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.utils._pytree import tree_flatten

from torch_tessera.errors import DeviceOutOfMemoryError, TesseraError, TransferTimeout
from torch_tessera.lowering.program import ExternLaunch, KernelProgram
from torch_tessera.runtime.executor import BufferPool, KernelLauncher, fresh_extern_outputs, launch_buffers
from torch_tessera.runtime.push import push_on_producer
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep
from torch_tessera.runtime.streams import stream_ctx

log = logging.getLogger("torch_tessera.runtime")

#: Byte a CPU virtual device fills fresh allocations with (0xFF bytes read as NaN in every float dtype).
POISON = 0xFF

#: seconds a call busy-polls its completion event before polling with sleeps (which oversleep by tens of us)
SPIN_S = 0.05


@dataclass
class Counters:
    """What an executor did since construction.

    Attributes:
        transfers: copies performed, by purpose (``cut``, ``input``, ``weights``, ``static``, ``gather``).
        bytes_moved: bytes copied, by purpose.
        launches: launches run.
    """

    transfers: Counter = field(default_factory=Counter)
    bytes_moved: Counter = field(default_factory=Counter)
    launches: int = 0

    def count_copy(self, step: CopyStep) -> None:
        self.transfers[step.purpose] += 1
        self.bytes_moved[step.purpose] += step.nbytes


class Machine:
    """What the runners act on: the program, the devices with a kernel launcher each, memory domains, the copy
    hazards of the schedule and the counters.

    Args:
        program: the kernel program.
        devices: runtime devices (:func:`torch_tessera.target.devices.open_device`).
        launchers: one :class:`KernelLauncher` per device.
        domains: memory domain of each device (devices of one domain share storages).
        memory_estimate: bytes per device the plan predicted (named when a device runs out of memory).
    """

    def __init__(self, program: KernelProgram, devices: Sequence[Any], launchers: Sequence[KernelLauncher],
                 domains: Sequence[int], memory_estimate: Sequence[int] | None = None) -> None:
        self.program = program
        self.devices = list(devices)
        self.launchers = list(launchers)
        self.domains = domains  # the executor's list: domains changed there are seen here
        self.memory_estimate = list(memory_estimate) if memory_estimate is not None else None
        self.is_cuda = [d.torch_device.type == "cuda" for d in self.devices]
        self.fresh = fresh_extern_outputs(program)
        self.counters = Counters()
        self.copy_waits: dict[int, tuple[bool, bool]] = {}  # id(copy step) -> (wait_for_dst, src_waits_for_copy)
        self.link_streams: dict[tuple[int, int], Any] = {}

    def link_stream(self, src: int, dst: int) -> Any:
        """The copy stream of link ``src -> dst`` for calls outside a pipeline slot (made at first use)."""
        key = (src, dst)
        if key not in self.link_streams:
            dev = self.devices[dst] if self.is_cuda[dst] else self.devices[src]
            self.link_streams[key] = dev.new_stream(priority=-1)
        return self.link_streams[key]

    def ensure(self, pool: BufferPool, dev: int, name: str) -> None:
        """Allocate buffer ``name`` in ``pool`` (device ``dev``) unless present; NaN bytes on a CPU device.

        Raises:
            DeviceOutOfMemoryError: the device cannot hold it (names the plan's estimate).
        """
        if name in pool:
            return
        nbytes = self.program.buffers[name].nbytes
        try:
            pool.allocate(name, nbytes)
        except torch.OutOfMemoryError as e:
            raise self.oom(dev, nbytes) from e
        if not self.is_cuda[dev]:
            pool.storages[name].fill_(POISON)

    def oom(self, dev: int, nbytes: int) -> DeviceOutOfMemoryError:
        d = self.devices[dev]
        used = torch.cuda.memory_allocated(d.torch_device) if self.is_cuda[dev] else 0
        est = f"{self.memory_estimate[dev] / 1e9:.2f} GB" if self.memory_estimate else "no estimate"
        return DeviceOutOfMemoryError(
            f"device {d.name} ran out of memory allocating {nbytes / 1e9:.3f} GB: the plan estimated {est}, "
            f"{used / 1e9:.2f} GB were in use"
        )

    def slices(self, step: CopyStep, pools: Sequence[BufferPool]) -> tuple[torch.Tensor, torch.Tensor]:
        """The source and destination bytes of copy ``step`` (the destination allocated if needed).

        Raises:
            TesseraError: the source buffer does not exist on the producer (an inconsistent schedule).
        """
        if step.buffer not in pools[step.src]:
            raise TesseraError(
                f"{step.purpose} copy of {step.buffer}[{step.start}:{step.end}] from {self.devices[step.src].name}: "
                f"the buffer does not exist there (edge {step.edge}); the schedule is inconsistent"
            )
        return (pools[step.src].storages[step.buffer][step.start:step.end],
                pools[step.dst].storages[step.buffer][step.start:step.end])


@dataclass
class CallContext:
    """The state of one call, or of one micro-batch of a pipelined run, while :func:`run_schedule` runs it.

    Attributes:
        pools: buffer pool per device (devices of one memory domain share one object).
        streams: compute stream per device (``None`` on a CPU virtual device).
        lane: the pipeline slot (:class:`~torch_tessera.runtime.streams.Lane`) whose copy streams carry this
            context's copies and on whose streams its buffers are allocated; ``None``: the machine's link streams.
        batch: micro-batch index (named in a :class:`TransferTimeout`); ``None`` for a single call.
        edges: cut edges whose bytes this context copied.
        events: ``(copy step, event, batch)`` of every copy issued, waited for at the end of the call.
        free_after: item index -> ``(device, buffer)`` temporaries no longer needed after that item.
        release: how to free one of them (default: drop it from its pool).
        trace: when a list, every step run is appended as ``(kind, step, batch)`` (tests, debugging).
        timings: ``(copy step, start, end)`` of timed transfers (debug trace): events on a GPU, seconds on CPU.
        events_by_key: the events of an explicit schedule's record steps, by their key.
        outputs: the call's outputs once it has been issued (pipelined runs).
    """

    pools: list[BufferPool]
    streams: Sequence[Any]
    lane: Any = None
    batch: int | None = None
    edges: set = field(default_factory=set)
    events: list = field(default_factory=list)
    free_after: Mapping[int, Sequence[tuple[int, str]]] = field(default_factory=dict)
    release: Callable[[int, str], None] | None = None
    trace: list | None = None
    timings: list = field(default_factory=list)
    events_by_key: dict = field(default_factory=dict)
    outputs: list | None = None

    def copy_stream(self, machine: Machine, src: int, dst: int) -> Any:
        return machine.link_stream(src, dst) if self.lane is None else self.lane.copy_stream(src, dst)

    def note(self, kind: str, step: Any) -> None:
        if self.trace is not None:
            self.trace.append((kind, step, self.batch))

    def release_after(self, index: int) -> None:
        for dev, name in self.free_after.get(index, ()):
            if self.release is not None:
                self.release(dev, name)
            else:
                self.pools[dev].free(name)


class Runner:
    """Runs one kind of step: ``runner(step, ctx)`` issues ``step`` for the call ``ctx`` describes."""

    kind = "step"

    def __init__(self, machine: Machine) -> None:
        self.machine = machine

    def __call__(self, step: Any, ctx: CallContext) -> None:
        raise NotImplementedError


class LaunchRunner(Runner):
    """A launch on its device's stream; buffers it needs are allocated first (on the slot's stream in a pipeline).

    Args:
        machine: what it runs on.
        count: add the launch to ``machine.counters`` (a CUDA-graph capture records launches, it runs none).
    """

    kind = "launch"

    def __init__(self, machine: Machine, count: bool = True) -> None:
        super().__init__(machine)
        self.count = count

    def __call__(self, step: LaunchStep, ctx: CallContext) -> None:
        m = self.machine
        launch = m.program.launches[step.launch]
        pool = ctx.pools[step.device]
        stream = ctx.streams[step.device]
        fresh = m.fresh.get(launch.index, ())
        with stream_ctx(None if ctx.lane is None else stream):
            for b in launch_buffers(launch):
                if b not in fresh:
                    m.ensure(pool, step.device, b)
        with m.devices[step.device].guard(), stream_ctx(stream):
            try:
                result = m.launchers[step.device].launch(launch, pool, stream)
            except torch.OutOfMemoryError as e:
                raise m.oom(step.device, 0) from e
        if isinstance(launch, ExternLaunch) and fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in fresh:  # rebound every run (graph capture allocates anew)
                    pool.bind(spec.buffer, t)
        if self.count:
            m.counters.launches += 1
        ctx.note(self.kind, step)


class SyncRunner(Runner):
    """Devices of one memory domain: the consumer's stream waits for the producer's (no bytes move)."""

    kind = "sync"

    def __call__(self, step: SyncStep, ctx: CallContext) -> None:
        src, dst = ctx.streams[step.src], ctx.streams[step.dst]
        if src is not None and dst is not None and src is not dst:
            dst.wait_stream(src)
        ctx.note(self.kind, step)


def copy_views(m: Machine, step: CopyStep, ctx: CallContext) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy step's source and destination views (the destination's storage allocated first, on the consumer's
    stream when the call runs on streams), the copy counted."""
    with stream_ctx(None if ctx.lane is None else ctx.streams[step.dst]):
        m.ensure(ctx.pools[step.dst], step.dst, step.buffer)
    src, dst = m.slices(step, ctx.pools)
    count_copy(m, step, ctx)
    return src, dst


class CopyRunner(Runner):
    """The bytes of one copy step: on CPU a synchronous copy; on a GPU a copy on the link's stream, after the
    producer's stream (and the consumer's, for a WAR/WAW hazard), with the consumer's stream (and the producer's,
    when it later overwrites the source) waiting on the copy's event. Sources and destinations of copies in
    flight are marked in use by the copy stream (``record_stream``)."""

    kind = "copy"

    def __call__(self, step: CopyStep, ctx: CallContext) -> Any:
        m = self.machine
        src, dst = copy_views(m, step, ctx)
        timed = log.isEnabledFor(logging.DEBUG)
        if not (m.is_cuda[step.src] or m.is_cuda[step.dst]):
            t0 = time.perf_counter()
            dst.copy_(src)
            if timed:
                ctx.timings.append((step, t0, time.perf_counter()))
            return None
        copy_stream = ctx.copy_stream(m, step.src, step.dst)
        src_stream, dst_stream = ctx.streams[step.src], ctx.streams[step.dst]
        wait_dst, src_waits = m.copy_waits.get(id(step), (False, False))
        if src_stream is not None:
            copy_stream.wait_stream(src_stream)
        if wait_dst and dst_stream is not None:
            copy_stream.wait_stream(dst_stream)
        with stream_ctx(copy_stream):
            start = torch.cuda.Event(enable_timing=True) if timed else None
            if start is not None:
                start.record(copy_stream)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event(enable_timing=timed)
            done.record(copy_stream)
        if start is not None:
            ctx.timings.append((step, start, done))
        src.record_stream(copy_stream)
        dst.record_stream(copy_stream)
        if dst_stream is not None:
            dst_stream.wait_event(done)
        if src_waits and src_stream is not None:
            src_stream.wait_event(done)
        ctx.events.append((step, done, ctx.batch))
        return done


class PushRunner(Runner):
    """A cut-edge copy as a copy kernel on the producer's stream (:mod:`torch_tessera.runtime.push`), used by the
    warm-up pass of a ``graph_copies="push"`` capture."""

    kind = "push"

    def __call__(self, step: CopyStep, ctx: CallContext) -> None:
        m = self.machine
        src, dst = copy_views(m, step, ctx)
        push_on_producer(m.devices[step.src], src, dst, ctx.streams[step.src], ctx.streams[step.dst],
                         m.copy_waits.get(id(step), (False, False)))


def count_copy(machine: Machine, step: CopyStep, ctx: CallContext) -> None:
    """Count one copy in the machine's counters and its cut edge in the context; note it in the trace."""
    machine.counters.count_copy(step)
    if step.edge is not None:
        ctx.edges.add(step.edge)
    ctx.note("copy", step)


@dataclass(frozen=True)
class ExecItem:
    """One step with the runner that runs it; ``index`` is its position in the lowered list (frees key on it)."""

    runner: Runner
    step: Any
    index: int

    def run(self, ctx: CallContext) -> None:
        self.runner(self.step, ctx)


def lower(steps: Sequence[Any], runners: Mapping[type, Runner]) -> list[ExecItem]:
    """One :class:`ExecItem` per step, its runner chosen by the step's type.

    Raises:
        TesseraError: a step type ``runners`` has no runner for.
    """
    items = []
    for i, step in enumerate(steps):
        runner = runners.get(type(step))
        if runner is None:
            raise TesseraError(f"no runner for step {step!r} (known: {sorted(t.__name__ for t in runners)})")
        items.append(ExecItem(runner, step, i))
    return items


def eager_runners(machine: Machine) -> dict[type, Runner]:
    """The runners of an eager call: launch, sync, copy."""
    return {LaunchStep: LaunchRunner(machine), SyncStep: SyncRunner(machine), CopyStep: CopyRunner(machine)}


def run_schedule(items: Sequence[ExecItem], ctx: CallContext) -> None:
    """Run ``items`` in order for ``ctx``, freeing each temporary after its last use."""
    for item in items:
        item.runner(item.step, ctx)
        ctx.release_after(item.index)


def wait_events(machine: Machine, events: Sequence[tuple[CopyStep, Any, Any]], streams: Sequence[Any],
                timeout_s: float) -> None:
    """Wait on the host for a call's copies, then its compute ``streams``; bounded by ``timeout_s``.

    Raises:
        TransferTimeout: naming the first transfer (edge, buffer range, devices, micro-batch) still unfinished.
    """
    if not any(machine.is_cuda):
        return
    deadline = time.monotonic() + timeout_s
    spin_until = time.monotonic() + SPIN_S
    for step, ev, batch in events:
        while not ev.query():
            if time.monotonic() < spin_until:
                continue
            if time.monotonic() > deadline:
                raise TransferTimeout(describe_transfer(machine, step, batch) +
                                      f" did not complete within {timeout_s} s")
            time.sleep(20e-6)
    for s in streams:
        if s is not None:
            s.synchronize()


def wait_replay(machine: Machine, copies: Sequence[CopyStep], done: Any, timeout_s: float) -> None:
    """Wait for one replay of a CUDA graph over the devices, until ``done`` (an event recorded after it) completes.

    Raises:
        TransferTimeout: it did not complete in time; names the transfers inside the graph (which one hangs cannot
            be told from outside it).
    """
    if done.query():
        return
    deadline = time.monotonic() + timeout_s
    spin_until = time.monotonic() + SPIN_S
    while not done.query():
        if time.monotonic() < spin_until:
            continue  # a replay takes ~ms: sleeping (>= ~60 us per call on Linux) would add to every call
        if time.monotonic() > deadline:
            devices = machine.devices
            links = sorted({(devices[c.src].name, devices[c.dst].name) for c in copies})
            edges = sorted({c.edge for c in copies if c.edge is not None})
            where = ", ".join(f"{a}->{b}" for a, b in links) or ", ".join(d.name for d in devices)
            raise TransferTimeout(
                f"one replay of the CUDA graph over {where} did not complete within {timeout_s} s; it holds "
                f"{len(copies)} transfers (edges {edges[:8]}{' ...' if len(edges) > 8 else ''})"
            )
        time.sleep(20e-6)


def describe_transfer(machine: Machine, step: CopyStep, batch: int | None = None) -> str:
    """A transfer in words: purpose, buffer range, bytes, devices, cut edge and micro-batch."""
    devices = machine.devices
    return (f"{step.purpose} transfer of {step.buffer}[{step.start}:{step.end}] ({step.nbytes} bytes) from "
            f"{devices[step.src].name} to {devices[step.dst].name}"
            f"{f' for edge {step.edge}' if step.edge else ''}{f' of micro-batch {batch}' if batch is not None else ''}")


def report_transfers(machine: Machine, ctx: CallContext) -> None:
    """Log each timed transfer of ``ctx`` (debug trace): bytes, microseconds and achieved GB/s. Call after the
    call's work has finished (the events must have completed)."""
    for step, start, end in ctx.timings:
        seconds = end - start if isinstance(start, float) else start.elapsed_time(end) / 1e3
        gbps = step.nbytes / seconds / 1e9 if seconds > 0 else float("inf")
        log.debug("transfer %s: %d bytes in %.1f us, %.2f GB/s", describe_transfer(machine, step, ctx.batch),
                  step.nbytes, seconds * 1e6, gbps)
    ctx.timings.clear()
