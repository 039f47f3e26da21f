"""Cut edges counted per decoder layer (``runtime.schedule.cut_edges_per_layer``), on a synthetic DAG."""

from __future__ import annotations

import networkx as nx

from torch_tessera.graph.types import DependencyGraph, KernelNode, add_kernel
from torch_tessera.runtime.schedule import cut_edge_count, cut_edges_per_layer, launch_layers


def _dag() -> DependencyGraph:
    """embedding (0) -> layer 0 (1, 2) -> fused residual+norm without a layer (3) -> layer 1 (4, 5) -> head (6);
    one ordering-only edge (WAR) and one RAW edge without bytes, which never count as cuts."""
    g = nx.DiGraph()
    for n, layer in enumerate([None, 0, 0, None, 1, 1, None]):
        add_kernel(g, KernelNode(n, f"k{n}", layer=layer))
    raw = {"kinds": frozenset({"RAW"}), "ranges": (("b", 0, 8),), "bytes": 8}
    for u in range(6):
        g.add_edge(u, u + 1, **raw)
    g.add_edge(1, 5, kinds=frozenset({"WAR"}), ranges=(), bytes=0)
    g.add_edge(2, 4, kinds=frozenset({"RAW"}), ranges=(), bytes=0)
    return DependencyGraph(g, {})


def test_unlabelled_launch_between_layers_joins_the_one_before():
    assert launch_layers(_dag()) == {0: None, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: None}


def test_cuts_counted_by_consumer_layer():
    dag = _dag()
    home = {n: 0 for n in range(7)}
    assert cut_edges_per_layer(dag, home) == {0: 0, 1: 0}
    attention_like = {**home, 2: 1, 5: 1}  # one launch per layer elsewhere: 1->2, 2->3, 4->5, 5->6 cut
    per = cut_edges_per_layer(dag, attention_like)
    assert per == {0: 2, 1: 1, None: 1}
    assert sum(per.values()) == cut_edge_count(dag, attention_like) == 4


def test_program_without_layers():
    g = nx.DiGraph()
    add_kernel(g, KernelNode(0, "k0"))
    add_kernel(g, KernelNode(1, "k1"))
    g.add_edge(0, 1, kinds=frozenset({"RAW"}), ranges=(("b", 0, 4),), bytes=4)
    assert cut_edges_per_layer(DependencyGraph(g, {}), {0: 0, 1: 1}) == {None: 1}
