"""CUDA graphs for the multi-device executor: one graph per device segment, captured once, replayed every call.

A *segment* is a maximal run of consecutive launches on one device with no copy between them. Capture and replay:

1. First call: static buffer pools are built (weights and state bound to the caller's storages, graph inputs of kind
   INPUT copied into static storages, every temporary allocated once and kept), the schedule runs once eagerly
   (Triton compiles and autotunes, cuBLAS initialises), then each segment is captured on its device's stream into a
   :class:`torch.cuda.CUDAGraph` sharing one memory pool per device.
2. Every call: INPUT-kind inputs are copied into their static storages (not the program's ``static_inputs``: module
   buffers the caller keeps at one address are read in place, as weights are); segments replay on their streams;
   copies between segments run eagerly on the link's copy stream, ordered by events exactly as in eager mode. One
   graph over every device (``"whole"``) replays on the caller's current stream (no stream joins), and the call waits
   on the host only when the graph holds transfers (to raise ``TransferTimeout`` naming them) or touches other
   devices; a graph of the home device alone returns at once, ordered on the caller's stream like
   ``mode="reduce-overhead"``.
3. If a weight, state or static input arrives at another address than at capture (the caller re-allocated it), the
   graphs are captured again (which places the weights and static inputs again). A static input read on another
   device is placed there once, at capture, like a weight (setup steps of purpose ``"static"``); when the caller
   modified it in place (its ``_version`` changed), it is copied again into the very storage the graphs read, before
   the replay, between two host synchronisations (:func:`_refresh_static`); an inference tensor, which has no
   ``_version``, is copied so every call (slow: use ``static_inputs="copy"``, whose copy is inside the graph).
   ``PlacedExecutor.captures`` counts captures; ``check_addresses=True`` verifies before each replay that every
   storage a graph uses still has its capture-time address.

Outputs are views of static storages, overwritten by the next call (as with ``mode="reduce-overhead"``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime.executor import BufferPool, bind_input, launch_buffers
from torch_tessera.runtime.schedule import CopyStep, LaunchStep, SyncStep

log = logging.getLogger(__name__)


@dataclass
class Segment:
    """Consecutive launches on one device, captured as one graph."""

    device: int
    steps: list[LaunchStep]
    graph: Any = None


@dataclass
class GraphState:
    """Everything captured for a placed executor."""

    pools: list[BufferPool]
    items: list[Any]  # Segment | CopyStep, in schedule order
    static_inputs: dict[str, torch.Tensor]  # INPUT buffers: static storage the caller's data is copied into
    addresses: dict[tuple[int, str], int] = field(default_factory=dict)
    # per-call fast path, precomputed at capture: (input index, address) of the PARAMETER / STATE inputs bound to the
    # caller's storages, (input index, static view) of copied INPUT-kind inputs, and the devices whose streams work
    bound_list: list[tuple[int, int]] = field(default_factory=list)
    copy_list: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    used_devices: list[int] = field(default_factory=list)
    fast_check: Any = None  # (pointers by input position, indices) for torch._C._tensors_data_ptrs_at_indices_equal
    first_outputs: Any = None  # the capturing call's outputs (from its warm-up pass), handed out once
    lane: Any = None  # the pipeline slot whose streams the graphs were captured on (None: the executor's streams)
    whole: Any = None  # one graph over every device, copies inside (graph_mode "whole"); None: one per segment
    pushes: frozenset = frozenset()  # ids of the copy steps inside ``whole`` that run as push kernels
    keep_alive: list = field(default_factory=list)  # the other GPUs' memory pools the whole graph allocated from
    copies: list = field(default_factory=list)  # the copy steps inside ``whole`` (counted per replay)
    # what one replay adds to the executor's counters, summed at capture (see _count_replay)
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


def _segments(executor: Any) -> list[Any]:
    items: list[Any] = []
    for step in executor.schedule.steps:
        if isinstance(step, LaunchStep):
            if items and isinstance(items[-1], Segment) and items[-1].device == step.device:
                items[-1].steps.append(step)
            else:
                items.append(Segment(step.device, [step]))
        else:
            items.append(step)
    return items


def _capture(executor: Any, inputs: Sequence[Any], lane: Any = None, edges: set | None = None) -> GraphState:
    """Static pools, a warm-up pass and one graph per segment; on ``lane``'s streams when given (a pipeline slot:
    its pools share the weights the executor placed once instead of copying them again).

    The warm-up pass *is* this call's execution: its outputs are cloned into ``GraphState.first_outputs`` and the
    caller returns them without replaying, so in-place state updates (KV-cache writes, transformers' per-layer
    cache-length counters, SSM state) happen exactly once on the capturing call. Cut edges its copies carry are added
    to ``edges`` (default: the executor's set for this call)."""
    program = executor.program
    devices = executor.devices
    torch.cuda.synchronize()
    if lane is None:
        from torch_tessera.runtime.pipelining import greatest_priority, single_priority

        prio = single_priority(getattr(executor, "priority_class", "normal"), greatest_priority(devices))
        # capture needs non-default streams; a replay runs at its launch stream's priority (CUDA graphs' default,
        # without cudaGraphInstantiateFlagUseNodePriority)
        executor.streams = [d.new_stream(priority=prio) for d in devices]
    streams = executor.streams if lane is None else lane.streams
    pools = executor.make_pools()
    if lane is not None:
        for p, w in zip(pools, executor._weights):
            p.storages.update(w.storages)
    home = pools[executor.home]
    static_inputs: dict[str, torch.Tensor] = {}
    bound: dict[str, int] = {}
    static_in_place = set(getattr(program, "static_inputs", ()))  # module buffers at one address: read in place
    executor.check_state_devices(inputs)
    for spec, value in zip(program.inputs, inputs):
        if not isinstance(spec, TensorArg) or spec.buffer in home or spec.buffer in bound:
            continue
        kind = program.buffers[spec.buffer].kind
        if kind == BufferKind.INPUT and spec.buffer not in static_in_place:
            home.allocate(spec.buffer, program.buffers[spec.buffer].nbytes)
            static_inputs[spec.buffer] = home.storages[spec.buffer]
        else:  # weights, state and static INPUTs, bound where the caller keeps them (state may live elsewhere)
            bind_input(pools[executor.input_pool_index(spec.buffer)], spec, value, len(bound))
            bound[spec.buffer] = value.data_ptr()
    _copy_inputs(program, home, inputs, static_inputs)
    torch.cuda.synchronize()  # the warm-up below runs on other streams: the static inputs must have landed
    for step in executor.schedule.setup if lane is None else ():
        executor._place_weight(step, pools)  # a copy, or a storage shared through executor.weight_cache
    if getattr(executor, "weight_cache", None) is not None and lane is None:
        torch.cuda.synchronize()  # shared weight storages are read by other executors' streams from now on
    fresh_all = set().union(*executor._fresh.values()) if executor._fresh else set()
    for i, d in enumerate(devices):
        for b in sorted({b for s in executor.schedule.steps if isinstance(s, LaunchStep) and s.device == i
                         for b in launch_buffers(program.launches[s.launch])} - fresh_all):
            executor._ensure(pools[i], i, b)
    items = _segments(executor)
    pushes = plan_pushes(executor, items)
    # warm-up: one eager pass (compiles and autotunes kernels, the push kernel too, at the very addresses the capture
    # sees; fresh extern outputs get eager storages)
    for item in items:
        _run_item(executor, item, pools, capture=False, lane=lane, edges=edges, push=id(item) in pushes)
    for s in streams:
        if s is not None:
            s.synchronize()
    first_outputs = [home.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]
    executed = executor.launches_executed  # capturing records launches, it does not run them
    whole = None
    if getattr(executor, "graph_mode", "segments") == "whole":
        whole = _capture_whole(executor, items, pools, streams, lane, pushes)
    mempools = {i: torch.cuda.graph_pool_handle() for i in set(executor.domains)} if whole is None else {}
    for item in items if whole is None else ():
        if isinstance(item, Segment):
            torch.cuda.synchronize(devices[item.device].torch_device)
            g = torch.cuda.CUDAGraph()
            with devices[item.device].guard():
                with torch.cuda.graph(g, pool=mempools[executor.domains[item.device]],
                                      stream=streams[item.device]):
                    for step in item.steps:
                        executor._launch(step, pools, lane)
            item.graph = g
        # copies between segments are not re-issued while capturing: the warm-up pass already moved this call's
        # bytes (and counted them), and the segments captured here run nothing
    torch.cuda.synchronize()
    executor.launches_executed = executed
    state = GraphState(pools, items, static_inputs, lane=lane)
    if lane is None:  # its own setup ran above (a slot's pools share the executor's, refreshed by run_pipelined)
        from torch_tessera.runtime.placed import static_input_keys

        state.static_keys = static_input_keys(getattr(executor, "_static_at", ()), inputs)
    if whole is not None:
        state.whole, state.keep_alive = whole
        state.copies = [x for x in items if isinstance(x, CopyStep)]
        state.pushes = frozenset(pushes)
    state.first_outputs = first_outputs
    state.addresses = {(i, b): t.data_ptr() for i, p in enumerate(pools) for b, t in p.storages.items()}
    seen: set[str] = set()
    for k, (spec, value) in enumerate(zip(program.inputs, inputs)):
        if isinstance(spec, TensorArg) and spec.buffer in bound and spec.buffer not in seen:
            seen.add(spec.buffer)
            state.bound_list.append((k, value.data_ptr()))
        elif isinstance(spec, TensorArg) and spec.buffer in static_inputs:
            state.copy_list.append((k, home.view(spec)))
    used = {executor.home}
    for item in items:
        if isinstance(item, Segment):
            used.add(item.device)
        elif isinstance(item, CopyStep):
            used.update((item.src, item.dst))
    state.used_devices = sorted(used)
    _precompute_replay(executor, state)
    executor.captures += 1
    n_copies = sum(isinstance(x, CopyStep) for x in items)
    if whole is not None:
        log.info("captured one CUDA graph over %d devices (%d segments, %d copies inside it, %d of them push "
                 "kernels)", len(state.used_devices), sum(isinstance(x, Segment) for x in items), n_copies,
                 len(state.pushes))
    else:
        log.info("captured %d CUDA graphs (%d copies between them)", sum(isinstance(x, Segment) for x in items),
                 n_copies)
    return state


def plan_pushes(executor: Any, items: Sequence[Any]) -> set[int]:
    """Ids of the copy steps in ``items`` that run as push kernels (:mod:`torch_tessera.runtime.push`): with
    ``graph_copies="push"`` and one graph over the devices, every cut-edge copy of at most ``PUSH_MAX_BYTES``
    between two GPUs with peer access (enabled here, before the capture, where missing). Logs how many, and why the
    others are not."""
    if getattr(executor, "graph_copies", "link") != "push" or getattr(executor, "graph_mode", "") != "whole":
        return set()
    from torch_tessera.runtime import push

    devices, out, why_not, peers = executor.devices, set(), Counter(), {}
    copies = [x for x in items if isinstance(x, CopyStep)]
    for step in copies:
        why = push.refusal(step, devices[step.src], devices[step.dst])
        if why is None:
            a, b = devices[step.src].torch_device.index, devices[step.dst].torch_device.index
            pair = frozenset((a, b))
            if pair not in peers:
                peers[pair] = push.peer_access(a, b)
            why = None if peers[pair] else "no peer access"
        if why is None:
            out.add(id(step))
        else:
            why_not[why] += 1
    log.info("graph_copies='push': %d of %d copies as push kernels%s", len(out), len(copies),
             f" (the others: {dict(why_not)})" if why_not else "")
    return out


def _precompute_replay(executor: Any, state: GraphState) -> None:
    """What each call of ``state`` needs, worked out once: the counters one replay adds, whether the call must wait
    for it on the host, and whether it may replay on the caller's stream."""
    state.launches = sum(len(x.steps) for x in state.items if isinstance(x, Segment))
    transfers: Counter = Counter()
    nbytes: Counter = Counter()
    for step in (x for x in state.items if isinstance(x, CopyStep)):
        transfers[step.purpose] += 1
        nbytes[step.purpose] += step.nbytes
    state.transfer_counts, state.byte_counts = dict(transfers), dict(nbytes)
    state.copy_edges = frozenset(x.edge for x in state.items if isinstance(x, CopyStep) and x.edge is not None)
    home = executor.home
    state.host_wait = bool(state.copies) or any(executor.domains[d] != executor.domains[home]
                                                for d in state.used_devices)
    state.on_caller_stream = (state.whole is not None and state.lane is None
                              and getattr(executor.devices[home], "partition", None) is None)
    state.state_devices = [executor.devices[d].torch_device for d in sorted(set(executor.state_homes.values()))]
    state.home_device = executor.devices[home].torch_device


def _count_replay(executor: Any, state: GraphState, edges: set) -> None:
    """Add one replay of ``state`` to the executor's counters (launches run, transfers and bytes by purpose) and its
    cut edges to ``edges``: what counting each step would add, summed at capture."""
    executor.launches_executed += state.launches
    executor.transfers.update(state.transfer_counts)
    executor.bytes_moved.update(state.byte_counts)
    edges |= state.copy_edges


def _capture_whole(executor: Any, items: Sequence[Any], pools: list[BufferPool], streams: Sequence[Any],
                   lane: Any, pushes: set[int] = frozenset()) -> tuple[Any, list] | None:
    """Capture every segment AND the copies between them as ONE CUDA graph spanning the devices; None if CUDA or this
    torch refuses (the caller then captures one graph per segment).

    The capture begins on the home device's stream; every other stream the schedule uses (other devices' compute
    streams, the links' copy streams) joins it through an event, so their work becomes nodes of the same graph and the
    events between them become its edges. Copies between GPUs are captured as memcpy nodes on the link's copy stream
    (:func:`_capture_copy`), or, for the steps in ``pushes``, as push kernels on the producer's stream
    (:mod:`torch_tessera.runtime.push`). Extern kernels that allocate their outputs allocate from the graph's pool on
    the home GPU and from a private ``torch.cuda.MemPool`` per other GPU, owned by that GPU (:func:`_private_pool`)
    and kept alive with the graph. Replaying it is one ``cudaGraphLaunch`` per call, with no host work between
    segments: measured 2026-11-29 on two H200s (``bench/gpu_multidevice_graph.py``), a hop between GPUs inside one
    graph cost 12 us (8 KiB) against 131 us issued from Python.

    Returns:
        ``(graph, objects to keep alive with it)``, or None after logging why the capture failed.
    """
    import contextlib

    devices, home = executor.devices, executor.home
    main = streams[home]
    if not isinstance(main, torch.cuda.Stream):  # the CPU stand-in of the tests has no streams to fork
        main = None
    copy_streams = {}
    on_producer = getattr(executor, "graph_copies", "link") == "producer"  # copies on the producer's own stream
    for item in items:
        if isinstance(item, CopyStep) and (item.src, item.dst) not in copy_streams and id(item) not in pushes:
            copy_streams[(item.src, item.dst)] = (None if on_producer else executor._copy_stream(item.src, item.dst)
                                                  if lane is None else lane.copy_stream(item.src, item.dst))
    touched = [s for s in [*streams, *copy_streams.values()] if isinstance(s, torch.cuda.Stream) and s is not main]
    home_dom = executor.domains[home]
    other_pools = {}
    for i, d in enumerate(devices):
        if executor.domains[i] != home_dom and executor.domains[i] not in other_pools:
            other_pools[executor.domains[i]] = (d.torch_device, _private_pool(d.torch_device) if main is not None
                                                else None)
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
                for item in items:
                    if isinstance(item, Segment):
                        for step in item.steps:
                            executor._launch(step, pools, lane)
                    elif isinstance(item, SyncStep):
                        executor._sync(item, lane)
                    elif id(item) in pushes:
                        _capture_copy(executor, item, pools, streams, None, push=True)
                    else:
                        _capture_copy(executor, item, pools, streams, copy_streams[(item.src, item.dst)])
                if main is not None:
                    for st in touched:
                        done = torch.cuda.Event()
                        done.record(st)
                        main.wait_event(done)
    except Exception as e:  # noqa: BLE001 - CUDA or torch refused the multi-device capture: fall back, say why
        import warnings

        from torch_tessera.errors import TesseraFallbackWarning

        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("one CUDA graph over all devices could not be captured (%s); capturing one graph per segment "
                    "instead", why)
        warnings.warn(f"tessera could not capture the program as one CUDA graph ({why}); it replays one graph per "
                      "device segment instead (cuda_graphs='segments' asks for that directly, cuda_graphs=False "
                      "turns graphs off)", TesseraFallbackWarning, stacklevel=2)
        torch.cuda.synchronize()
        return None
    return graph, [pool for _, pool in other_pools.values()]


def _private_pool(device: torch.device) -> Any:
    """A ``torch.cuda.MemPool`` owned by ``device``, for a capture's allocations there while another GPU captures.

    c10 ties a ``MemPool`` to the device current when it is *constructed* (``MemPool::MemPool``: ``device_ =
    current_device()``, one use there), and ``use_mem_pool(pool, device=d)`` adds a use on ``d`` only while it is
    entered. Built while the home GPU is current, the pool had no use left on ``d`` once the capture ended; the next
    capture's ``torch.cuda.empty_cache()`` (``torch.cuda.graph.__enter__`` calls it) then freed its cached segments,
    the blocks the graph's extern ops allocated and released inside the capture, which every replay still writes
    (the suspected cause of the illegal memory access after a decode replay on two H200s, 2026-11-29; not yet
    confirmed on the GPU). Made current here, ``d`` holds a use for the pool's life.
    """
    with torch.cuda.device(device):
        return torch.cuda.MemPool()


def _capture_copy(executor: Any, step: CopyStep, pools: list[BufferPool], streams: Sequence[Any],
                  copy_stream: Any, push: bool = False) -> None:
    """Capture one copy step as a memcpy node: after the producer's stream, before the consumer's (see
    :func:`order_copy`); on ``copy_stream`` (the link's), or on the producer's stream when it is None
    (``graph_copies="producer"``). With ``push``, as the push kernel on the producer's stream instead
    (:mod:`torch_tessera.runtime.push`; its kernel was compiled by the warm-up pass, at these addresses).

    ``Tensor.copy_`` between GPUs is not used here: torch runs it on the *source* device's current stream with a
    two-way barrier against the destination's current stream, and inside a capture those would have to be this
    graph's streams too (a default stream breaks the capture) and would serialise the copy with compute. A plain
    ``cuMemcpyAsync`` of the byte range (unified addressing) orders only by the events below.
    """
    src = pools[step.src].storages[step.buffer][step.start:step.end]
    dst = pools[step.dst].storages[step.buffer][step.start:step.end]
    waits = executor._copy_waits.get(id(step), (False, False))  # see schedule.copy_hazards
    if push:
        from torch_tessera.runtime.push import push_on_producer

        push_on_producer(executor.devices[step.src], src, dst, streams[step.src], streams[step.dst], waits)
        return

    def memcpy(stream: Any) -> None:
        if src.device == dst.device:  # two SM partitions of one GPU: an ordinary device copy
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
            return
        from cuda.bindings import driver as drv

        (err,) = drv.cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), step.nbytes, stream.cuda_stream)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise TesseraError(f"cuMemcpyAsync of {step.buffer}[{step.start}:{step.end}] failed: {err}")

    order_copy(streams[step.src], streams[step.dst], copy_stream, waits, memcpy)


