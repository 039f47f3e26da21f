"""CUDA graphs for the multi-device executor: :class:`CUDAGraphWrapper`, captured once per descriptor, replayed.

The wrapper wraps a :class:`~torch_tessera.runtime.placed.PlacedExecutor` and uses only its public interface. It
keeps one captured entry (:class:`GraphState`) per descriptor (:class:`GraphKey`: a single call, or pipeline slot
``k``). A *segment* is a maximal run of consecutive launches on one device with no copy between them. Capture and
replay, all through the runtime's one loop (:func:`~torch_tessera.runtime.realize.run_schedule`) with the runners
swapped:

1. First call of a descriptor: static buffer pools are built (weights and state bound to the caller's storages,
   graph inputs of kind INPUT copied into static storages, every temporary allocated once and kept), the schedule
   runs once eagerly (Triton compiles and autotunes, cuBLAS initialises; this pass *is* the call), then either the
   whole schedule is captured as ONE graph over every device (``"whole"``: copies inside it as memcpy nodes or push
   kernels) or each segment on its device's stream (``"segments"``, and where CUDA refuses the whole capture).
2. Every call: INPUT-kind inputs are copied into their static storages (not the program's ``static_inputs``: module
   buffers the caller keeps at one address are read in place, as weights are); the graph(s) replay, segments'
   copies between them run eagerly on the link's copy stream, ordered by events. One graph over every device
   replays on the caller's current stream (no stream joins), and the call waits on the host only when the graph
   holds transfers (to raise ``TransferTimeout`` naming them) or touches other devices; a graph of the home device
   alone returns at once, ordered on the caller's stream like ``mode="reduce-overhead"``.
3. If a weight, state or static input arrives at another address than at capture, the descriptor is captured again
   (which places the weights and static inputs again). A static input read on another device is placed there once,
   at capture, like a weight; when the caller modified it in place (its ``_version`` changed) it is copied again
   into the very storage the graphs read, between two host synchronisations (:meth:`CUDAGraphWrapper.refresh_static`);
   an inference tensor, which has no ``_version``, is copied so every call (``static_inputs="copy"`` puts that copy
   inside the graph). :attr:`CUDAGraphWrapper.captures` counts captures; ``check_addresses=True`` verifies before
   each replay that every storage a graph uses still has its capture-time address.

Outputs are the caller's own tensors: copied out of the static storages after each replay, into the storage the
same output was handed out in last time when nothing else holds it any more, else into a fresh one
(:func:`hand_out`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from torch_tessera.compat.torch_storage import tensors_on_storage
from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime import push as push_kernels
from torch_tessera.runtime.executor import BufferPool, bind_input, launch_buffers
from torch_tessera.runtime.inputs import static_input_keys
from torch_tessera.runtime.realize import (
    CallContext,
    CopyRunner,
    ExecItem,
    LaunchRunner,
    Machine,
    PushRunner,
    Runner,
    SyncRunner,
    run_schedule,
    wait_replay,
)
from torch_tessera.runtime.pipelining import issue_round_robin, schedule_chunks
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep
from torch_tessera.runtime.streams import greatest_priority, order_copy, single_priority

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphKey:
    """What one captured entry is for: a single call (``slot=None``) or pipeline slot ``slot`` (its streams)."""

    slot: int | None = None


@dataclass
class Segment:
    """Consecutive launches on one device, captured as one graph."""

    device: int
    steps: list[LaunchStep]
    graph: Any = None


@dataclass
class GraphState:
    """Everything captured for one descriptor."""

    pools: list[BufferPool]
    items: list[Any]  # Segment | CopyStep | SyncStep, in schedule order
    static_inputs: dict[str, torch.Tensor]  # INPUT buffers: static storage the caller's data is copied into
    streams: list[Any] = field(default_factory=list)  # the compute streams the graphs were captured on
    lane: Any = None  # the pipeline slot whose streams they are (None: the wrapper's own streams)
    addresses: dict[tuple[int, str], int] = field(default_factory=dict)
    # per-call fast path, precomputed at capture: (input index, address) of the PARAMETER / STATE inputs bound to the
    # caller's storages, (input index, static view) of copied INPUT-kind inputs, and the devices whose streams work
    bound_list: list[tuple[int, int]] = field(default_factory=list)
    copy_list: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    used_devices: list[int] = field(default_factory=list)
    fast_check: Any = None  # (pointers by input position, indices) for torch._C._tensors_data_ptrs_at_indices_equal
    first_outputs: Any = None  # the capturing call's outputs (from its warm-up pass), handed out once
    whole: Any = None  # one graph over every device, copies inside (graph_mode "whole"); None: one per segment
    pushes: frozenset = frozenset()  # ids of the copy steps inside ``whole`` that run as push kernels
    keep_alive: list = field(default_factory=list)  # the other GPUs' memory pools the whole graph allocated from
    copies: list = field(default_factory=list)  # the copy steps inside ``whole`` (counted per replay)
    replay_items: list = field(default_factory=list)  # exec items of a replay by segments
    # what one replay adds to the executor's counters, summed at capture (see count_replay)
    launches: int = 0
    transfer_counts: dict = field(default_factory=dict)
    byte_counts: dict = field(default_factory=dict)
    copy_edges: frozenset = frozenset()
    host_wait: bool = True  # the call waits for the replay on the host (transfers inside, or other devices touched)
    on_caller_stream: bool = False  # "whole" replays on the caller's current stream (home device not a partition)
    last_stream: Any = None  # the stream the last caller-stream replay went to (a new stream waits for it)
    state_devices: list = field(default_factory=list)  # torch devices of STATE kept off the home device
    home_device: Any = None  # the home device's torch device
    static_keys: dict = field(default_factory=dict)  # static INPUT -> static_input_keys when placed in ``pools``
    warned_inference: bool = False  # logged that an inference-tensor static input is copied again every replay
    handed: dict = field(default_factory=dict)  # output index -> the storage it was last handed out in (hand_out)
    copy_back: list = field(default_factory=list)  # (input index, static view) of copied STATE, back after a call
    # (pool index, buffer) of STATE bound at the caller's address and not an output: released after each call of a
    # whole graph (release_caller_state)
    caller_state: list = field(default_factory=list)


def segments(steps: Sequence[Any]) -> list[Any]:
    """``steps`` with each maximal run of consecutive launches on one device made one :class:`Segment`."""
    items: list[Any] = []
    for step in steps:
        if isinstance(step, LaunchStep):
            if items and isinstance(items[-1], Segment) and items[-1].device == step.device:
                items[-1].steps.append(step)
            else:
                items.append(Segment(step.device, [step]))
        else:
            items.append(step)
    return items


class SegmentRunner(Runner):
    """A segment: its captured graph replayed on its device's stream, or (not captured yet, or while capturing)
    its launches run one by one through ``launch``."""

    kind = "segment"

    def __init__(self, machine: Machine, launch: LaunchRunner, replay: bool) -> None:
        super().__init__(machine)
        self.launch, self.replay = launch, replay

    def __call__(self, seg: Segment, ctx: CallContext) -> None:
        if self.replay and seg.graph is not None:
            with self.machine.devices[seg.device].guard(), torch.cuda.stream(ctx.streams[seg.device]):
                seg.graph.replay()
            self.machine.counters.launches += len(seg.steps)
            ctx.note(self.kind, seg)
            return
        for step in seg.steps:
            self.launch(step, ctx)


class CaptureCopyRunner(Runner):
    """Inside the capture of one graph over the devices: a copy as a memcpy node on its link's copy stream (or on
    the producer's stream, ``copy_streams[link] = None``), or for the steps in ``pushes`` as a push kernel."""

    kind = "capture-copy"

    def __init__(self, machine: Machine, copy_streams: dict, pushes: frozenset) -> None:
        super().__init__(machine)
        self.copy_streams, self.pushes = copy_streams, pushes

    def __call__(self, step: CopyStep, ctx: CallContext) -> None:
        if id(step) in self.pushes:
            capture_copy(self.machine, step, ctx.pools, ctx.streams, None, push=True)
        else:
            capture_copy(self.machine, step, ctx.pools, ctx.streams, self.copy_streams[(step.src, step.dst)])


