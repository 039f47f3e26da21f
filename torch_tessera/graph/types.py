"""The dependency DAG: the data type that crosses from ``graph/`` to ``scheduler/`` and ``runtime/``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import networkx as nx

from torch_tessera.lowering.op_class import OP_CLASSES  # noqa: F401 - the DAG's op_class values
from torch_tessera.lowering.program import Buffer

#: The networkx node attribute that holds a node's :class:`KernelNode`.
NODE_KEY = "kernel"

#: A byte range ``(buffer name, start, end)``: half-open, in bytes from the start of the buffer's storage.
ByteRange = tuple[str, int, int]


@dataclass(frozen=True)
class KernelNode:
    """What one launch of a program reads and writes: the record stored on each DAG node.

    Attributes:
        index: the launch's index in its program (the node key).
        name: kernel name (Triton) or ATen op (extern).
        kind: ``"triton"`` or ``"extern"``.
        op_class: one of :data:`OP_CLASSES`.
        layer: repeated-layer index from provenance, ``None`` outside the repeated layers.
        read_ranges / write_ranges: the byte ranges read / written, sorted by buffer, merged per buffer.
        unsure: the access analysis could not prove this launch's accesses; keep it with its neighbours.
        unsure_reason: why, when ``unsure`` (``""`` otherwise).
    """

    index: int
    name: str
    kind: str = "triton"
    op_class: str = "other"
    layer: int | None = None
    read_ranges: tuple[ByteRange, ...] = ()
    write_ranges: tuple[ByteRange, ...] = ()
    unsure: bool = False
    unsure_reason: str = ""

    @cached_property
    def reads(self) -> frozenset[str]:
        """Names of the buffers read (derived from :attr:`read_ranges`)."""
        return frozenset(b for b, _, _ in self.read_ranges)

    @cached_property
    def writes(self) -> frozenset[str]:
        """Names of the buffers written (derived from :attr:`write_ranges`)."""
        return frozenset(b for b, _, _ in self.write_ranges)

    @property
    def touched_bytes(self) -> int:
        """Bytes read plus bytes written (a byte both read and written counts twice)."""
        return sum(e - s for _, s, e in self.read_ranges) + sum(e - s for _, s, e in self.write_ranges)


def add_kernel(g: nx.DiGraph, node: KernelNode) -> None:
    """Add ``node`` to ``g`` under its index, or replace the record of an existing node (edges kept)."""
    g.add_node(node.index, **{NODE_KEY: node})


@dataclass(frozen=True)
class DependencyGraph:
    """Kernel-level dependency DAG of one :class:`~torch_tessera.lowering.program.KernelProgram`.

    ``graph`` is a ``networkx.DiGraph`` with one node per launch, keyed by the launch's program index (int). Each
    node holds its :class:`KernelNode` under :data:`NODE_KEY`; read it with :meth:`node` or :meth:`nodes`, and add
    one with :func:`add_kernel`. (Synthetic DAGs of :mod:`torch_tessera.scheduler.synthetic` add ``flop`` beside it.)

    Edge attributes (``u`` precedes ``v`` in program order), a plain dict per edge:
        kinds (frozenset[str]): subset of ``{"RAW", "WAR", "WAW"}``.
        bytes (int): bytes ``v`` needs from ``u`` (RAW overlap); 0 when the edge only orders.
        ranges (tuple[ByteRange, ...]): the RAW byte ranges ``v`` reads that ``u`` wrote.

    Attributes:
        graph: the DAG.
        buffers: every buffer of the program, by name (kind and size are needed for memory planning).
    """

    graph: nx.DiGraph
    buffers: Mapping[str, Buffer]

    @property
    def num_kernels(self) -> int:
        return self.graph.number_of_nodes()

    def node(self, index: int) -> KernelNode:
        """The record of launch ``index``.

        Raises:
            KeyError: no launch ``index`` in the DAG, or its node carries no :class:`KernelNode`.
        """
        if index not in self.graph:
            raise KeyError(f"launch {index} is not a kernel node of this DAG ({self.num_kernels} nodes)")
        try:
            return self.graph.nodes[index][NODE_KEY]
        except KeyError:
            raise KeyError(f"DAG node {index} holds no KernelNode (add nodes with graph.types.add_kernel; a DAG "
                           f"pickled by an older torch_tessera must be built again)") from None

    def nodes(self) -> list[KernelNode]:
        """Every launch's record, in program order (ascending index)."""
        return [self.node(i) for i in sorted(self.graph.nodes)]

    def raw_edges(self) -> list[tuple[int, int, int]]:
        """``(u, v, bytes)`` for every edge that carries data."""
        return [(u, v, d["bytes"]) for u, v, d in self.graph.edges(data=True) if "RAW" in d["kinds"]]