def order_copy(src_stream: Any, dst_stream: Any, copy_stream: Any, waits: tuple[bool, bool],
               issue: Callable[[Any], None]) -> None:
    """Issue one cut-edge copy with ``issue(stream)`` and order it among the compute streams by stream waits.

    The copy runs after everything queued on the producer's stream (``src_stream``) and the consumer's stream
    (``dst_stream``) waits for it. ``waits = (wait_dst, src_waits)`` from :func:`~torch_tessera.runtime.schedule.
    copy_hazards`: the copy also waits for the consumer's stream (it overwrites bytes a launch there may still read),
    and the producer's stream waits for the copy (a later launch there overwrites what it reads).

    On ``copy_stream`` (the link's own stream) the copy overlaps later work of the producer. With ``copy_stream=None``
    it runs on the producer's stream: no copy stream and one event fewer per hop, at the price of serialising the
    copy with the producer's later launches; every ordering of the first way holds in the second (a copy stream only
    ever carries copies out of that producer, each after the producer's earlier work), which
    ``tests/runtime/test_graph_copy_order.py`` checks on real schedules.
    """
    wait_dst, src_waits = waits
    stream = src_stream if copy_stream is None else copy_stream
    if stream is not src_stream:
        stream.wait_stream(src_stream)
    if wait_dst:
        stream.wait_stream(dst_stream)
    issue(stream)
    dst_stream.wait_stream(stream)
    if src_waits and stream is not src_stream:
        src_stream.wait_stream(stream)