def capture_copy(machine: Machine, step: CopyStep, pools: list[BufferPool], streams: Sequence[Any],
                 copy_stream: Any, push: bool = False) -> None:
    """Capture one copy step as a memcpy node: after the producer's stream, before the consumer's (see
    :func:`~torch_tessera.runtime.streams.order_copy`); on ``copy_stream`` (the link's), or on the producer's
    stream when it is None (``graph_copies="producer"``). With ``push``, as the push kernel on the producer's stream
    instead (:mod:`torch_tessera.runtime.push`; its kernel was compiled by the warm-up pass, at these addresses).

    ``Tensor.copy_`` between GPUs is not used here: torch runs it on the *source* device's current stream with a
    two-way barrier against the destination's current stream, and inside a capture those would have to be this
    graph's streams too (a default stream breaks the capture) and would serialise the copy with compute. A plain
    ``cuMemcpyAsync`` of the byte range (unified addressing) orders only by the events below.
    """
    src = pools[step.src].storages[step.buffer][step.start:step.end]
    dst = pools[step.dst].storages[step.buffer][step.start:step.end]
    waits = machine.copy_waits.get(id(step), (False, False))  # see schedule.copy_hazards
    if push:
        push_kernels.push_on_producer(machine.devices[step.src], src, dst, streams[step.src], streams[step.dst], waits)
        return

    order_copy(streams[step.src], streams[step.dst], copy_stream, waits, lambda stream: memcpy(step, src, dst, stream))


def memcpy(step: CopyStep, src: torch.Tensor, dst: torch.Tensor, stream: Any) -> None:
    """Queue the copy of ``src`` into ``dst`` (copy ``step``'s byte range) on ``stream`` alone: a device copy
    within one GPU, else a ``cuMemcpyAsync`` of the bytes (unified addressing; see :func:`capture_copy`).

    Raises:
        TesseraError: the driver refused the copy.
    """
    if src.device == dst.device:  # two SM partitions of one GPU: an ordinary device copy
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        return
    from cuda.bindings import driver as drv

    (err,) = drv.cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), step.nbytes, stream.cuda_stream)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise TesseraError(f"cuMemcpyAsync of {step.buffer}[{step.start}:{step.end}] failed: {err}")


def capture_transfer(machine: Machine, step: CopyStep, pools: Sequence[BufferPool], stream: Any) -> None:
    """Capture one copy as a memcpy node on ``stream`` with no ordering of its own: an explicit schedule's record
    and wait steps order it (:mod:`torch_tessera.runtime.captured`)."""
    src, dst = machine.slices(step, pools)
    memcpy(step, src, dst, stream)


