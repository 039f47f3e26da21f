"""Build the kernel dependency DAG of a program from per-launch byte ranges read and written.

Per launch, the bytes it reads and writes come from the PTX access summary of its kernel (Triton) or from the op
schema (extern). Walking launches in program order over a :class:`~torch_tessera.graph.ranges.StorageHistory` per
storage gives RAW edges (with the bytes the consumer needs from the producer), WAW and WAR edges (ordering only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

import networkx as nx
from torch.utils._pytree import tree_flatten

from torch_tessera.graph.op_class import op_class
from torch_tessera.graph.ranges import StorageHistory, merge_ranges, view_byte_ranges
from torch_tessera.graph.types import NODE_KEY, DependencyGraph, KernelNode, add_kernel
from torch_tessera.lowering.program import ExternLaunch, KernelProgram, TensorArg, TritonLaunch
from torch_tessera.ptx.types import KernelAccess

log = logging.getLogger(__name__)


@dataclass
class LaunchAccess:
    """Byte ranges one launch reads and writes, per buffer (half-open, merged).

    Attributes:
        reads / writes: buffer name -> sorted disjoint ``(start, end)`` byte ranges.
        unsure: the ranges may miss accesses.
        unsure_reason: why.
    """

    reads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    writes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    unsure: bool = False
    unsure_reason: str = ""

    def add(self, arg: TensorArg, read: bool, write: bool, extent: tuple[int, int] | None = None) -> None:
        """Record the bytes of view ``arg`` as read and/or written.

        The exact bytes of the view are used when it has few enough contiguous runs. Otherwise only its envelope is
        known; a write over an envelope is recorded as read-modify-write of the envelope, because recording it as a
        plain write would make it the last writer of bytes it skips (between its strided runs) and lose the earlier
        writer's bytes when the launch runs on another device.
        """
        start, end = arg.byte_span
        exact = view_byte_ranges(arg.offset, arg.size, arg.stride, arg.itemsize)
        if extent is not None:  # affine extent relative to the view's first byte, clipped to the view
            start, end = max(start, start + extent[0]), min(end, arg.offset * arg.itemsize + extent[1])
            if exact is not None:
                exact = [(max(s, start), min(e, end)) for s, e in exact if min(e, end) > max(s, start)]
        ranges = exact if exact is not None else [(start, end)]
        if read or (write and exact is None):
            self.reads.setdefault(arg.buffer, []).extend(ranges)
        if write:
            self.writes.setdefault(arg.buffer, []).extend(ranges)

    def merged(self) -> "LaunchAccess":
        return LaunchAccess({b: merge_ranges(r) for b, r in self.reads.items()},
                            {b: merge_ranges(r) for b, r in self.writes.items()}, self.unsure, self.unsure_reason)


def triton_access(launch: TritonLaunch, access: KernelAccess | None) -> LaunchAccess:
    """Ranges of a Triton launch: each tensor argument by its parameter's PTX access mode.

    Without a summary (or for a parameter it lacks), Inductor's parameter roles are used (``in_ptr`` read, ``out_ptr``
    written, ``in_out_ptr`` both) and the launch is marked unsure. A parameter Inductor declares mutated is always
    treated as written. A data-dependent write (scatter) also reads the view: it may leave bytes untouched.
    """
    out = LaunchAccess()
    by_name = access.by_name if access is not None else {}
    if access is None:
        out.unsure, out.unsure_reason = True, f"no PTX access summary for kernel {launch.kernel}"
    elif access.unsure:
        out.unsure, out.unsure_reason = True, access.unsure_reason
    for name, arg in launch.tensor_args.items():
        p = by_name.get(name)
        if p is None:
            read = not name.startswith("out_ptr")
            write = name.startswith(("out_ptr", "in_out_ptr")) or name in launch.mutated
            if access is not None:
                out.unsure, out.unsure_reason = True, f"parameter {name} of {launch.kernel} has no access summary"
            out.add(arg, read, write)
            continue
        write = p.mode.writes or name in launch.mutated
        if name in launch.mutated and not p.mode.writes and not _written_through_another(launch, by_name, name):
            log.warning("launch %d (%s): Inductor declares %s mutated but its PTX never writes it; keeping it as "
                        "written", launch.index, launch.kernel, name)
        # A data-dependent write (scatter, index_put) may leave bytes of the view untouched: treat it as
        # read-modify-write of the view, so the bytes written before it still reach it and flow on from it.
        read = p.mode.reads or (write and p.data_dependent)
        out.add(arg, read, write, p.extent)
    return out.merged()


def _written_through_another(launch: TritonLaunch, by_name: Mapping[str, Any], name: str) -> bool:
    """Whether another parameter of ``launch`` bound to the same buffer is written (``x.add_(1)`` compiles to a kernel
    reading ``in_ptr0`` and storing ``out_ptr0``, both ``x``; Inductor declares ``in_ptr0`` mutated)."""
    buffer = launch.tensor_args[name].buffer
    return any(a.buffer == buffer and n != name and n in by_name and by_name[n].mode.writes
               for n, a in launch.tensor_args.items())


def extern_access(launch: ExternLaunch) -> LaunchAccess:
    """Ranges of an extern launch from its op schema: arguments with a write alias annotation (``Tensor(a!)``) are
    written (``out=``-style keyword-only ones are write-only, the others read-write), every other tensor argument is
    read, and :attr:`ExternLaunch.outputs` are fresh writes."""
    out = LaunchAccess()
    try:
        arguments = launch.overload._schema.arguments
    except (AttributeError, RuntimeError) as e:
        arguments = []
        out.unsure, out.unsure_reason = True, f"op {launch.op} has no schema here ({e}); all its args treated as RW"
    seen: set[int] = set()
    for i, a in enumerate(arguments):
        value = launch.args[i] if i < len(launch.args) and not a.kwarg_only else launch.kwargs.get(a.name)
        leaves, _ = tree_flatten(value)
        written = a.name in launch.writes
        for leaf in leaves:
            if isinstance(leaf, TensorArg):
                seen.add(id(leaf))
                out.add(leaf, read=not (written and a.kwarg_only), write=written)
    leftovers, _ = tree_flatten((launch.args, dict(launch.kwargs)))
    for leaf in leftovers:  # arguments the schema did not place (varargs, or no schema): read, and RW when unsure
        if isinstance(leaf, TensorArg) and id(leaf) not in seen:
            out.add(leaf, read=True, write=out.unsure)
    for t in launch.outputs:
        out.add(t, read=False, write=True)
    return out.merged()


def _add_edge(g: nx.DiGraph, u: int, v: int, kind: str, ranges: tuple = ()) -> None:
    if g.has_edge(u, v):
        d = g.edges[u, v]
        d["kinds"] = d["kinds"] | {kind}
        d["ranges"] = d["ranges"] + ranges
        d["bytes"] += sum(e - s for _, s, e in ranges)
    else:
        g.add_edge(u, v, kinds=frozenset({kind}), ranges=ranges, bytes=sum(e - s for _, s, e in ranges))


def build(program: KernelProgram, accesses: Mapping[str, KernelAccess]) -> DependencyGraph:
    """See :func:`torch_tessera.graph.build_dependency_graph`."""
    g = nx.DiGraph()
    histories: dict[str, StorageHistory] = {}

    def history(buffer: str) -> StorageHistory:
        if buffer not in histories:
            b = program.buffers.get(buffer)
            histories[buffer] = StorageHistory(b.nbytes if b is not None else 0)
        return histories[buffer]

    for launch in program.launches:
        acc = triton_access(launch, accesses.get(launch.kernel)) if isinstance(launch, TritonLaunch) \
            else extern_access(launch)
        v = launch.index
        add_kernel(g, KernelNode(index=v, name=launch.kernel if isinstance(launch, TritonLaunch) else launch.op,
                                 kind=launch.kind, op_class=op_class(launch), layer=launch.provenance.layer,
                                 read_ranges=_flat(acc.reads), write_ranges=_flat(acc.writes), unsure=acc.unsure,
                                 unsure_reason=acc.unsure_reason))
        for buffer, ranges in acc.reads.items():
            h = history(buffer)
            for start, end in ranges:
                for u, got in h.read(start, end, v).items():
                    _add_edge(g, u, v, "RAW", tuple((buffer, s, e) for s, e in merge_ranges(got)))
        for buffer, ranges in acc.writes.items():
            h = history(buffer)
            for start, end in ranges:
                waw, war = h.write(start, end, v)
                for u in waw:
                    _add_edge(g, u, v, "WAW")
                for u in war:
                    _add_edge(g, u, v, "WAR")
    counts = {k: sum(k in d["kinds"] for *_, d in g.edges(data=True)) for k in ("RAW", "WAR", "WAW")}
    log.info("dependency graph: %d launches, %d edges (%s), %d unsure", g.number_of_nodes(), g.number_of_edges(),
             ", ".join(f"{n} {k}" for k, n in counts.items()), sum(d[NODE_KEY].unsure for _, d in g.nodes(data=True)))
    return DependencyGraph(graph=g, buffers=dict(program.buffers))


def _flat(ranges: Mapping[str, list[tuple[int, int]]]) -> tuple[tuple[str, int, int], ...]:
    return tuple((b, s, e) for b, rs in sorted(ranges.items()) for s, e in rs)


def launch_access(launch: Any, accesses: Mapping[str, KernelAccess]) -> LaunchAccess:
    """Byte ranges of any launch (Triton or extern)."""
    if isinstance(launch, TritonLaunch):
        return triton_access(launch, accesses.get(launch.kernel))
    return extern_access(launch)