def _copy_inputs(program: Any, home: BufferPool, inputs: Sequence[Any], static: dict[str, torch.Tensor]) -> None:
    """Copy each INPUT-kind input into its static storage, at the place the recorded view says (the caller's view
    may sit at another storage offset each call)."""
    for spec, value in zip(program.inputs, inputs):
        if isinstance(spec, TensorArg) and spec.buffer in static:
            home.view(spec).copy_(value, non_blocking=True)


def _run_item(executor: Any, item: Any, pools: list[BufferPool], capture: bool, lane: Any = None,
              edges: set | None = None, push: bool = False) -> Any:
    if isinstance(item, Segment):
        if item.graph is not None and not capture:
            stream = (executor.streams if lane is None else lane.streams)[item.device]
            with executor.devices[item.device].guard(), torch.cuda.stream(stream):
                item.graph.replay()
            executor.launches_executed += len(item.steps)
        else:
            for step in item.steps:
                executor._launch(step, pools, lane)
        return None
    if isinstance(item, SyncStep):
        executor._sync(item, lane)
        return None
    return executor._copy(item, pools, lane, edges, push=push)


def _bound_inputs_unmoved(state: GraphState, inputs: Sequence[Any]) -> bool:
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


def _replay_whole(executor: Any, state: GraphState, stream: Any, edges: set) -> None:
    """Replay the one multi-device graph on ``stream`` (the home device's) and count what it ran and copied."""
    with executor.devices[executor.home].guard(), torch.cuda.stream(stream):
        state.whole.replay()
    _count_replay(executor, state, edges)


