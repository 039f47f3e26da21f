"""Mutation test of the order property: a DAG missing any one RAW edge lets through an order that gives a wrong result.

``tests/graph/test_topological_orders.py`` runs the launches of every corpus model in random topological orders of the
dependency DAG and checks each against eager. That check is only worth something if it fails when the DAG misses a
dependency. So, for every RAW edge ``(u, v)`` of every corpus model (the corpus is small enough to take them all, far
above the 50-per-model sample the bigger models would need):

1. Drop the edge (the whole edge: an edge that also carries WAR/WAW ordering loses it too, as it would if the builder
   had missed the dependency altogether).
2. If the mutated DAG still has a path ``u -> ... -> v``, no order of the mutated DAG can run ``v`` before ``u``: the
   edge is *implied* by others and its removal cannot change any result. Those edges are counted separately, not as
   failures.
3. Otherwise build the order that runs ``v`` as early as the mutated DAG allows: ``v``'s ancestors and ``v`` first
   (a topological order of the mutated DAG in which ``v`` precedes ``u``), everything else after.
4. Run it with the executor, fresh allocations filled with NaN bytes, and require that the result (outputs and the
   model's state) differs from eager: ``v`` read bytes ``u`` had not yet written. A run that raises counts as caught
   too (e.g. an index read from poisoned memory).

The test prints the count of RAW edges tested, implied and caught (run with ``-s``) and fails if any non-implied edge
is not caught. On 2026-11-29 (torch 2.13 CPU, Triton interpreter): 65 RAW edges over the 13 models of
``test_topological_orders.MODELS`` (the 11 corpus models, their side-by-side composite, and a temporary with two
unordered readers); 6 implied by another path; 59 of the other 59 caught (57 by a wrong value, 2 by an error raised on
poisoned indices).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import pytest

from tests.graph.test_topological_orders import MODELS, is_topological, lowered, mismatch, run_graphs

RESULTS: dict[str, "EdgeTally"] = {}


@dataclass
class EdgeTally:
    """What happened to the RAW edges of one model."""

    tested: int = 0
    implied: list[tuple[int, int]] = field(default_factory=list)
    caught: list[tuple[int, int, str]] = field(default_factory=list)
    missed: list[tuple[int, int]] = field(default_factory=list)


def consumer_first_order(dag: nx.DiGraph, u: int, v: int) -> list[int] | None:
    """A topological order of ``dag`` without edge ``(u, v)`` that runs ``v`` before ``u``; ``None`` if none exists.

    ``v`` and its ancestors in the mutated DAG come first, then the rest; both parts keep the relative order of one
    topological sort (smallest launch index first), so the result is topological for the mutated DAG.
    """
    mutated = dag.copy()
    mutated.remove_edge(u, v)
    if nx.has_path(mutated, u, v):
        return None
    early = nx.ancestors(mutated, v) | {v}
    base = list(nx.lexicographical_topological_sort(mutated))
    order = [n for n in base if n in early] + [n for n in base if n not in early]
    assert is_topological(mutated, order) and order.index(v) < order.index(u)
    return order


def test_consumer_first_order_on_a_small_dag():
    g = nx.DiGraph([(0, 1), (1, 2), (0, 2), (3, 2)])
    assert consumer_first_order(g, 0, 2) is None  # 0 -> 1 -> 2 still orders them
    order = consumer_first_order(g, 1, 2)
    assert order.index(2) < order.index(1) and order.index(0) < order.index(2) and order.index(3) < order.index(2)
    assert not is_topological(g, order)


@pytest.mark.parametrize("name", list(MODELS))
def test_dropping_any_raw_edge_is_caught(name):
    model = lowered(name)
    tally = RESULTS.setdefault(name, EdgeTally())
    for i, graph in enumerate(model.graphs):
        for u, v, _ in graph.dag.raw_edges():
            tally.tested += 1
            order = consumer_first_order(graph.dag.graph, u, v)
            if order is None:
                tally.implied.append((u, v))
                continue
            orders = [None] * len(model.graphs)
            orders[i] = order
            try:
                got, state = run_graphs(model, orders)
                problem = mismatch(model, got, state)
            except Exception as e:  # noqa: BLE001 - a run that fails on poisoned data caught the missing edge
                problem = f"raised {type(e).__name__}"
            if problem is None:
                tally.missed.append((u, v))
            else:
                tally.caught.append((u, v, problem))
    launches = {(u, v): (graph.program.launches[u], graph.program.launches[v]) for graph in model.graphs
                for u, v in tally.missed}
    assert not tally.missed, f"{name}: dropping these RAW edges went unnoticed: {launches}"


def test_report_mutation_counts():
    if not RESULTS:
        pytest.skip("no model ran")
    tested = sum(t.tested for t in RESULTS.values())
    implied = sum(len(t.implied) for t in RESULTS.values())
    caught = sum(len(t.caught) for t in RESULTS.values())
    print(f"\nRAW-edge mutation: {tested} edges over {len(RESULTS)} models; {implied} implied by another path "
          f"(cannot change a result); {caught}/{tested - implied} of the rest caught")
    for name, t in RESULTS.items():
        print(f"  {name}: {t.tested} RAW edges, {len(t.implied)} implied, {len(t.caught)} caught, "
              f"{len(t.missed)} missed; {sorted({c[2].split(':')[0][:40] for c in t.caught})}")
    assert caught == tested - implied