def capture_whole(machine: Machine, items: Sequence[Any], ctx: CallContext, home: int,
                  copy_streams: dict, pushes: frozenset = frozenset()) -> tuple[Any, list] | None:
    """Capture every segment AND the copies between them as ONE CUDA graph spanning the devices; None if CUDA or this
    torch refuses (the caller then captures one graph per segment).

    The capture begins on the home device's stream; every other stream the schedule uses (other devices' compute
    streams, the links' copy streams in ``copy_streams``) joins it through an event, so their work becomes nodes of
    the same graph and the events between them become its edges. Copies between GPUs are captured as memcpy nodes
    (:func:`capture_copy`), or, for the steps in ``pushes``, as push kernels on the producer's stream. Extern kernels
    that allocate their outputs allocate from the graph's pool on the home GPU and from a private
    ``torch.cuda.MemPool`` per other GPU, owned by that GPU (:func:`private_pool`) and kept alive with the graph.
    Replaying it is one ``cudaGraphLaunch`` per call, with no host work between segments (docs/BENCHMARKS.md, one
    graph over two GPUs).

    Args:
        machine: devices and domains (``devices[i].guard()``, ``torch_device``).
        items: segments, copies and syncs, in schedule order.
        ctx: the capture's pools and compute streams.
        home: index of the device the capture begins on.
        copy_streams: ``(src, dst) -> stream`` of each link's copies (None: on the producer's stream).
        pushes: ids of the copy steps captured as push kernels.

    Returns:
        ``(graph, objects to keep alive with it)``, or None after logging why the capture failed.
    """
    runners = {SyncStep: SyncRunner(machine), CopyStep: CaptureCopyRunner(machine, copy_streams, pushes),
               Segment: SegmentRunner(machine, LaunchRunner(machine, count=False), replay=False)}
    exec_items = [ExecItem(runners[type(x)], x, -1) for x in items]
    return capture_graph(machine, lambda: run_schedule(exec_items, ctx), [*ctx.streams, *copy_streams.values()],
                         ctx.streams[home], home, "it replays one graph per device segment instead "
                         "(cuda_graphs='segments' asks for that directly, cuda_graphs=False turns graphs off)")


def capture_graph(machine: Machine, issue: Callable[[], None], streams: Sequence[Any], main: Any, home: int,
                  fallback: str) -> tuple[Any, list] | None:
    """Capture what ``issue()`` queues on ``streams`` as ONE CUDA graph, begun on ``main`` (the home device's
    stream); None, with a :class:`~torch_tessera.errors.TesseraFallbackWarning` that says ``fallback``, if CUDA or
    this torch refuses.

    Every other CUDA stream in ``streams`` joins the capture through an event recorded on ``main`` (fork) and
    ``main`` waits for each of them at the end (join), so their work becomes nodes of the graph and the events
    between them its edges. Allocations on other memory domains (extern kernels' fresh outputs) come from a private
    ``torch.cuda.MemPool`` per other GPU (:func:`private_pool`), returned to be kept alive with the graph.

    Returns:
        ``(graph, objects to keep alive with it)``, or None after logging and warning why the capture failed.
    """
    devices, domains = machine.devices, machine.domains
    if not isinstance(main, torch.cuda.Stream):  # the CPU stand-in of the tests has no streams to fork
        main = None
    touched: list = []
    for s in streams:
        if isinstance(s, torch.cuda.Stream) and s is not main and all(s is not t for t in touched):
            touched.append(s)
    other_pools = {}
    for i, d in enumerate(devices):
        if domains[i] != domains[home] and domains[i] not in other_pools:
            other_pools[domains[i]] = (d.torch_device, private_pool(d.torch_device) if main is not None else None)
    graph = torch.cuda.CUDAGraph()
    try:
        torch.cuda.synchronize()
        with devices[home].guard(), torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle(), stream=main):
            with contextlib.ExitStack() as stack:
                for dev, pool in other_pools.values():
                    if pool is not None:
                        stack.enter_context(torch.cuda.use_mem_pool(pool, device=dev))
                if main is not None:
                    fork = torch.cuda.Event()
                    fork.record(main)
                    for st in touched:
                        st.wait_event(fork)
                issue()
                if main is not None:
                    for st in touched:
                        done = torch.cuda.Event()
                        done.record(st)
                        main.wait_event(done)
    except Exception as e:  # noqa: BLE001 - CUDA or torch refused the multi-device capture: fall back, say why
        from torch_tessera.errors import TesseraFallbackWarning, warn_user

        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("one CUDA graph over all devices could not be captured (%s); %s", why, fallback)
        warn_user(f"tessera could not capture the program as one CUDA graph ({why}); {fallback}",
                  TesseraFallbackWarning)
        torch.cuda.synchronize()
        return None
    return graph, [pool for _, pool in other_pools.values()]


def private_pool(device: torch.device) -> Any:
    """A ``torch.cuda.MemPool`` owned by ``device``, for a capture's allocations there while another GPU captures.

    c10 ties a ``MemPool`` to the device current when it is *constructed* (``MemPool::MemPool``: ``device_ =
    current_device()``, one use there), and ``use_mem_pool(pool, device=d)`` adds a use on ``d`` only while it is
    entered. Built while another GPU is current, the pool has no use left on ``d`` once the capture ends, and the
    next capture's ``torch.cuda.empty_cache()`` (``torch.cuda.graph.__enter__`` calls it) would free cached blocks
    the graph still replays into. Made current here, ``d`` holds a use for the pool's life.
    """
    with torch.cuda.device(device):
        return torch.cuda.MemPool()