def _call_on_caller_stream(executor: Any, state: GraphState, inputs: Sequence[Any]) -> None:
    """One call of a whole graph on the caller's current stream of the home device.

    Per call: join the stream the previous replay went to if the caller switched streams (it may still read the
    static inputs), join the caller's streams where STATE kept off the home device lives, copy the INPUT-kind inputs
    into their static storages, replay (``CUDAGraph.replay`` launches on the current stream of the capture device),
    count. When the graph holds transfers or touches another device, wait for it on the host (``TransferTimeout``
    names the transfers); otherwise return at once: the outputs are ordered on the caller's stream, as with
    ``mode="reduce-overhead"``.
    """
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
    _count_replay(executor, state, executor._edges_this_call)
    if state.host_wait:
        executor._wait_whole(state.copies, stream.record_event())


def _refresh_static(executor: Any, state: GraphState, inputs: Sequence[Any]) -> None:
    """Copy again the static inputs the caller modified in place since ``state`` placed them (same address, another
    ``_version``; a moved one made the caller capture again), into the storages the graphs read.

    Ordering, made trivial because this is rare (a module buffer changed by the caller): every device is synchronised
    first (the caller's in-place write, queued on its stream, has landed; the previous replay no longer reads the
    storage), the copies run, and every device is synchronised again before the replay is issued. On CPU virtual
    devices the copies are synchronous.

    Not rare for an inference tensor (made under ``torch.inference_mode``: no version counter, so always stale): then
    this runs every call, two host synchronisations each, which a graph replay is meant to avoid. Logged once per
    capture; ``static_inputs="copy"`` (the copy inside the graph, ordered on the GPU) is the fast choice there.
    """
    stale = executor.stale_static(inputs, state.static_keys)
    if not stale:
        return
    from torch_tessera.runtime.placed import static_input_keys

    for d in executor.devices:
        d.synchronize()
    for step in executor.schedule.setup:
        if step.purpose == "static" and step.buffer in stale:
            executor._copy(step, state.pools)  # into state.pools[step.dst]'s storage: the one captured
    for d in executor.devices:
        d.synchronize()
    state.static_keys = static_input_keys(executor._static_at, inputs)
    log.debug("static inputs changed in place, copied again before the replay: %s", sorted(stale))
    inference = sorted(b for b in stale if any(v is None for _, v in state.static_keys.get(b, ())))
    if inference and not state.warned_inference:
        state.warned_inference = True
        log.warning("static inputs %s are inference tensors (no version counter): copied again before every replay, "
                    "between two host synchronisations; pass options={'static_inputs': 'copy'} to copy them inside "
                    "the graph instead, or make them outside torch.inference_mode", inference[:5])


