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

#: how static INPUTs (``KernelProgram.static_inputs``) reach the other devices that read them (see
#: :func:`build_schedule`): placed once (``"place"``) or copied every call (``"copy"``)
from torch_tessera.options import STATIC_INPUTS  # noqa: E402  (the home is options)


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
            contents needed on a device other than the caller's, every call), ``"weights"`` (a parameter placed on a
            device, once per executor), ``"static"`` (a static INPUT, ``KernelProgram.static_inputs``: a module
            buffer the caller passes at one address every call, placed once like a weight and placed again only
            when the caller's tensor moved or was modified in place; see :func:`build_schedule`), or ``"gather"``
            (an output's or a state buffer's final bytes back to the caller's device).
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
        setup: copies done once: weights (purpose ``"weights"``) and static INPUTs (``"static"``) onto the devices
            whose launches read them. A ``"static"`` step is run again when the caller's tensor changes.
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
                   domains: Sequence[int] | None = None, state_homes: Mapping[str, int] | None = None,
                   static_inputs: str = "place") -> Schedule:
    """Steps that run ``program`` with each launch on ``placement[launch]``, computing what one device would.

    Device ``home`` holds the caller's tensors, except the STATE buffers named in ``state_homes``, which the caller
    keeps on that device (resident state: a KV cache on the device whose launches write it). Every RAW edge cut by
    the placement becomes one copy of exactly the bytes the consumer needs from the producer; graph inputs are
    copied from where they live to the other devices that read them (weights and static INPUTs once, at setup); the
    final bytes of outputs come back to ``home``, those of state buffers to where each state lives.

    A static INPUT (named in ``program.static_inputs``: Dynamo passes it at the same address every call, e.g. a
    module buffer) is a setup step of purpose ``"static"`` instead of a per-call ``"input"`` copy, over exactly the
    byte spans the per-call copy would have had (the MMDiT's 453 MB ``pos_embed`` would otherwise cross the link
    every call; docs/BENCHMARKS.md, static inputs). The executors place such a step again before a call whose tensor
    for it has another ``data_ptr()`` or ``_version`` than when it was placed. With ``static_inputs="copy"`` static
    INPUTs are per-call ``"input"`` copies like any other input (for callers that write them without bumping
    ``_version``: through ``.data``, numpy or DLPack aliases, custom kernels).

    Args:
        program: the program.
        dag: its dependency DAG (RAW ranges per edge).
        placement: device index of every launch.
        home: the caller's device.
        domains: memory domain of each device (devices in one domain share storages: SM partitions of one GPU);
            default: every device its own. Dependencies within a domain across devices become :class:`SyncStep`.
        state_homes: STATE buffer name -> device index its caller's tensor lives on (default ``home``).
        static_inputs: ``"place"`` (default: static INPUTs are setup steps of purpose ``"static"``) or ``"copy"``
            (per-call ``"input"`` copies); :data:`STATIC_INPUTS`.

    Raises:
        ValueError: a launch has no device in ``placement``, or ``static_inputs`` is not one of
            :data:`STATIC_INPUTS`.
    """
    if static_inputs not in STATIC_INPUTS:
        raise ValueError(f"static_inputs={static_inputs!r} is not one of {STATIC_INPUTS}")
    homes = dict(state_homes or {})
    missing = [l.index for l in program.launches if l.index not in placement]
    if missing:
        raise ValueError(f"placement has no device for launches {missing[:10]}")
    g = dag.graph
    n_dev = max(list(placement.values()) + [home] + list(homes.values())) + 1
    dom = list(domains) if domains is not None else list(range(max(n_dev, home + 1)))
    readers: dict[str, set[int]] = {}
    for k in dag.nodes():
        for b in k.reads:
            readers.setdefault(b, set()).add(placement[k.index])
    setup: list[CopyStep] = []
    per_call: list[Step] = []
    input_names = list(dict.fromkeys(a.buffer for a in program.inputs if isinstance(a, TensorArg)))
    # programs pickled before the field lack it
    static = set(getattr(program, "static_inputs", ())) if static_inputs == "place" else set()
    unwritten = _input_bytes_read(program, dag, placement, dom, input_names)
    for name in input_names:
        buf = program.buffers[name]
        src = homes.get(name, home)
        targets = {min(d for d in readers.get(name, set()) if dom[d] == k) for k in {dom[d] for d in readers.get(name, set())}}
        # a non-parameter input may be bound shifted into a caller's storage (``bind_input``: ``ids[:, t:t + 1]``),
        # which then holds only the bytes its views address, not the storage recorded at lowering: copy only those
        lo, hi = (0, buf.nbytes) if buf.kind == BufferKind.PARAMETER else _input_span(program, name)
        kind = _input_purpose(buf.kind, name in static)
        for dev in sorted(t for t in targets if dom[t] != dom[src]):
            spans = [(0, buf.nbytes)] if kind == "weights" else unwritten.get((name, dom[dev]), [])
            for s, e in spans:
                s, e = max(s, lo), min(e, hi)
                if e > s:
                    (per_call if kind == "input" else setup).append(CopyStep(src, dev, name, s, e, kind))
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
    per_call.extend(_gathers(program, dag, placement, home, dom, homes))
    return Schedule(tuple(setup), tuple(per_call), dict(placement), tuple(cut))


def _input_purpose(kind: BufferKind, static: bool) -> str:
    """Copy purpose of a graph input read on another device: ``"weights"`` (PARAMETER), ``"static"`` (an INPUT in
    ``KernelProgram.static_inputs``) or ``"input"`` (anything else, STATE included: copied every call)."""
    if kind == BufferKind.PARAMETER:
        return "weights"
    return "static" if static and kind == BufferKind.INPUT else "input"


def _input_bytes_read(program: KernelProgram, dag: DependencyGraph, placement: Mapping[int, int],
                      dom: Sequence[int], names: Sequence[str]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """``(input buffer, memory domain) -> byte ranges`` that launches of that domain read before any launch of the
    program wrote them: the graph input's own bytes a device needs. Bytes written earlier in the call reach a
    reader through its RAW edge (a cut copy) or are already there, so copying them in as well would move them
    twice (a KV cache read after the launch that updates it: the whole cache in as input, then again as the cut)."""
    wanted = set(names)
    written: dict[str, list[tuple[int, int]]] = {}
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for launch in program.launches:
        node = dag.node(launch.index)
        d = dom[placement[launch.index]]
        for b, s, e in node.read_ranges:
            if b in wanted:
                out.setdefault((b, d), []).extend(_subtract((s, e), written.get(b, [])))
        for b, s, e in node.write_ranges:
            if b in wanted:
                written[b] = merge_ranges(written.get(b, []) + [(s, e)])
    return {k: merge_ranges(v) for k, v in out.items()}


def _subtract(span: tuple[int, int], ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``span`` minus the merged, sorted ``ranges``."""
    s, e = span
    out = []
    for a, b in ranges:
        if b <= s or a >= e:
            continue
        if a > s:
            out.append((s, a))
        s = max(s, b)
        if s >= e:
            break
    if s < e:
        out.append((s, e))
    return out


def _gathers(program: KernelProgram, dag: DependencyGraph, placement: Mapping[int, int], home: int,
             dom: Sequence[int], state_homes: Mapping[str, int]) -> list[CopyStep]:
    """Copies bringing the last-written bytes of outputs back to ``home`` and of state buffers back to where each
    lives (``state_homes``, default ``home``)."""
    histories: dict[str, StorageHistory] = {}
    for launch in program.launches:
        for b, s, e in dag.node(launch.index).write_ranges:
            h = histories.setdefault(b, StorageHistory(program.buffers[b].nbytes))
            h.write(s, e, launch.index)
    wanted: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for o in program.outputs:
        if isinstance(o, TensorArg):
            wanted.setdefault((o.buffer, home), []).append(o.byte_span)
    for b in program.buffers.values():
        if b.kind == BufferKind.STATE:
            wanted.setdefault((b.name, state_homes.get(b.name, home)), []).append((0, b.nbytes))
    out: list[CopyStep] = []
    sink = -1
    for (name, dst), spans in wanted.items():
        h = histories.get(name)
        if h is None:
            continue
        for s, e in merge_ranges(spans):
            for writer, got in sorted(h.read(s, e, sink).items()):
                if dom[placement[writer]] != dom[dst]:
                    for gs, ge in merge_ranges(got):
                        out.append(CopyStep(placement[writer], dst, name, gs, ge, "gather"))
    return out


def state_owners(program: KernelProgram, dag: DependencyGraph, placement: Mapping[int, int],
                 home: int = 0) -> dict[str, int]:
    """Device index each STATE input of ``program`` belongs on under ``placement``: the device of its writers (the
    scheduler puts every writer of a STATE buffer on one device; with several, the first writer's), else of its
    first reader, else ``home``. Keeping the caller's state there (:meth:`PlacedExecutor.set_state_homes`) means no
    launch copies it in or gathers it back."""
    first_writer: dict[str, int] = {}
    first_reader: dict[str, int] = {}
    for launch in program.launches:
        node = dag.node(launch.index)
        for b in node.writes:
            first_writer.setdefault(b, placement[launch.index])
        for b in node.reads:
            first_reader.setdefault(b, placement[launch.index])
    out: dict[str, int] = {}
    for a in program.inputs:
        if isinstance(a, TensorArg) and program.buffers[a.buffer].kind == BufferKind.STATE:
            out[a.buffer] = first_writer.get(a.buffer, first_reader.get(a.buffer, home))
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

    Issued from Python the copies usually win these races by host latency; inside one CUDA graph they do not
    (docs/BENCHMARKS.md, copy hazards). Buffer-name granularity (conservative).
    """
    steps = schedule.steps
    touched_before: dict[int, set[str]] = {}  # domain -> buffers touched by launches so far
    out: dict[int, tuple[bool, bool]] = {}
    writes_after: dict[int, dict[str, int]] = {}  # domain -> buffer -> count of launches from here on writing it
    for st in steps:
        if isinstance(st, LaunchStep):
            dm = domains[st.device]
            for b in dag.node(st.launch).writes:
                writes_after.setdefault(dm, {}).setdefault(b, 0)
                writes_after[dm][b] += 1
    for i, st in enumerate(steps):
        if isinstance(st, LaunchStep):
            dm = domains[st.device]
            node = dag.node(st.launch)
            touched_before.setdefault(dm, set()).update(node.reads, node.writes)
            for b in node.writes:
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


def launch_layers(dag: DependencyGraph) -> dict[int, int | None]:
    """Repeated layer of each launch: its ``layer`` attribute, or for an unlabelled launch between two labelled ones
    (Inductor fuses a layer's residual add with the next layer's norm) the layer of the nearest labelled launch
    before it; ``None`` before the first labelled launch and after the last (embedding, final norm, head)."""
    nodes = sorted(dag.graph.nodes)
    labelled = [n for n in nodes if dag.node(n).layer is not None]
    out: dict[int, int | None] = {n: None for n in nodes}
    if not labelled:
        return out
    current = None
    for n in nodes:
        if n < labelled[0] or n > labelled[-1]:
            continue
        layer = dag.node(n).layer
        current = layer if layer is not None else current
        out[n] = current
    return out


def cut_edges_per_layer(dag: DependencyGraph, placement: Mapping[int, int]) -> dict[int | None, int]:
    """Cut edges (as :func:`cut_edge_count` counts them) per repeated layer of the consumer launch
    (:func:`launch_layers`; ``None``: outside every layer). Every layer of the program is a key, with 0 when no cut
    edge ends in it."""
    layers = launch_layers(dag)
    out: dict[int | None, int] = {l: 0 for l in sorted({l for l in layers.values() if l is not None})}
    for u, v, d in dag.graph.edges(data=True):
        if "RAW" in d["kinds"] and d["ranges"] and placement[u] != placement[v]:
            out[layers[v]] = out.get(layers[v], 0) + 1
    return out


def device_launches(schedule: Schedule, n_devices: int) -> list[Sequence[int]]:
    """Launch indices per device, in program order."""
    out: list[list[int]] = [[] for _ in range(n_devices)]
    for s in schedule.steps:
        if isinstance(s, LaunchStep):
            out[s.device].append(s.launch)
    return out
