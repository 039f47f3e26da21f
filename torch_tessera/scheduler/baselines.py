"""The field's placements, as plans over the same program, scored by the same model (docs/DESIGN.md, Baselines).

``homo-<i>`` (``homo-L``/``homo-R`` for a pair): everything on one device. ``request-dist``: a full replica per
device, requests shared in proportion to speed (throughput adds up; memory is a full model on each). ``pd``: the
prefill program on one device, the decode program on another, the KV cache handed over (Splitwise, DistServe).
``af``: attention kernels on one device, all others on another (MegaScale-Infer, Lamina). ``layer``: contiguous
layer ranges per device, balanced by cost and pipelined (Helix, HexGen).

Every baseline respects the hard groups (a STATE buffer's writers share a device; unsure kernels stay with their
neighbour) by moving each group to the device of its heaviest member (for ``af``: of an attention member). Pins are
not applied to baselines. Attention kernels and layers come from the DAG's ``op_class`` and ``layer`` attributes,
which the graph builder takes from FX/Inductor provenance.
"""

from __future__ import annotations

import itertools

import numpy as np

from torch_tessera.errors import InfeasiblePlanError
from torch_tessera.scheduler.evaluate import (cycle_many, cycle_seconds, fits_many, holder_entries, latency_seconds,
                                              memory, pool_line, resident_bytes, resident_on)
from torch_tessera.scheduler.problem import Problem
from torch_tessera.scheduler.types import NotApplicableError
from torch_tessera.target.devices import format_bytes

def homo_index(pb: Problem, name: str) -> int | None:
    """Device index of a ``homo-*`` name (``homo-0``, ``homo-L``/``homo-R`` for two devices, ``homo-<device>``)."""
    if not name.startswith("homo-"):
        return None
    tail = name[5:]
    if pb.D == 2 and tail in ("L", "R"):
        return 0 if tail == "L" else 1
    if tail in pb.devices:
        return pb.devices.index(tail)
    if tail.isdigit() and int(tail) < pb.D:
        return int(tail)
    raise NotApplicableError(f"{name!r}: no such device; use homo-0..homo-{pb.D - 1}"
                             + (" or homo-L/homo-R" if pb.D == 2 else "") + f" (devices {pb.devices})")


def check_fits(pb: Problem, place: np.ndarray, what: str) -> None:
    """Raise :class:`InfeasiblePlanError` naming each device of ``place`` whose budget is too small, and each GPU
    whose partitions do not fit its memory together."""
    used = resident_bytes(pb, place) + pb.reserve
    on = np.bincount(place, minlength=pb.D) > 0
    short = [g for g in range(pb.D) if on[g] and used[g] > pb.budgets[g] * (1 + 1e-9)]
    if short:
        raise InfeasiblePlanError(f"{what} does not fit: " + "; ".join(
            f"device {pb.devices[g]} needs {format_bytes(used[g])}, has {format_bytes(pb.budgets[g], used[g])} "
            f"(short by {format_bytes(used[g] - pb.budgets[g], used[g])})" for g in short)
            + ". Fix: raise memory_budgets or use a plan that spreads weights.",
            tuple((pb.devices[g], float(used[g]), float(pb.budgets[g])) for g in short))
    if len(pb.pool_budgets):
        check_pools(pb, pb.pool_bytes(resident_on(pb, place[None]), holder_entries(pb)[2], on[None])[0], what)


def check_pools(pb: Problem, need: np.ndarray, what: str) -> None:
    """Raise :class:`InfeasiblePlanError` naming each GPU whose partitions need more than its memory together.

    Args:
        pb: the problem (its memory pools).
        need: ``[K]`` bytes the members of each pool hold together (resident buffers and activation reserves).
        what: the plan, for the message (``"request-dist"``).
    """
    over = np.flatnonzero(need > pb.pool_budgets * (1 + 1e-9))
    if len(over):
        raise InfeasiblePlanError(
            f"{what} does not fit: " + "; ".join(pool_line(pb, k, float(need[k])) for k in over)
            + ". The partitions of one GPU share its memory. Fix: use a plan that spreads the weights over the "
            "partitions (policy throughput or layer), run the model on one partition (homo-*), or add a GPU.",
            tuple((pb.pool_names[k], float(need[k]), float(pb.pool_budgets[k])) for k in over))


def project(pb: Problem, place: np.ndarray, prefer: np.ndarray | None = None) -> np.ndarray:
    """Move every hard group to the device of its heaviest member (members with ``prefer`` first)."""
    return place[_heaviest(pb, prefer)[pb.group]]