def bound_inputs_unmoved(state: GraphState, inputs: Sequence[Any]) -> bool:
    """Whether every input bound at capture still has its capture-time address (one C++ call where torch has it)."""
    if not state.bound_list:
        return True
    fast = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds (as in cudagraph_trees)
    if fast is not None:
        # its pointer list is indexed by input position (None elsewhere), not by position in ``indices``
        if state.fast_check is None:
            ptrs: list = [None] * len(inputs)
            for k, p in state.bound_list:
                ptrs[k] = p
            state.fast_check = (ptrs, [k for k, _ in state.bound_list])
        return bool(fast(list(inputs), *state.fast_check))
    return all(inputs[k].data_ptr() == p for k, p in state.bound_list)


def copy_inputs(program: Any, home: BufferPool, inputs: Sequence[Any], static: dict[str, torch.Tensor]) -> None:
    """Copy each INPUT-kind input into its static storage, at the place the recorded view says (the caller's view
    may sit at another storage offset each call)."""
    for spec, value in zip(program.inputs, inputs):
        if isinstance(spec, TensorArg) and spec.buffer in static:
            home.view(spec).copy_(value, non_blocking=True)


#: STATE inputs of at most this many bytes kept on the home device are copied into the graph's own storage before
#: each replay of a single call and back after it (one small memcpy node each way), instead of being bound at the
#: caller's address, so a new tensor for them (transformers makes new cache-length counters at every ``generate``)
#: does not make the graph capture again. Larger state (K/V caches, SSM state) stays bound in place.
COPIED_STATE_MAX_BYTES = 4096


def bind_static(ex: Any, inputs: Sequence[Any], pools: list[BufferPool],
                copy_small_state: bool = False) -> tuple[dict, dict]:
    """Bind weights, state and static INPUTs of one call's ``inputs`` in ``pools`` where the caller keeps them; copy
    INPUT-kind inputs into static storages of the home pool (what a captured graph reads).

    Args:
        ex: the executor (its public ``program``, ``home``, ``check_state_devices``, ``input_pool_index``).
        inputs: the call's graph inputs, in order.
        pools: the call's static pools, one per device.
        copy_small_state: STATE inputs of at most :data:`COPIED_STATE_MAX_BYTES` kept on the home device are copied
            into static storages too, like INPUTs (the caller copies them back after each replay).

    Returns:
        ``(static storage by copied buffer, bound buffer -> the caller's address)``.
    """
    program = ex.program
    home = pools[ex.home]
    static_inputs: dict[str, torch.Tensor] = {}
    bound: dict[str, int] = {}
    static_in_place = set(getattr(program, "static_inputs", ()))  # module buffers at one address: read in place
    ex.check_state_devices(inputs)
    for spec, value in zip(program.inputs, inputs):
        if not isinstance(spec, TensorArg) or spec.buffer in home or spec.buffer in bound:
            continue
        kind = program.buffers[spec.buffer].kind
        small_state = (copy_small_state and kind == BufferKind.STATE and ex.input_pool_index(spec.buffer) == ex.home
                       and program.buffers[spec.buffer].nbytes <= COPIED_STATE_MAX_BYTES)
        if (kind == BufferKind.INPUT and spec.buffer not in static_in_place) or small_state:
            home.allocate(spec.buffer, program.buffers[spec.buffer].nbytes)
            static_inputs[spec.buffer] = home.storages[spec.buffer]
        else:  # weights, state and static INPUTs, bound where the caller keeps them (state may live elsewhere)
            bind_input(pools[ex.input_pool_index(spec.buffer)], spec, value, len(bound))
            bound[spec.buffer] = value.data_ptr()
    copy_inputs(program, home, inputs, static_inputs)
    return static_inputs, bound


def release_caller_state(state: GraphState) -> None:
    """Drop the pools' references to the caller's STATE tensors (K/V caches, say) once a call of a whole graph is
    issued. The graph addresses them raw, and a replay happens only after :func:`bound_inputs_unmoved` found the
    caller's tensors at those very addresses, so nothing needs them between calls; held, they would keep a cache the
    caller dropped alive, and the caller's next cache (transformers makes one per ``generate``) could not be given
    the same memory, so the graph would capture again at every ``generate``. Segment replays keep them (their copies
    between segments read the pools)."""
    if state.whole is None:
        return
    for i, b in state.caller_state:
        if b in state.pools[i]:
            state.pools[i].release(b)


def copy_state_back(state: GraphState, inputs: Sequence[Any]) -> None:
    """Copy the STATE inputs the graph keeps in its own storage (:data:`COPIED_STATE_MAX_BYTES`) back into the
    caller's tensors, on the current stream (the replay was issued on it, or waited for on the host)."""
    for k, static in state.copy_back:
        inputs[k].copy_(static, non_blocking=True)


def hand_out(state: GraphState, k: int, view: torch.Tensor, fresh: bool = False) -> torch.Tensor:
    """Output ``k`` of a replay, ``view`` (a view of the graph's static storage, rewritten by every replay), as a
    tensor the caller owns: copied into the storage output ``k`` was handed out in last time when no tensor but the
    wrapper's own still holds it, else cloned into a fresh one (kept for the next call).

    So an output the caller keeps stays as it was (a fresh clone each call while it is held), and an output the
    caller dropped comes back at the same address. That matters for state a program creates and a later program
    reads: with transformers 5.24 the prefill program makes the static cache's K/V tensors (they are its outputs),
    and the decode graph binds them by address, so a new address at every ``generate`` would make the decode graph
    capture again (warm-up pass, capture, instantiation) once per ``generate``.

    The copy runs on the current stream, after any work queued there that read the previous output, like the
    caching allocator's reuse of freed memory. ``fresh``: ``view`` is already a tensor of the wrapper's own (the
    capturing call's clone), kept as it is.
    """
    kept = state.handed.get(k)
    if fresh:
        kept = state.handed[k] = view
    elif kept is not None and kept.shape == view.shape and tensors_on_storage(kept) == 1:
        kept.copy_(view)
    else:
        kept = state.handed[k] = view.clone()
    return kept.as_strided(kept.shape, kept.stride(), kept.storage_offset())  # the caller's tensor; ours stays


