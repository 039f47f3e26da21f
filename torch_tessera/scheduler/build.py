"""Turn a kernel placement into a :class:`~torch_tessera.scheduler.types.Plan`, scored by :mod:`evaluate`."""

from __future__ import annotations

import numpy as np

from torch_tessera.scheduler.evaluate import holder_entries, latency_seconds, loads, memory, resident_on
from torch_tessera.scheduler.problem import Problem
from torch_tessera.scheduler.types import CutEdge, Plan, SolverInfo


def make_plan(pb: Problem, place: np.ndarray, *, policy: str, objective: str, lower_bound: float,
              solver: SolverInfo, micro_batches: int | None = None, replicas: tuple[int, ...] = (),
              cycle: float | None = None, latency: float | None = None, mem: dict | None = None) -> Plan:
    """Assemble a plan; ``cycle``/``latency``/``mem`` override the scores (used by ``request-dist``, whose every
    replica device is busy for the whole cycle)."""
    place = np.asarray(place, dtype=np.int64)
    dev, link = loads(pb, place)
    cyc = float(max(dev.max(), link.max())) if cycle is None else cycle  # = cycle_seconds(pb, place)
    hop = ()
    if pb.charges_devices and not replicas:  # what the cut edges charge each device (dev less its kernels)
        kernels = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=pb.D)
        hop = tuple(float(x) for x in np.maximum(dev - kernels, 0.0))
    if replicas:
        dev = np.array([cycle if g in replicas else 0.0 for g in range(pb.D)])
    lat = latency_seconds(pb, place) if latency is None else latency
    mem = mem or memory(pb, place)
    placements = {}
    orders = {}
    for p, name in enumerate(pb.programs):
        ks = pb.program_slice(p)
        launch, where = pb.launch[ks], place[ks]
        placements[name] = dict(zip(launch.tolist(), where.tolist()))
        orders[name] = tuple(tuple(launch[where == g].tolist()) for g in range(pb.D))
    cut = np.flatnonzero((place[pb.esrc] != place[pb.edst]) & (pb.ebytes > 0))
    s_, t_ = pb.esrc[cut], pb.edst[cut]
    progs, launch, pl = pb.prog.tolist(), pb.launch.tolist(), place.tolist()
    cuts = [CutEdge(program=pb.programs[progs[s]], src=launch[s], dst=launch[t], src_device=pl[s], dst_device=pl[t],
                    nbytes=int(nb), ranges=tuple(tuple(r) for r in pb.eranges[e]), kind=pb.ekind[e],
                    dst_program=pb.programs[progs[t]])
            for e, s, t, nb in zip(cut.tolist(), s_.tolist(), t_.tolist(), pb.ebytes[cut].tolist())]
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
        frequencies={name: float(f) for name, f in zip(pb.programs, pb.freq)}, hop_seconds=hop,
        memory_pools=_pools_held(pb, place))


def _pools_held(pb: Problem, place: np.ndarray) -> tuple[tuple[str, tuple[int, ...], int, int], ...]:
    """:attr:`Plan.memory_pools` of ``place``: per pool its name, members, bytes held together and budget."""
    if not len(pb.pool_budgets):
        return ()
    on = (np.bincount(place, minlength=pb.D) > 0)[None]
    held = pb.pool_bytes(resident_on(pb, place[None]), holder_entries(pb)[2], on)[0]
    return tuple((name, tuple(np.flatnonzero(m).tolist()), int(h), int(c))
                 for name, m, h, c in zip(pb.pool_names, pb.pools, held, pb.pool_budgets))
