"""Small hand-built DAGs and an independent scorer (written from the documented model, not from the solver code)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from torch_tessera.lowering.program import BufferKind
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler.synthetic import SynthKernel, _buf, dag_from_kernels

MB = 1_000_000


def random_dag(n: int, seed: int, weight_mb: int = 100, chain: bool = False):
    """``n`` kernels; each reads 1-2 earlier outputs (the previous one only when ``chain``) and its own weight."""
    rng = np.random.default_rng(seed)
    buffers: dict = {}
    ks = []
    outs = []
    for i in range(n):
        ins = []
        if outs:
            if chain:
                ins = [outs[-1]]
            else:
                pick = rng.choice(len(outs), size=min(len(outs), int(rng.integers(1, 3))), replace=False)
                ins = [outs[j] for j in sorted(pick)]
        w = _buf(buffers, f"w{i}", BufferKind.PARAMETER, weight_mb * MB)
        out = _buf(buffers, f"t{i}", BufferKind.TEMP, int(rng.integers(1, 8)) * 1000)
        ks.append(SynthKernel(f"k{i}", "gemm" if i % 2 else "elementwise", ins + [w], [out], 0.0))
        outs.append(out)
    return dag_from_kernels(ks, buffers)


def random_costs(dag, D: int, seed: int) -> CostTable:
    rng = np.random.default_rng(seed + 1000)
    nodes = sorted(dag.graph.nodes)
    return CostTable(tuple(f"d{i}" for i in range(D)), tuple(nodes), rng.uniform(1e-4, 1e-3, (len(nodes), D)))


def topo(D: int, bw: float = 1e7, lat: float = 2e-5) -> Topology:
    """Slow links (10 MB/s): a few-KB edge costs a few hundred microseconds, comparable to the kernels."""
    return Topology.uniform([f"d{i}" for i in range(D)], bw, lat)


def ref_cycle(dag, costs: CostTable, tp: Topology, place: dict[int, int], micro_batches: int = 2) -> float:
    """Cycle time from the documented model: max over devices of summed kernel seconds and over directed links of
    summed ``bytes / bandwidth + micro_batches x latency`` of the RAW edges cut that way."""
    D = len(tp.devices)
    dev = np.zeros(D)
    link = np.zeros((D, D))
    for k in dag.graph.nodes:
        dev[place[k]] += costs.row(k)[place[k]]
    for u, v, d in dag.graph.edges(data=True):
        a, b = place[u], place[v]
        if a != b and "RAW" in d["kinds"] and d["bytes"] > 0:
            link[a, b] += d["bytes"] / tp.bandwidth[a, b] + micro_batches * tp.latency[a, b]
    return float(max(dev.max(), link.max()))


def ref_latency(dag, costs: CostTable, tp: Topology, place: dict[int, int]) -> float:
    """One run, list-scheduled: program order, one kernel at a time per device, a copy starts when its producer
    ends and its link is free and takes latency + bytes / bandwidth."""
    D = len(tp.devices)
    free = [0.0] * D
    link_free = np.zeros((D, D))
    fin = {}
    for k in sorted(dag.graph.nodes):
        d = place[k]
        ready = 0.0
        for u in sorted(dag.graph.predecessors(k)):
            ed = dag.graph.edges[u, k]
            t = fin[u]
            if place[u] != d and "RAW" in ed["kinds"] and ed["bytes"] > 0:
                st = max(t, link_free[place[u], d])
                t = st + tp.latency[place[u], d] + ed["bytes"] / tp.bandwidth[place[u], d]
                link_free[place[u], d] = t
            ready = max(ready, t)
        fin[k] = max(ready, free[d]) + costs.row(k)[d]
        free[d] = fin[k]
    return max(fin.values())


def ref_weights(dag, place: dict[int, int], D: int) -> np.ndarray:
    """PARAMETER bytes per device: each weight on every device where a kernel reading it runs."""
    out = np.zeros(D)
    for name, b in dag.buffers.items():
        if b.kind == BufferKind.PARAMETER:
            on = {place[k.index] for k in dag.nodes() if name in k.reads}
            for g in on:
                out[g] += b.nbytes
    return out


def all_placements(dag, D: int):
    nodes = sorted(dag.graph.nodes)
    for combo in itertools.product(range(D), repeat=len(nodes)):
        yield dict(zip(nodes, combo))



def random_schedules(seed: int):
    """Pipelined schedules of random placements (2 devices; 1-3 micro-batches; two memory domains or one) of a small
    layered DAG and a one-layer transformer: ``(dag, costs, schedule)``, seeded."""
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag

    rng = np.random.default_rng(seed)
    for dag in (layered_dag(10, width=3, seed=2), transformer_dag(1)):
        costs = roofline_costs(dag, ["big", "small"])
        nodes = sorted(dag.graph.nodes)
        for M, domains in itertools.product((1, 2, 3), [(0, 1), (0, 0)]):
            place = dict(zip(nodes, rng.integers(0, 2, len(nodes)).tolist()))
            yield dag, costs, build_pipelined_schedule(dag, place, M, costs=costs, topology=nvlink_topology(["a", "b"]),
                                                       domains=domains)


def fixpoint_step(s, dur, issued: dict | None = None) -> float:
    """Independent reference step of schedule ``s`` given each step's duration ``dur[d][i]`` (seconds): start = max(end
    of the previous step on the stream, the record's end for a wait, ``issued[id(step)]`` when given), end = start +
    duration, iterated to a fixpoint; the latest end."""
    from torch_tessera.scheduler.pipeline_schedule import RecordStep, WaitStep

    rec = {x.event_id: (d, i) for d, st in enumerate(s.streams) for i, x in enumerate(st) if isinstance(x, RecordStep)}
    end = [[0.0] * len(st) for st in s.streams]
    for _ in range(sum(len(st) for st in s.streams) + 1):
        changed = False
        for d, st in enumerate(s.streams):
            for i, x in enumerate(st):
                start = end[d][i - 1] if i else 0.0
                if issued is not None:
                    start = max(start, issued[id(x)])
                if isinstance(x, WaitStep):
                    start = max(start, end[rec[x.event_id][0]][rec[x.event_id][1]])
                e = start + dur[d][i]
                if e != end[d][i]:
                    end[d][i], changed = e, True
        if not changed:
            break
    return max(e[-1] for e in end if e)

@pytest.fixture(autouse=True)
def _no_user_cache(tmp_path, monkeypatch):
    """Never touch ~/.cache from tests."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache-root"))