class CUDAGraphWrapper:
    """Wraps a placed executor (``runnable``): one captured :class:`GraphState` per :class:`GraphKey`.

    Calling it runs one call with graphs (the module docstring); :meth:`issue_wave` runs one wave of pipelined
    micro-batches, slot ``k`` on its own entry. It reads only the executor's public interface: ``program``,
    ``devices``, ``home``, ``domains``, ``schedule``, ``machine``, ``make_pools``, ``placed_pools``,
    ``place_weight``, ``ensure``, ``check_state_devices``, ``input_pool_index``, ``static_positions``,
    ``stale_static``, ``state_homes``, ``graph_mode``, ``graph_copies``, ``priority_class``, ``weight_cache``,
    ``timeout_s``, ``wait``, ``join_caller``; and it updates ``calls`` and ``cut_edges_transferred``.

    Attributes:
        entries: captured state per descriptor.
        captures: captures so far (tests assert on it: a replay must not capture again).
        check_addresses: before each replay, verify every storage a graph uses still has its capture-time address.
        streams: the compute streams single calls capture and replay on (made at the first capture).
    """

    def __init__(self, runnable: Any, check_addresses: bool = False) -> None:
        self.runnable = runnable
        self.entries: dict[GraphKey, GraphState] = {}
        self.captures = 0
        self.check_addresses = check_addresses
        self.streams: list[Any] | None = None

    def reset(self) -> None:
        """Drop every captured entry (the schedule changed)."""
        self.entries.clear()

    def entry(self, key: GraphKey = GraphKey()) -> GraphState | None:
        """The captured state of ``key``, if captured."""
        return self.entries.get(key)

    # -- capture ------------------------------------------------------------------------------------------------
    def capture(self, inputs: Sequence[Any], key: GraphKey, lane: Any = None) -> tuple[GraphState, CallContext]:
        """Static pools, a warm-up pass (this call's execution) and the graphs of ``key``; on ``lane``'s streams
        when given (a pipeline slot: its pools share the weights the executor placed once instead of placing them).

        The warm-up's outputs are cloned into ``GraphState.first_outputs`` and the caller returns them without
        replaying, so in-place state updates (KV-cache writes, per-layer cache-length counters, SSM state) happen
        exactly once on the capturing call. Returns the state and the warm-up's context (its cut edges).
        """
        ex = self.runnable
        program, devices, machine = ex.program, ex.devices, ex.machine
        torch.cuda.synchronize()
        if lane is None:
            prio = single_priority(ex.priority_class, greatest_priority(devices))
            # capture needs non-default streams; a replay runs at its launch stream's priority (CUDA graphs' default,
            # without cudaGraphInstantiateFlagUseNodePriority)
            self.streams = [d.new_stream(priority=prio) for d in devices]
        streams = self.streams if lane is None else lane.streams
        pools = ex.make_pools()
        if lane is not None:
            for p, w in zip(pools, ex.placed_pools):
                p.storages.update(w.storages)
        ctx = CallContext(pools, streams, lane=lane, trace=getattr(ex, "trace", None))
        static_inputs, bound = self._bind_static(inputs, pools, single=lane is None)
        torch.cuda.synchronize()  # the warm-up below runs on other streams: the static inputs must have landed
        for step in ex.schedule.setup if lane is None else ():
            ex.place_weight(step, ctx)  # a copy, or a storage shared through the executor's weight cache
        if ex.weight_cache is not None and lane is None:
            torch.cuda.synchronize()  # shared weight storages are read by other executors' streams from now on
        fresh_all = set().union(*machine.fresh.values()) if machine.fresh else set()
        for i in range(len(devices)):
            for b in sorted({b for s in ex.schedule.steps if isinstance(s, LaunchStep) and s.device == i
                             for b in launch_buffers(program.launches[s.launch])} - fresh_all):
                ex.ensure(pools[i], i, b)
        items = segments(ex.schedule.steps)
        pushes = frozenset(self.plan_pushes(items))
        # warm-up: one eager pass (compiles and autotunes kernels, the push kernel too, at the very addresses the
        # capture sees; fresh extern outputs get eager storages)
        run_schedule(self._eager_items(items, pushes), ctx)
        for s in streams:
            if s is not None:
                s.synchronize()
        home = pools[ex.home]
        first_outputs = [home.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]
        whole = None
        if ex.graph_mode == "whole":
            whole = capture_whole(machine, items, ctx, ex.home, self._copy_streams(items, lane, pushes), pushes)
        if whole is None:
            self._capture_segments(items, ctx)
        torch.cuda.synchronize()
        state = GraphState(pools, items, static_inputs, streams=list(streams), lane=lane)
        if lane is None:  # its own setup ran above (a slot's pools share the executor's, placed by the run's begin)
            state.static_keys = static_input_keys(ex.static_positions, inputs)
        if whole is not None:
            state.whole, state.keep_alive = whole
            state.copies = [x for x in items if isinstance(x, CopyStep)]
            state.pushes = pushes
        state.first_outputs = first_outputs
        self._fast_path(state, inputs, bound)
        self.captures += 1
        n_copies = sum(isinstance(x, CopyStep) for x in items)
        if whole is not None:
            log.info("captured one CUDA graph over %d devices (%d segments, %d copies inside it, %d of them push "
                     "kernels)", len(state.used_devices), sum(isinstance(x, Segment) for x in items), n_copies,
                     len(state.pushes))
        else:
            log.info("captured %d CUDA graphs (%d copies between them)", sum(isinstance(x, Segment) for x in items),
                     n_copies)
        return state, ctx

    def _bind_static(self, inputs: Sequence[Any], pools: list[BufferPool], single: bool = False) -> tuple[dict, dict]:
        return bind_static(self.runnable, inputs, pools, copy_small_state=single)

    def _eager_items(self, items: Sequence[Any], pushes: frozenset) -> list[ExecItem]:
        """Exec items of the warm-up pass: segments launch by launch, copies eagerly (push kernels where planned)."""
        m = self.runnable.machine
        seg, sync, copy, push = (SegmentRunner(m, LaunchRunner(m), replay=False), SyncRunner(m), CopyRunner(m),
                                 PushRunner(m))
        out = []
        for x in items:
            runner = seg if isinstance(x, Segment) else sync if isinstance(x, SyncStep) else \
                push if id(x) in pushes else copy
            out.append(ExecItem(runner, x, -1))
        return out

    def _copy_streams(self, items: Sequence[Any], lane: Any, pushes: frozenset) -> dict:
        """Copy stream per link of the copies that are not pushes (None with ``graph_copies="producer"``)."""
        ex = self.runnable
        on_producer = ex.graph_copies == "producer"  # copies on the producer's own stream
        out = {}
        for x in items:
            if isinstance(x, CopyStep) and (x.src, x.dst) not in out and id(x) not in pushes:
                out[(x.src, x.dst)] = (None if on_producer else ex.machine.link_stream(x.src, x.dst)
                                       if lane is None else lane.copy_stream(x.src, x.dst))
        return out

    def _capture_segments(self, items: Sequence[Any], ctx: CallContext) -> None:
        """One graph per segment, on its device's stream; one memory pool per memory domain. Copies between
        segments are not issued while capturing: the warm-up pass already moved this call's bytes."""
        ex = self.runnable
        m = ex.machine
        mempools = {i: torch.cuda.graph_pool_handle() for i in set(ex.domains)}
        launch = LaunchRunner(m, count=False)
        for item in items:
            if isinstance(item, Segment):
                torch.cuda.synchronize(ex.devices[item.device].torch_device)
                g = torch.cuda.CUDAGraph()
                with ex.devices[item.device].guard():
                    with torch.cuda.graph(g, pool=mempools[ex.domains[item.device]],
                                          stream=ctx.streams[item.device]):
                        for step in item.steps:
                            launch(step, ctx)
                item.graph = g

    def plan_pushes(self, items: Sequence[Any]) -> set[int]:
        """Ids of the copy steps in ``items`` that run as push kernels (:mod:`torch_tessera.runtime.push`): with
        ``graph_copies="push"`` and one graph over the devices, every cut-edge copy of at most ``PUSH_MAX_BYTES``
        between two GPUs with peer access (enabled here, before the capture, where missing). Logs how many, and why
        the others are not."""
        ex = self.runnable
        if ex.graph_copies != "push" or ex.graph_mode != "whole":
            return set()
        devices, out, why_not, peers = ex.devices, set(), Counter(), {}
        copies = [x for x in items if isinstance(x, CopyStep)]
        for step in copies:
            why = push_kernels.refusal(step, devices[step.src], devices[step.dst])
            if why is None:
                a, b = devices[step.src].torch_device.index, devices[step.dst].torch_device.index
                pair = frozenset((a, b))
                if pair not in peers:
                    peers[pair] = push_kernels.peer_access(a, b)
                why = None if peers[pair] else "no peer access"
            if why is None:
                out.add(id(step))
            else:
                why_not[why] += 1
        log.info("graph_copies='push': %d of %d copies as push kernels%s", len(out), len(copies),
                 f" (the others: {dict(why_not)})" if why_not else "")
        return out

    def _fast_path(self, state: GraphState, inputs: Sequence[Any], bound: dict) -> None:
        """What each call of ``state`` needs, worked out once: addresses, inputs to check and copy, the counters one
        replay adds, whether the call must wait for it on the host, whether it may replay on the caller's stream."""
        ex = self.runnable
        program, home = ex.program, ex.home
        state.addresses = {(i, b): t.data_ptr() for i, p in enumerate(state.pools) for b, t in p.storages.items()}
        outputs = {o.buffer for o in program.outputs if isinstance(o, TensorArg)}
        state.caller_state = [(ex.input_pool_index(b), b) for b in bound
                              if program.buffers[b].kind == BufferKind.STATE and b not in outputs]
        seen: set[str] = set()
        for k, (spec, value) in enumerate(zip(program.inputs, inputs)):
            if isinstance(spec, TensorArg) and spec.buffer in bound and spec.buffer not in seen:
                seen.add(spec.buffer)
                state.bound_list.append((k, value.data_ptr()))
            elif isinstance(spec, TensorArg) and spec.buffer in state.static_inputs:
                state.copy_list.append((k, state.pools[home].view(spec)))
                if program.buffers[spec.buffer].kind == BufferKind.STATE and spec.buffer not in seen:
                    seen.add(spec.buffer)  # copied state: written by the graph, copied back to the caller's tensor
                    state.copy_back.append((k, state.pools[home].view(spec)))
        used = {home}
        for item in state.items:
            if isinstance(item, Segment):
                used.add(item.device)
            elif isinstance(item, CopyStep):
                used.update((item.src, item.dst))
        state.used_devices = sorted(used)
        state.launches = sum(len(x.steps) for x in state.items if isinstance(x, Segment))
        transfers: Counter = Counter()
        nbytes: Counter = Counter()
        for step in (x for x in state.items if isinstance(x, CopyStep)):
            transfers[step.purpose] += 1
            nbytes[step.purpose] += step.nbytes
        state.transfer_counts, state.byte_counts = dict(transfers), dict(nbytes)
        state.copy_edges = frozenset(x.edge for x in state.items if isinstance(x, CopyStep) and x.edge is not None)
        state.host_wait = bool(state.copies) or any(ex.domains[d] != ex.domains[home] for d in state.used_devices)
        state.on_caller_stream = (state.whole is not None and state.lane is None
                                  and getattr(ex.devices[home], "partition", None) is None)
        state.state_devices = [ex.devices[d].torch_device for d in sorted(set(ex.state_homes.values()))]
        state.home_device = ex.devices[home].torch_device
        m = ex.machine
        runners = {Segment: SegmentRunner(m, LaunchRunner(m), replay=True), SyncStep: SyncRunner(m),
                   CopyStep: CopyRunner(m)}
        state.replay_items = [ExecItem(runners[type(x)], x, -1) for x in state.items]

    # -- replay -------------------------------------------------------------------------------------------------
    def count_replay(self, state: GraphState, edges: set) -> None:
        """Add one replay of ``state`` to the executor's counters (launches run, transfers and bytes by purpose)
        and its cut edges to ``edges``: what counting each step would add, summed at capture."""
        counters = self.runnable.machine.counters
        counters.launches += state.launches
        counters.transfers.update(state.transfer_counts)
        counters.bytes_moved.update(state.byte_counts)
        edges |= state.copy_edges

    def __call__(self, inputs: Sequence[Any]) -> list:
        """One call of the wrapped executor with CUDA graphs (the module docstring).

        Raises:
            TesseraError: ``check_addresses`` found a storage that moved since capture.
            TransferTimeout: the replay did not complete within the executor's ``timeout_s``.
        """
        ex = self.runnable
        key = GraphKey()
        state = self.entries.get(key)
        if state is not None and not bound_inputs_unmoved(state, inputs):
            moved = [ex.program.inputs[k].buffer for k, p in state.bound_list if inputs[k].data_ptr() != p]
            log.info("inputs bound at capture (weights, state) moved: %s%s; capturing again", moved[:6],
                     f" and {len(moved) - 6} more" if len(moved) > 6 else "")
            state = None
        if state is None:
            state, ctx = self.capture(inputs, key)
            self.entries[key] = state
            ex.join_caller(self.streams)
            copy_state_back(state, inputs)
            ex.calls += 1
            ex.cut_edges_transferred = len(ctx.edges)
            first, state.first_outputs = state.first_outputs, None
            release_caller_state(state)
            # the warm-up ran this call; replaying now would apply in-place state updates twice
            return [hand_out(state, k, t, fresh=True) if isinstance(t, torch.Tensor) else t
                    for k, t in enumerate(first)]
        if self.check_addresses:
            for (i, b), ptr in state.addresses.items():
                if b in state.pools[i].storages and state.pools[i].storages[b].data_ptr() != ptr:
                    raise TesseraError(f"buffer {b} on device {i} moved since capture; replay would read stale "
                                       "memory")
        edges: set = set()
        if ex.static_positions:
            self.refresh_static(state, inputs)
        if state.on_caller_stream:
            self._call_on_caller_stream(state, inputs, edges)
        else:
            self._call_on_own_streams(state, inputs, edges)
        copy_state_back(state, inputs)
        release_caller_state(state)
        ex.cut_edges_transferred = len(edges)
        ex.calls += 1
        home = state.pools[ex.home]
        return [hand_out(state, k, home.view(o)) if isinstance(o, TensorArg) else o.value
                for k, o in enumerate(ex.program.outputs)]

    def _call_on_own_streams(self, state: GraphState, inputs: Sequence[Any], edges: set) -> None:
        """One call on the wrapper's streams: join the caller's, copy the inputs in, replay the whole graph (or the
        segments with the copies between them), wait on the host."""
        ex = self.runnable
        home = ex.home
        main = state.streams[home]
        main.wait_stream(torch.cuda.current_stream(ex.devices[home].torch_device))
        for d in sorted(set(ex.state_homes.values())):  # state kept elsewhere may be in flight there
            main.wait_stream(torch.cuda.current_stream(ex.devices[d].torch_device))
        with torch.cuda.stream(main):
            for k, static in state.copy_list:
                static.copy_(inputs[k], non_blocking=True)
        if state.whole is not None:
            with ex.devices[home].guard(), torch.cuda.stream(main):
                state.whole.replay()
            self.count_replay(state, edges)
            wait_replay(ex.machine, state.copies, main.record_event(), ex.timeout_s)
            return
        for d in state.used_devices:  # every device reads the static inputs only after they are copied in
            if d != home and state.streams[d] is not main:
                state.streams[d].wait_stream(main)
        ctx = CallContext(state.pools, state.streams, edges=edges, trace=getattr(ex, "trace", None))
        run_schedule(state.replay_items, ctx)
        ex.wait(ctx.events, [state.streams[d] for d in state.used_devices])

    def _call_on_caller_stream(self, state: GraphState, inputs: Sequence[Any], edges: set) -> None:
        """One call of a whole graph on the caller's current stream of the home device.

        Per call: join the stream the previous replay went to if the caller switched streams (it may still read the
        static inputs), join the caller's streams where STATE kept off the home device lives, copy the INPUT-kind
        inputs into their static storages, replay (``CUDAGraph.replay`` launches on the current stream of the
        capture device), count. When the graph holds transfers or touches another device, wait for it on the host
        (``TransferTimeout`` names the transfers); otherwise return at once: the outputs are ordered on the caller's
        stream, as with ``mode="reduce-overhead"``.
        """
        ex = self.runnable
        stream = torch.cuda.current_stream(state.home_device)
        last = state.last_stream
        if last is not None and last != stream:
            stream.wait_stream(last)
        for dev in state.state_devices:
            stream.wait_stream(torch.cuda.current_stream(dev))
        for k, static in state.copy_list:
            static.copy_(inputs[k], non_blocking=True)
        state.whole.replay()
        state.last_stream = stream
        self.count_replay(state, edges)
        if state.host_wait:
            wait_replay(ex.machine, state.copies, stream.record_event(), ex.timeout_s)

    def refresh_static(self, state: GraphState, inputs: Sequence[Any]) -> None:
        """Copy again the static inputs the caller modified in place since ``state`` placed them (same address,
        another ``_version``; a moved one made the caller capture again), into the storages the graphs read.

        Ordering, made trivial because this is rare (a module buffer changed by the caller): every device is
        synchronised first (the caller's in-place write has landed; the previous replay no longer reads the
        storage), the copies run, and every device is synchronised again before the replay is issued.

        Not rare for an inference tensor (no version counter, so always stale): then this runs every call, two host
        synchronisations each. Logged once per capture; ``static_inputs="copy"`` is the fast choice there.
        """
        ex = self.runnable
        stale = ex.stale_static(inputs, state.static_keys)
        if not stale:
            return
        for d in ex.devices:
            d.synchronize()
        ctx = CallContext(state.pools, state.streams)
        copy = CopyRunner(ex.machine)
        for step in ex.schedule.setup:
            if step.purpose == "static" and step.buffer in stale:
                copy(step, ctx)  # into state.pools[step.dst]'s storage: the one captured
        for d in ex.devices:
            d.synchronize()
        state.static_keys = static_input_keys(ex.static_positions, inputs)
        log.debug("static inputs changed in place, copied again before the replay: %s", sorted(stale))
        inference = sorted(b for b in stale if any(v is None for _, v in state.static_keys.get(b, ())))
        if inference and not state.warned_inference:
            state.warned_inference = True
            log.warning("static inputs %s are inference tensors (no version counter): copied again before every "
                        "replay, between two host synchronisations; pass options={'static_inputs': 'copy'} to copy "
                        "them inside the graph instead, or make them outside torch.inference_mode", inference[:5])

    # -- pipelined micro-batches --------------------------------------------------------------------------------
    def issue_wave(self, wave: Sequence[tuple[int, Sequence[Any]]], lanes: Sequence[Any]) -> list[CallContext]:
        """Issue one wave of pipelined micro-batches (:mod:`torch_tessera.runtime.pipelining`).

        Micro-batch ``wave[k]`` runs on slot ``k``, whose entry (``GraphKey(k)``) owns static pools and graphs
        captured on its streams (at the slot's first use, and again when a weight or state input moves). Before a
        slot is reused its streams wait for all its earlier work (static storages are overwritten), then the
        micro-batch's INPUT tensors are copied into the slot's static storages. Whole graphs replay one per slot;
        segments replay and copies run chunk by chunk, round-robin over the wave. Each micro-batch's outputs are
        copied out of the static storages on the slot's home stream, so later micro-batches on the slot do not
        overwrite them.

        Returns:
            one context per micro-batch (``batch``, ``edges``, ``events``, ``outputs``).
        """
        ex = self.runnable
        program, home = ex.program, ex.home
        flights, done = [], []
        for k, (m, inputs) in enumerate(wave):
            lane, key = lanes[k], GraphKey(k)
            state = self.entries.get(key)
            moved = state is not None and not bound_inputs_unmoved(state, inputs)
            if moved:
                log.info("slot %d: an input bound at capture (weights, state) moved; capturing again", k)
            if state is None or moved:
                for d in ex.devices:  # earlier waves may still use the slot's old static storages
                    d.synchronize()
                state, ctx = self.capture(inputs, key, lane)
                self.entries[key] = state
                lane.join(ex.devices)
                ctx.batch, ctx.outputs, state.first_outputs = m, state.first_outputs, None
                done.append(ctx)  # its warm-up pass was this micro-batch's run (state updates apply once)
                continue
            lane.barrier()
            main = lane.streams[home]
            with torch.cuda.stream(main):
                for i, static in state.copy_list:
                    static.copy_(inputs[i], non_blocking=True)
            for s in lane.streams:
                if s is not main:
                    s.wait_stream(main)
            ctx = CallContext(state.pools, lane.streams, lane=lane, batch=m, trace=getattr(ex, "trace", None))
            flights.append((ctx, state))
        if flights and flights[0][1].whole is not None:  # one graph per slot: they overlap on the GPUs by themselves
            for ctx, state in flights:
                with ex.devices[home].guard(), torch.cuda.stream(ctx.lane.streams[home]):
                    state.whole.replay()
                self.count_replay(state, ctx.edges)
        elif flights:
            chunks = [range(s, e) for s, e in schedule_chunks(flights[0][1].items)]
            issue_round_robin(chunks, flights,
                              lambda f, rng: run_schedule([f[1].replay_items[i] for i in rng], f[0]))
        for ctx, state in flights:
            pool = state.pools[home]
            with torch.cuda.stream(ctx.lane.streams[home]):
                ctx.outputs = [pool.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]
            done.append(ctx)
        return done
