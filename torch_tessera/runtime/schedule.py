"""Turn a placement into the runtime's step list: launches, and the copies that cut edges need.

The runtime is a loop over small typed steps (STYLE.md 10). Each step carries its bytes, so a trace can print the
achieved GB/s of every transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from torch_tessera.graph.ranges import StorageHistory, merge_ranges
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import BufferKind, KernelProgram, TensorArg


@dataclass(frozen=True)
class LaunchStep:
    """Run launch ``launch`` (program index) on device ``device`` (index into the executor's devices)."""

    launch: int
    device: int


@dataclass(frozen=True)
class CopyStep:
    """Copy bytes ``[start, end)`` of ``buffer`` from device ``src`` to device ``dst``.

    Attributes:
        purpose: ``"cut"`` (a RAW edge whose ends are on different devices), ``"input"`` (a graph input's initial
            contents needed on a device other than the caller's), ``"weights"`` (a parameter placed on a device, once
            per executor), or ``"gather"`` (an output's or a state buffer's final bytes back to the caller's device).
        edge: the DAG edge ``(producer, consumer)`` for a cut.
    """

    src: int
    dst: int
    buffer: str
    start: int
    end: int
    purpose: str
    edge: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SyncStep:
    """Make device ``dst``'s stream wait for everything queued so far on device ``src``'s stream.

    Used instead of a copy when both devices share memory (SM partitions of one GPU): the consumer reads the
    producer's bytes in place, so every dependency that crosses the two devices (RAW, WAR and WAW) is an event wait.
    """

    src: int
    dst: int
    edge: tuple[int, int]


Step = LaunchStep | CopyStep | SyncStep


@dataclass(frozen=True)
class Schedule:
    """What the executor does per call, in order.

    Attributes:
        setup: copies done once (weights onto the devices whose launches read them).
        steps: per call: input copies, then launches with the cut-edge copies before their consumers, then gathers.
        placement: launch index -> device index.
        cut_edges: the RAW edges whose ends are on different devices (each gets exactly one copy step per range).
    """

    setup: tuple[CopyStep, ...]
    steps: tuple[Step, ...]
    placement: Mapping[int, int]
    cut_edges: tuple[tuple[int, int], ...]

    def copies(self, purpose: str) -> list[CopyStep]:
        return [s for s in self.steps if isinstance(s, CopyStep) and s.purpose == purpose]


def _input_span(program: KernelProgram, name: str) -> tuple[int, int]:
    """Bytes ``[start, end)`` of buffer ``name`` that the program's graph inputs over it address."""
    spans = [a.byte_span for a in program.inputs if isinstance(a, TensorArg) and a.buffer == name]
    return min(s for s, _ in spans), max(e for _, e in spans)


def build_schedule(program: KernelProgram, dag: DependencyGraph, placement: Mapping[int, int], home: int = 0,
                   domains: Sequence[int] | None = None) -> Schedule:
    """Steps that run ``program`` with each launch on ``placement[launch]``, computing what one device would.

    Device ``home`` holds the caller's tensors. Every RAW edge cut by the placement becomes one copy of exactly the
    bytes the consumer needs from the producer; graph inputs are copied to the other devices that read them (weights
    once, at setup); the final bytes of outputs and of state buffers come back to ``home``.

    Args:
        program: the program.
        dag: its dependency DAG (RAW ranges per edge).
        placement: device index of every launch.
        home: the caller's device.
        domains: memory domain of each device (devices in one domain share storages: SM partitions of one GPU);
            default: every device its own. Dependencies within a domain across devices become :class:`SyncStep`.

    Raises:
        ValueError: a launch has no device in ``placement``.
    """
    missing = [l.index for l in program.launches if l.index not in placement]
    if missing:
        raise ValueError(f"placement has no device for launches {missing[:10]}")
    g = dag.graph
    n_dev = max(list(placement.values()) + [home]) + 1
    dom = list(domains) if domains is not None else list(range(max(n_dev, home + 1)))
    readers: dict[str, set[int]] = {}
    for n, d in g.nodes(data=True):
        for b in d["reads"]:
            readers.setdefault(b, set()).add(placement[n])
    setup: list[CopyStep] = []
    per_call: list[Step] = []
    for name in dict.fromkeys(a.buffer for a in program.inputs if isinstance(a, TensorArg)):
        buf = program.buffers[name]
        targets = {min(d for d in readers.get(name, set()) if dom[d] == k) for k in {dom[d] for d in readers.get(name, set())}}
        # a non-parameter input may be bound shifted into a caller's storage (``bind_input``: ``ids[:, t:t + 1]``),
        # which then holds only the bytes its views address, not the storage recorded at lowering: copy those
        start, end = (0, buf.nbytes) if buf.kind == BufferKind.PARAMETER else _input_span(program, name)
        for dev in sorted(t for t in targets if dom[t] != dom[home]):
            step = CopyStep(home, dev, name, start, end, "weights" if buf.kind == BufferKind.PARAMETER else "input")
            (setup if buf.kind == BufferKind.PARAMETER else per_call).append(step)
    cut: list[tuple[int, int]] = []
    for launch in program.launches:
        v = launch.index
        for u in sorted(g.predecessors(v)):
            d = g.edges[u, v]
            pu, pv = placement[u], placement[v]
            if pu == pv:
                continue
            if dom[pu] == dom[pv]:
                per_call.append(SyncStep(pu, pv, (u, v)))
                if "RAW" in d["kinds"] and d["ranges"]:
                    cut.append((u, v))
            elif "RAW" in d["kinds"] and d["ranges"]:
                cut.append((u, v))
                for b, s, e in d["ranges"]:
                    per_call.append(CopyStep(pu, pv, b, s, e, "cut", (u, v)))
        per_call.append(LaunchStep(v, placement[v]))
    per_call.extend(_gathers(program, dag, placement, home, dom))
    return Schedule(tuple(setup), tuple(per_call), dict(placement), tuple(cut))


def _gathers(program: KernelProgram, dag: DependencyGraph, placement: Mapping[int, int], home: int,
             dom: Sequence[int]) -> list[CopyStep]:
    """Copies bringing the last-written bytes of outputs and state buffers back to ``home``."""
    histories: dict[str, StorageHistory] = {}
    for launch in program.launches:
        for b, s, e in dag.graph.nodes[launch.index]["write_ranges"]:
            h = histories.setdefault(b, StorageHistory(program.buffers[b].nbytes))
            h.write(s, e, launch.index)
    wanted: dict[str, list[tuple[int, int]]] = {}
    for o in program.outputs:
        if isinstance(o, TensorArg):
            wanted.setdefault(o.buffer, []).append(o.byte_span)
    for b in program.buffers.values():
        if b.kind == BufferKind.STATE:
            wanted.setdefault(b.name, []).append((0, b.nbytes))
    out: list[CopyStep] = []
    sink = -1
    for name, spans in wanted.items():
        h = histories.get(name)
        if h is None:
            continue
        for s, e in merge_ranges(spans):
            for writer, got in sorted(h.read(s, e, sink).items()):
                if dom[placement[writer]] != dom[home]:
                    for gs, ge in merge_ranges(got):
                        out.append(CopyStep(placement[writer], home, name, gs, ge, "gather"))
    return out


def copy_hazards(schedule: Schedule, dag: DependencyGraph, domains: Sequence[int]) -> dict[int, tuple[bool, bool]]:
    """For each copy step (by its index in ``schedule.steps``): ``(wait_for_dst, src_waits_for_copy)``.

    A copy runs on its own stream, so besides the producer it must be ordered against two hazards the DAG does not
    see (its edges join launches, and each device keeps its own storage of a buffer):

    * WAR/WAW on the destination: an earlier launch in the destination's memory domain touched the buffer (it may
      still be reading an older version that this copy overwrites, e.g. an Inductor buffer reused for a later
      tensor) -> the copy waits for the destination's stream.
    * WAR on the source: a later launch in the source's domain writes the buffer (a reused buffer overwritten while
      the copy still reads it) -> the source's stream waits for the copy before going on.

    Issued from Python the copies usually won these races by host latency; inside one CUDA graph they do not
    (seen 2026-11-29 on two H200s: a random placement replayed as one graph gave cosine 0.84 until these waits).
    Buffer-name granularity (conservative).
    """
    g = dag.graph
    steps = schedule.steps
    touched_before: dict[int, set[str]] = {}  # domain -> buffers touched by launches so far
    out: dict[int, tuple[bool, bool]] = {}
    writes_after: dict[int, dict[str, int]] = {}  # domain -> buffer -> count of launches from here on writing it
    for st in steps:
        if isinstance(st, LaunchStep):
            dm = domains[st.device]
            for b in g.nodes[st.launch]["writes"]:
                writes_after.setdefault(dm, {}).setdefault(b, 0)
                writes_after[dm][b] += 1
    for i, st in enumerate(steps):
        if isinstance(st, LaunchStep):
            dm = domains[st.device]
            node = g.nodes[st.launch]
            touched_before.setdefault(dm, set()).update(node["reads"], node["writes"])
            for b in node["writes"]:
                writes_after[dm][b] -= 1
        elif isinstance(st, CopyStep):
            out[i] = (st.buffer in touched_before.get(domains[st.dst], ()),
                      writes_after.get(domains[st.src], {}).get(st.buffer, 0) > 0)
    return out


def cut_edge_count(dag: DependencyGraph, placement: Mapping[int, int]) -> int:
    """Number of RAW edges (carrying bytes) whose ends are placed on different devices."""
    return sum(
        1 for u, v, d in dag.graph.edges(data=True)
        if "RAW" in d["kinds"] and d["ranges"] and placement[u] != placement[v]
    )


def device_launches(schedule: Schedule, n_devices: int) -> list[Sequence[int]]:
    """Launch indices per device, in program order."""
    out: list[list[int]] = [[] for _ in range(n_devices)]
    for s in schedule.steps:
        if isinstance(s, LaunchStep):
            out[s.device].append(s.launch)
    return out
