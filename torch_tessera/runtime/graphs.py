"""CUDA graphs for the multi-device executor: one graph per device segment, captured once, replayed every call.

A *segment* is a maximal run of consecutive launches on one device with no copy between them. Capture and replay:

1. First call: static buffer pools are built (weights and state bound to the caller's storages, graph inputs of kind
   INPUT copied into static storages, every temporary allocated once and kept), the schedule runs once eagerly
   (Triton compiles and autotunes, cuBLAS initialises), then each segment is captured on its device's stream into a
   :class:`torch.cuda.CUDAGraph` sharing one memory pool per device.
2. Every call: INPUT-kind inputs are copied into their static storages; segments replay on their streams; copies
   between segments run eagerly on the link's copy stream, ordered by events exactly as in eager mode.
3. If a weight or state input arrives at another address than at capture (the caller re-allocated it), the graphs are
   captured again. ``PlacedExecutor.captures`` counts captures; ``check_addresses=True`` verifies before each replay
   that every storage a graph uses still has its capture-time address.

Outputs are views of static storages, overwritten by the next call (as with ``mode="reduce-overhead"``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

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
        executor.streams = [d.new_stream() for d in devices]  # capture needs non-default streams
    streams = executor.streams if lane is None else lane.streams
    pools = executor.make_pools()
    if lane is not None:
        for p, w in zip(pools, executor._weights):
            p.storages.update(w.storages)
    home = pools[executor.home]
    static_inputs: dict[str, torch.Tensor] = {}
    bound: dict[str, int] = {}
    for spec, value in zip(program.inputs, inputs):
        if not isinstance(spec, TensorArg) or spec.buffer in home:
            continue
        kind = program.buffers[spec.buffer].kind
        if kind == BufferKind.INPUT:
            home.allocate(spec.buffer, program.buffers[spec.buffer].nbytes)
            static_inputs[spec.buffer] = home.storages[spec.buffer]
        else:
            bind_input(home, spec, value, len(bound))
            bound[spec.buffer] = value.data_ptr()
    _copy_inputs(program, home, inputs, static_inputs)
    torch.cuda.synchronize()  # the warm-up below runs on other streams: the static inputs must have landed
    for step in executor.schedule.setup if lane is None else ():
        executor._copy(step, pools)
    fresh_all = set().union(*executor._fresh.values()) if executor._fresh else set()
    for i, d in enumerate(devices):
        for b in sorted({b for s in executor.schedule.steps if isinstance(s, LaunchStep) and s.device == i
                         for b in launch_buffers(program.launches[s.launch])} - fresh_all):
            executor._ensure(pools[i], i, b)
    items = _segments(executor)
    # warm-up: one eager pass (compiles and autotunes kernels; fresh extern outputs get eager storages)
    for item in items:
        _run_item(executor, item, pools, capture=False, lane=lane, edges=edges)
    for s in streams:
        if s is not None:
            s.synchronize()
    first_outputs = [home.view(o).clone() if isinstance(o, TensorArg) else o.value for o in program.outputs]
    executed = executor.launches_executed  # capturing records launches, it does not run them
    mempools = {i: torch.cuda.graph_pool_handle() for i in set(executor.domains)}
    for item in items:
        if isinstance(item, Segment):
            torch.cuda.synchronize(devices[item.device].torch_device)
            g = torch.cuda.CUDAGraph()
            with devices[item.device].guard():
                with torch.cuda.graph(g, pool=mempools[executor.domains[item.device]],
                                      stream=streams[item.device]):
                    for step in item.steps:
                        executor._launch(step, pools, lane)
            item.graph = g
        elif isinstance(item, SyncStep):
            executor._sync(item, lane)
        else:
            executor._copy(item, pools, lane)
    torch.cuda.synchronize()
    executor.launches_executed = executed
    state = GraphState(pools, items, static_inputs, lane=lane)
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
    executor.captures += 1
    log.info("captured %d CUDA graphs (%d copies between them)", sum(isinstance(x, Segment) for x in items),
             sum(isinstance(x, CopyStep) for x in items))
    return state


def _copy_inputs(program: Any, home: BufferPool, inputs: Sequence[Any], static: dict[str, torch.Tensor]) -> None:
    """Copy each INPUT-kind input into its static storage, at the place the recorded view says (the caller's view
    may sit at another storage offset each call)."""
    for spec, value in zip(program.inputs, inputs):
        if isinstance(spec, TensorArg) and spec.buffer in static:
            home.view(spec).copy_(value, non_blocking=True)


def _run_item(executor: Any, item: Any, pools: list[BufferPool], capture: bool, lane: Any = None,
              edges: set | None = None) -> Any:
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
    return executor._copy(item, pools, lane, edges)


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
    else:
        main = executor.streams[executor.home]
        main.wait_stream(torch.cuda.current_stream(executor.devices[executor.home].torch_device))
        with torch.cuda.stream(main):
            for k, static in state.copy_list:
                static.copy_(inputs[k], non_blocking=True)
        for d in state.used_devices:  # every device reads the static inputs only after they are copied in
            if d != executor.home and executor.streams[d] is not main:
                executor.streams[d].wait_stream(main)
    if check_addresses:
        for (i, b), ptr in state.addresses.items():
            if state.pools[i].storages[b].data_ptr() != ptr:
                raise TesseraError(f"buffer {b} on device {i} moved since capture; replay would read stale memory")
    events = []
    executor._edges_this_call = set()
    for item in state.items:
        ev = _run_item(executor, item, state.pools, capture=False)
        if ev is not None:
            events.append((item, ev))
    executor._wait(events, [executor.streams[d] for d in state.used_devices])
    executor.cut_edges_transferred = len(executor._edges_this_call)
    executor.calls += 1
    home = state.pools[executor.home]
    return [home.view(o) if isinstance(o, TensorArg) else o.value for o in program.outputs]


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