def run_with_graphs(executor: Any, inputs: Sequence[Any], check_addresses: bool = False) -> list:
    """One call of a placed executor with CUDA graphs (see the module docstring)."""
    program = executor.program
    state: GraphState | None = executor._graphs
    if state is not None and not _bound_inputs_unmoved(state, inputs):
        log.info("an input bound at capture (weights, state) moved; capturing again")
        state = None
    if state is None:
        executor._edges_this_call = set()
        state = executor._graphs = _capture(executor, inputs)
        executor._join_caller()
        executor.calls += 1
        executor.cut_edges_transferred = len(executor._edges_this_call)
        first, state.first_outputs = state.first_outputs, None
        return first  # the warm-up ran this call; replaying now would apply in-place state updates twice
    if check_addresses:
        for (i, b), ptr in state.addresses.items():
            if state.pools[i].storages[b].data_ptr() != ptr:
                raise TesseraError(f"buffer {b} on device {i} moved since capture; replay would read stale memory")
    executor._edges_this_call = set()
    if getattr(executor, "_static_at", None):
        _refresh_static(executor, state, inputs)
    if state.on_caller_stream:
        _call_on_caller_stream(executor, state, inputs)
    else:
        main = executor.streams[executor.home]
        main.wait_stream(torch.cuda.current_stream(executor.devices[executor.home].torch_device))
        for d in sorted(set(executor.state_homes.values())):  # state kept elsewhere may be in flight there
            main.wait_stream(torch.cuda.current_stream(executor.devices[d].torch_device))
        with torch.cuda.stream(main):
            for k, static in state.copy_list:
                static.copy_(inputs[k], non_blocking=True)
        if state.whole is not None:
            _replay_whole(executor, state, main, executor._edges_this_call)
            executor._wait_whole(state.copies, main.record_event())
        else:
            for d in state.used_devices:  # every device reads the static inputs only after they are copied in
                if d != executor.home and executor.streams[d] is not main:
                    executor.streams[d].wait_stream(main)
            events = []
            for item in state.items:
                ev = _run_item(executor, item, state.pools, capture=False)
                if ev is not None:
                    events.append((item, ev))
            executor._wait(events, [executor.streams[d] for d in state.used_devices])
    executor.cut_edges_transferred = len(executor._edges_this_call)
    executor.calls += 1
    home = state.pools[executor.home]
    # cloned: a replay rewrites the graph's static storages, and a caller may keep the last call's outputs
    return [home.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]