def _heaviest(pb: Problem, prefer: np.ndarray | None) -> np.ndarray:
    """``[G]``: the heaviest member kernel of each hard group (members with ``prefer`` first; the last of equals in
    kernel order); without ``prefer`` computed once per problem."""
    def compute() -> np.ndarray:
        weight = pb.cost.min(1) + (1e9 * prefer if prefer is not None else 0.0)
        order = np.lexsort((weight, pb.group))  # by group, heaviest last
        last = np.r_[pb.group[order][1:] != pb.group[order][:-1], True]
        rep = np.zeros(int(pb.group.max()) + 1, dtype=np.int64)
        rep[pb.group[order][last]] = order[last]
        return rep

    return pb.memo("heaviest", compute) if prefer is None else compute()


def _score(pb: Problem, place: np.ndarray, objective: str) -> float:
    return cycle_seconds(pb, place) if objective == "cycle" else latency_seconds(pb, place)


def _best(pb: Problem, cands: list[np.ndarray], objective: str, what: str) -> np.ndarray:
    """Best candidate that fits memory (the first of equals); the first one's error if none fits. Memory and cycle
    times are computed for all candidates at once."""
    places = np.stack(cands)
    fits = fits_many(pb, places)
    if not fits.any():
        check_fits(pb, cands[0], what)  # raises, naming the short device
    ok = np.flatnonzero(fits)
    if objective == "cycle":
        scores = cycle_many(pb, places[ok])
    else:
        scores = np.array([latency_seconds(pb, places[i]) for i in ok])
    return cands[int(ok[int(np.argmin(scores))])]


def af(pb: Problem, objective: str) -> np.ndarray:
    attn = np.array([c == "attention" for c in pb.op_class])
    if pb.D < 2:
        raise NotApplicableError("af needs two devices")
    if not attn.any() or attn.all():
        raise NotApplicableError("af needs attention kernels and other kernels (op_class 'attention' from "
                                 "provenance); this program has " + ("none" if not attn.any() else "only attention"))
    rep = _heaviest(pb, attn)[pb.group]  # project(pb, place, attn) for every candidate, sorted once
    cands = [np.where(attn, a, b)[rep] for a, b in itertools.permutations(range(pb.D), 2)]
    return _best(pb, cands, objective, "af")


def pd(pb: Problem, objective: str) -> np.ndarray:
    roles = list(pb.roles)
    if len(pb.programs) < 2 or "prefill" not in roles or "decode" not in roles:
        raise NotApplicableError(f"pd does not apply: it needs a workload with a prefill and a decode program "
                                 f"(roles), this one has {len(pb.programs)} program(s) {list(pb.programs)}")
    if pb.D < 2:
        raise NotApplicableError("pd needs two devices")
    pre = pb.prog == roles.index("prefill")
    cands = []
    for a, b in itertools.permutations(range(pb.D), 2):
        place = np.full(pb.n, b, dtype=np.int64)
        place[pre] = a
        cands.append(project(pb, place))
    return _best(pb, cands, objective, "pd")


def _units(pb: Problem) -> tuple[np.ndarray, int]:
    """Layer position of each kernel; kernels outside layers join the nearest preceding layer of their program."""
    values = sorted({l for l in pb.layer if l is not None})
    if not values:
        raise NotApplicableError("layer needs the 'layer' attribute (repeated-layer provenance); this DAG has none")
    pos = {l: i for i, l in enumerate(values)}
    unit = np.zeros(pb.n, dtype=np.int64)
    for p in range(len(pb.programs)):
        cur = 0
        for k in pb.program_slice(p).tolist():
            if pb.layer[k] is not None:
                cur = pos[pb.layer[k]]
            unit[k] = cur
    return unit, len(values)


def layer(pb: Problem, objective: str) -> np.ndarray:
    """Contiguous layer ranges, one per device of an ordered device subset, chosen by a min-max DP per subset."""
    unit, U = _units(pb)
    wc = pb.wcost
    ucost = np.zeros((U, pb.D))
    np.add.at(ucost, unit, wc)
    pre = np.vstack([np.zeros(pb.D), np.cumsum(ucost, 0)])  # pre[i] = cost of units < i
    from torch_tessera.scheduler.evaluate import device_coef, link_coef

    us, ut = unit[pb.esrc], unit[pb.edst]
    fwd = np.flatnonzero((us < ut) & (pb.ewbytes > 0))

    def crossing(coef: np.ndarray) -> np.ndarray:
        """``[U + 1, D, D]``: ``coef`` summed over the edges from units < j to units >= j (a running sum)."""
        diff = np.zeros((U + 2, pb.D, pb.D))
        np.add.at(diff, us[fwd] + 1, coef[fwd])
        np.add.at(diff, ut[fwd] + 1, -coef[fwd])
        return np.cumsum(diff, 0)[:U + 1]

    cross = crossing(link_coef(pb))
    dcoef = device_coef(pb)
    dcross = crossing(dcoef) if dcoef is not None else None
    cands = []
    for k in range(1, min(pb.D, U) + 1):
        for seq in itertools.permutations(range(pb.D), k):
            cands.append(_layer_dp(seq, pre, cross, U, unit, dcross))
    return _best(pb, [project(pb, c) for c in cands], objective, "layer")


