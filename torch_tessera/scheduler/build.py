"""Turn a kernel placement into a :class:`~torch_tessera.scheduler.types.Plan`, scored by :mod:`evaluate`."""

from __future__ import annotations

import numpy as np

from torch_tessera.scheduler.evaluate import cycle_seconds, latency_seconds, loads, memory
from torch_tessera.scheduler.problem import Problem
from torch_tessera.scheduler.types import CutEdge, Plan, SolverInfo


def make_plan(pb: Problem, place: np.ndarray, *, policy: str, objective: str, lower_bound: float,
              solver: SolverInfo, micro_batches: int | None = None, replicas: tuple[int, ...] = (),
              cycle: float | None = None, latency: float | None = None, mem: dict | None = None) -> Plan:
    """Assemble a plan; ``cycle``/``latency``/``mem`` override the scores (used by ``request-dist``, whose every
    replica device is busy for the whole cycle)."""
    place = np.asarray(place, dtype=np.int64)
    dev, link = loads(pb, place)
    if replicas:
        dev = np.array([cycle if g in replicas else 0.0 for g in range(pb.D)])
    cyc = cycle_seconds(pb, place) if cycle is None else cycle
    lat = latency_seconds(pb, place) if latency is None else latency
    mem = mem or memory(pb, place)
    placements = {}
    orders = {}
    for p, name in enumerate(pb.programs):
        ks = pb.program_slice(p)
        placements[name] = {int(pb.launch[k]): int(place[k]) for k in ks}
        orders[name] = tuple(tuple(int(pb.launch[k]) for k in ks[place[ks] == g]) for g in range(pb.D))
    cuts = []
    for e in np.flatnonzero((place[pb.esrc] != place[pb.edst]) & (pb.ebytes > 0)).tolist():
        s, t = int(pb.esrc[e]), int(pb.edst[e])
        cuts.append(CutEdge(program=pb.programs[pb.prog[s]], src=int(pb.launch[s]), dst=int(pb.launch[t]),
                            src_device=int(place[s]), dst_device=int(place[t]), nbytes=int(pb.ebytes[e]),
                            ranges=tuple(tuple(r) for r in pb.eranges[e]), kind=pb.ekind[e],
                            dst_program=pb.programs[pb.prog[t]]))
    value = cyc if objective == "cycle" else lat
    return Plan(
        policy=policy, devices=pb.devices, placements=placements, cut_edges=tuple(cuts), orders=orders,
        micro_batches=int(micro_batches if micro_batches is not None else pb.micro_batches), objective=objective,
        predicted_seconds=float(value), lower_bound_seconds=float(min(lower_bound, value)),
        cycle_seconds=float(cyc), latency_seconds=float(lat),
        device_seconds=tuple(float(x) for x in dev),
        link_seconds=tuple(((int(a), int(b)), float(link[a, b])) for a, b in zip(*np.nonzero(link))),
        memory_bytes=tuple(int(x) for x in mem["total"]), weight_bytes=tuple(int(x) for x in mem["weight"]),
        state_bytes=tuple(int(x) for x in mem["state"]), activation_bytes=tuple(int(x) for x in mem["activation"]),
        memory_budgets=tuple(None if np.isinf(b) else int(b) for b in pb.budgets),
        weights=tuple(tuple(w) for w in mem["weights"]), solver=solver, replicas=tuple(replicas),
        frequencies={name: float(f) for name, f in zip(pb.programs, pb.freq)})