def issue_wave_with_graphs(executor: Any, wave: Sequence[tuple[int, Sequence[Any]]], lanes: Sequence[Any],
                           outputs: list[list], edges: list[set], events: list) -> None:
    """Issue one wave of pipelined micro-batches with CUDA graphs (see :mod:`torch_tessera.runtime.pipelining`).

    Micro-batch ``wave[k]`` runs on slot ``k``, which owns static pools and graphs captured on its streams
    (``executor._slot_graphs[k]``, captured at the slot's first use and again when a weight or state input moves).
    Before a slot is reused its streams wait for all its earlier work (static storages are overwritten), then the
    micro-batch's INPUT tensors are copied into the slot's static storages. Segments replay and copies run chunk by
    chunk, round-robin over the wave. Each micro-batch's outputs are copied out of the static storages on the slot's
    home stream, so later micro-batches on the slot do not overwrite them.

    Args:
        executor: a :class:`PlacedExecutor` with ``cuda_graphs=True``.
        wave: ``(micro-batch index, inputs)`` per slot.
        lanes: the slots' streams (:class:`torch_tessera.runtime.pipelining.Lane`).
        outputs / edges / events: filled per micro-batch index (outputs, cut edges copied) and with copy events.
    """
    from torch_tessera.runtime.pipelining import schedule_chunks

    program, home = executor.program, executor.home
    states: dict[int, GraphState] = executor.__dict__.setdefault("_slot_graphs", {})
    flights = []
    for k, (m, inputs) in enumerate(wave):
        lane, state = lanes[k], states.get(k)
        moved = state is not None and not _bound_inputs_unmoved(state, inputs)
        if moved:
            log.info("slot %d: an input bound at capture (weights, state) moved; capturing again", k)
        if state is None or moved:
            for d in executor.devices:  # earlier waves may still use the slot's old static storages
                d.synchronize()
            state = states[k] = _capture(executor, inputs, lane, edges[m])
            lane.join(executor.devices)
            outputs[m], state.first_outputs = state.first_outputs, None
            continue  # its warm-up pass was this micro-batch's run (no replay: state updates apply once)
        else:
            lane.barrier()
            main = lane.streams[home]
            with torch.cuda.stream(main):
                for i, static in state.copy_list:
                    static.copy_(inputs[i], non_blocking=True)
            for s in lane.streams:
                if s is not main:
                    s.wait_stream(main)
        flights.append((m, lane, state))
    if not flights:
        return
    if flights[0][2].whole is not None:  # one graph per slot: the slots' graphs overlap on the GPUs by themselves
        for m, lane, state in flights:
            _replay_whole(executor, state, lane.streams[home], edges[m])
        chunks = []
    else:
        chunks = schedule_chunks(flights[0][2].items)
    for start, end in chunks:
        for m, lane, state in flights:
            for item in state.items[start:end]:
                ev = _run_item(executor, item, state.pools, capture=False, lane=lane, edges=edges[m])
                if ev is not None:
                    events.append((item, ev))
    for m, lane, state in flights:
        pool = state.pools[home]
        with torch.cuda.stream(lane.streams[home]):
            outputs[m] = [pool.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]
