"""The dependency DAG: the data type that crosses from ``graph/`` to ``scheduler/`` and ``runtime/``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import networkx as nx

from torch_tessera.lowering.op_class import OP_CLASSES  # noqa: F401 - the DAG's op_class values
from torch_tessera.lowering.program import Buffer


@dataclass(frozen=True)
class DependencyGraph:
    """Kernel-level dependency DAG of one :class:`~torch_tessera.lowering.program.KernelProgram`.

    ``graph`` is a ``networkx.DiGraph`` with one node per launch, keyed by the launch's program index (int).

    Node attributes:
        name (str): kernel name or ATen op.
        kind (str): ``"triton"`` or ``"extern"``.
        op_class (str): one of :data:`OP_CLASSES`.
        layer (int | None): repeated-layer index from provenance.
        reads (frozenset[str]) / writes (frozenset[str]): buffer names read / written.
        read_ranges / write_ranges (tuple[tuple[str, int, int], ...]): the byte ranges ``(buffer, start, end)``
            read / written (half-open, merged per buffer).
        unsure (bool): the access analysis could not prove this launch's accesses; keep it with its neighbours.
        unsure_reason (str): why, when ``unsure``.

    Edge attributes (u precedes v in program order):
        kinds (frozenset[str]): subset of ``{"RAW", "WAR", "WAW"}``.
        bytes (int): bytes v needs from u (RAW overlap); 0 when the edge only orders.
        ranges (tuple[tuple[str, int, int], ...]): the RAW byte ranges ``(buffer, start, end)`` v reads that u wrote.

    Attributes:
        graph: the DAG.
        buffers: every buffer of the program, by name (kind and size are needed for memory planning).
    """

    graph: nx.DiGraph
    buffers: Mapping[str, Buffer]

    @property
    def num_kernels(self) -> int:
        return self.graph.number_of_nodes()

    def raw_edges(self) -> list[tuple[int, int, int]]:
        """``(u, v, bytes)`` for every edge that carries data."""
        return [(u, v, d["bytes"]) for u, v, d in self.graph.edges(data=True) if "RAW" in d["kinds"]]