def _layer_dp(seq: tuple[int, ...], pre: np.ndarray, cross: np.ndarray, U: int, unit: np.ndarray,
              dcross: np.ndarray | None = None) -> np.ndarray:
    """Split units 0..U-1 into ``len(seq)`` non-empty ranges minimising max(stage load, boundary link load).

    ``dcross[j, a, b]`` (optional): what the edges crossing boundary ``j`` from ``a`` to ``b`` charge each of the two
    stages' devices (per-hop overhead); it is added to the new stage's load and to the best of the stages before it
    (conservative where an earlier stage binds: the candidates are scored exactly afterwards)."""
    k = len(seq)
    best = np.full((k, U + 1), np.inf)  # best[s, i]: units < i covered by stages 0..s
    arg = np.zeros((k, U + 1), dtype=np.int64)
    g0 = seq[0]
    best[0, 1:] = pre[1:, g0] - pre[0, g0]
    idx = np.arange(U + 1)
    for s in range(1, k):
        g, gp = seq[s], seq[s - 1]
        # val[j, i]: stage s covers units j..i-1 (s <= j < i)
        hop = dcross[:, gp, g][:, None] if dcross is not None else 0.0
        val = np.maximum(np.maximum(best[s - 1][:, None] + hop, pre[None, :, g] - pre[:, None, g] + hop),
                         cross[:, gp, g][:, None])
        val[(idx[:, None] >= idx[None, :]) | (idx[:, None] < s)] = np.inf
        j = val[s:].argmin(0) + s
        arg[s, s + 1:] = j[s + 1:]
        best[s, s + 1:] = val[j, idx][s + 1:]
    bounds = [U]
    for s in range(k - 1, 0, -1):
        bounds.append(int(arg[s, bounds[-1]]))
    bounds = bounds[::-1]  # stage s covers units [bounds[s-1], bounds[s])
    stage = np.searchsorted(np.array(bounds), unit, side="right")
    return np.array(seq, dtype=np.int64)[np.minimum(stage, k - 1)]


def request_dist(pb: Problem) -> tuple[np.ndarray, tuple[int, ...], float, float, dict]:
    """A replica on every device that holds the whole model; requests split in proportion to speed.

    Returns:
        ``(placement of replica 0, replica devices, cycle seconds, latency seconds, memory dict)``: cycle is
        ``1 / sum_g (1 / cycle_g)``; latency is the slowest replica's (a request may land there).

    Raises:
        InfeasiblePlanError: no device holds a replica, or the replicas on the partitions of one GPU do not fit its
            memory together (the message names the GPU, the bytes needed and available).
    """
    fits, err = [], None
    for g in range(pb.D):
        place = np.full(pb.n, g, dtype=np.int64)
        try:
            check_fits(pb, place, f"a replica on {pb.devices[g]}")
            fits.append(g)
        except InfeasiblePlanError as e:
            err = err or e
    if not fits:
        raise err
    places = {g: np.full(pb.n, g, dtype=np.int64) for g in fits}
    if len(pb.pool_budgets):  # each replica is a copy of the whole model: the copies on one GPU add up
        used = np.zeros(pb.D)
        used[fits] = [resident_bytes(pb, places[g])[g] + pb.reserve for g in fits]
        check_pools(pb, pb.pools @ used, "request-dist (a full model copy on each of "
                    + ", ".join(pb.devices[g] for g in fits) + ")")
    cyc = 1.0 / sum(1.0 / cycle_seconds(pb, places[g]) for g in fits)
    lat = max(latency_seconds(pb, places[g]) for g in fits)
    mems = [memory(pb, places[g]) for g in fits]
    mem = {key: sum(m[key] for m in mems) for key in ("weight", "state", "activation", "total")}
    mem["weights"] = [sorted({w for m in mems for w in m["weights"][g]}) for g in range(pb.D)]
    return places[fits[0]], tuple(fits), cyc, lat, mem
