"""Score a placement: pipeline cycle time, one request's latency, and per-device memory.

Every plan, found by a solver or fixed by a baseline, is scored by these functions, so predicted times are comparable.

Cycle time (throughput policies). With enough micro-batches in flight, compute and copies overlap, and a workload
step takes ``max(max_g load_g, max_(a,b) link_ab)`` where ``load_g`` sums ``frequency x seconds`` of the kernels on
``g`` and ``link_ab`` sums ``frequency x (bytes / bandwidth_ab + micro_batches x latency_ab)`` over edges cut
``a -> b`` (each micro-batch pays the per-hop latency; Tessera paper §III-C, "min-max GPU load and link load").

Latency (latency policy). Each program is list-scheduled once: kernels in program order, each device runs one
kernel at a time, a cut edge's copy starts when its producer ends and its link is free and takes ``latency + bytes /
bandwidth``. A request's latency is ``sum_p frequency_p x makespan_p`` plus the STATE hand-overs between programs.
"""

from __future__ import annotations

import numpy as np

from torch_tessera.scheduler.problem import Problem


def link_coef(pb: Problem) -> np.ndarray:
    """``pb.link_coef()``, computed once per problem."""
    c = getattr(pb, "_coef", None)
    if c is None:
        c = pb.link_coef()
        pb._coef = c
    return c


def loads(pb: Problem, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-device compute load ``[D]`` and per-link transfer load ``[D, D]`` (seconds per workload step)."""
    D = pb.D
    wc = pb.wcost
    dev = np.bincount(place, weights=wc[np.arange(pb.n), place], minlength=D).astype(np.float64)
    link = np.zeros((D, D))
    a, b = place[pb.esrc], place[pb.edst]
    cut = (a != b) & (pb.ewbytes > 0)
    if cut.any():
        coef = link_coef(pb)
        np.add.at(link, (a[cut], b[cut]), coef[np.flatnonzero(cut), a[cut], b[cut]])
    return dev, link


def cycle_seconds(pb: Problem, place: np.ndarray) -> float:
    dev, link = loads(pb, place)
    return float(max(dev.max(), link.max()))


def _preds(pb: Problem) -> list[list[int]]:
    p = getattr(pb, "_preds", None)
    if p is None:
        p = [[] for _ in range(pb.n)]
        for e, (s, t) in enumerate(zip(pb.esrc.tolist(), pb.edst.tolist())):
            if pb.ekind[e] != "STATE":
                p[t].append(e)
        pb._preds = p
    return p


def makespans(pb: Problem, place: np.ndarray) -> np.ndarray:
    """Makespan of one run of each program (seconds), list-scheduled as in the module docstring."""
    preds = _preds(pb)
    finish = np.zeros(pb.n)
    esrc, ebytes = pb.esrc.tolist(), pb.ebytes.tolist()
    pl = place.tolist()
    cost = pb.cost
    out = np.zeros(len(pb.programs))
    for p in range(len(pb.programs)):
        dev_free = [0.0] * pb.D
        link_free = np.zeros((pb.D, pb.D))
        end = 0.0
        for k in pb.program_slice(p).tolist():
            d = pl[k]
            ready = 0.0
            for e in preds[k]:
                s = esrc[e]
                t = finish[s]
                if pl[s] != d and ebytes[e] > 0:
                    start = max(t, link_free[pl[s], d])
                    t = start + pb.alpha[pl[s], d] + ebytes[e] / pb.bw[pl[s], d]
                    link_free[pl[s], d] = t
                ready = max(ready, t)
            f = max(ready, dev_free[d]) + cost[k, d]
            finish[k] = f
            dev_free[d] = f
            end = max(end, f)
        out[p] = end
    return out


def handover_seconds(pb: Problem, place: np.ndarray) -> float:
    """Seconds of STATE hand-overs between programs per workload step (one copy each, when owners differ)."""
    tot = 0.0
    for e, kind in enumerate(pb.ekind):
        if kind == "STATE":
            a, b = place[pb.esrc[e]], place[pb.edst[e]]
            if a != b:
                tot += pb.alpha[a, b] + pb.ebytes[e] / pb.bw[a, b]
    return tot


def latency_seconds(pb: Problem, place: np.ndarray) -> float:
    """Latency of one request: ``sum_p frequency_p x makespan_p`` plus hand-overs (seconds)."""
    return float((pb.freq * makespans(pb, place)).sum() + handover_seconds(pb, place))


def memory(pb: Problem, place: np.ndarray) -> dict[str, np.ndarray | list]:
    """Per-device memory estimate (bytes): weights where read, STATE where held (owner and replicas), inputs and the
    activation peak of the kernels placed there.

    Returns:
        dict with ``weight``, ``state``, ``activation`` and ``total`` arrays ``[D]`` (bytes) and ``weights``: per
        device the sorted names of the PARAMETER buffers it holds.
    """
    D = pb.D
    weight, state, act = np.zeros(D), np.zeros(D), np.zeros(D)
    names: list[list[str]] = [[] for _ in range(D)]
    for r in pb.resident:
        on = np.unique(place[r.holders])
        target = weight if r.kind == "parameter" else state if r.kind == "state" else act
        target[on] += r.nbytes
        if r.kind == "parameter":
            for g in on:
                names[g].append(r.name)
    peak = np.zeros(D)
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p)
        for g in range(D):
            mine = ks[place[ks] == g]
            if len(mine):
                peak[g] = max(peak[g], _peak(mine, pb, p))
    act += peak
    return {"weight": weight, "state": state, "activation": act, "total": weight + state + act,
            "weights": [sorted(n) for n in names]}


def _peak(kernels: np.ndarray, pb: Problem, p: int) -> float:
    from torch_tessera.scheduler.problem import _temp_peak

    return float(_temp_peak(kernels.tolist(), pb.reads, pb.writes, pb.temp_bytes[p]))


def resident_bytes(pb: Problem, place: np.ndarray) -> np.ndarray:
    """Bytes of resident buffers (weights, state, inputs) per device: what the solvers' memory rows count."""
    out = np.zeros(pb.D)
    for r in pb.resident:
        out[np.unique(place[r.holders])] += r.nbytes
    return out


def memory_ok(pb: Problem, place: np.ndarray) -> bool:
    """Whether ``place`` fits every budget with the activation reserve of :attr:`Problem.reserve`."""
    if np.isinf(pb.budgets).all():
        return True
    used = resident_bytes(pb, place)
    on = np.bincount(place, minlength=pb.D) > 0
    return bool(np.all(~on | (used + pb.reserve <= pb.budgets * (1 + 1e-9))))
