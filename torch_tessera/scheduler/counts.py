"""Repeated layers as counts: the throughput MILP over "how many layers put kernel r on device g".

Forcing every repeated layer into one pattern (plain tying) loses the balance that mixing patterns gives: on a 4-layer
model it cost 16 % of cycle time. Instead, the kernels at position ``r`` of structurally identical layers form a
*class* of ``L_r`` hard groups, and the MILP chooses integer counts ``n[r,g]`` (``sum_g n[r,g] = L_r``). The cycle time
is linear in the counts: device loads are ``sum_r cost[r,g] n[r,g]``; an edge class (all edges between groups of class
``r`` and class ``s``, ``k`` instances) moves ``m[a,b]`` of its instances over link ``a -> b``, where ``m`` is a
transport plan whose margins are the counts (a source group on ``a`` sends from ``a``):

    sum_b m[a,b] in [n[r,a] - (L_r - k), n[r,a]],   sum_a m[a,b] in [n[s,b] - (L_s - k), n[s,b]],   sum m = k

Every untied placement satisfies these rows with its own counts, so the MILP optimum (costs and edge loads taken at
their minimum over a class's members) is a valid lower bound on the cycle time. A placement is recovered by filling
each class's layers in order, device by device (the first ``n[r,0]`` layers on device 0...): on two devices this
realises the transport's least crossing ``|n[r,0] - n[s,0]|`` for edges inside a layer. The realised placement is scored
exactly and polished by the untied local search. Without repetition every class has one group and the MILP is the
exact placement MILP.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np

from torch_tessera.scheduler.blocks import (Blocks, block_cycle_many, block_loads_many, block_memory_ok_many,
                                            layer_units, memory_binds, moved_loads_many)
from torch_tessera.scheduler.evaluate import budgets_bind
from torch_tessera.scheduler.milp import EPS, MilpModel, MilpResult, milp_result
from torch_tessera.scheduler.problem import Problem

log = logging.getLogger(__name__)


@dataclass
class Classes:
    """Group classes and their aggregated data (see module docstring)."""

    of_group: np.ndarray  # [G] class of each group
    members: list[np.ndarray]  # groups of each class, in layer order
    L: np.ndarray  # [C] groups per class
    cost: np.ndarray  # [C, D] least per-group cost over members (seconds per step)
    pinned: np.ndarray  # [C]
    fsrc: np.ndarray  # [F] edge classes
    fdst: np.ndarray
    fk: np.ndarray  # [F] instances
    fnsrc: np.ndarray  # [F] distinct source groups of the instances
    fndst: np.ndarray  # [F] distinct target groups
    fmsrc: np.ndarray  # [F] most instances sharing one source group (a broadcast: RoPE tables read by every layer)
    fmdst: np.ndarray  # [F] most instances sharing one target group
    fcoef: np.ndarray  # [F, D, D] least instance load per link
    res: list[tuple[float, int, list[tuple[int, float, int]]]]  # (bytes, count, [(class, slack, max holders)])
    unit: np.ndarray  # [G] layer unit of each group (blocks.layer_units of its first kernel; -1: none)
    fdcoef: np.ndarray | None = None  # [F, D, D] least instance charge on each end device (None: no charge)

    @property
    def C(self) -> int:
        return len(self.L)


def tied_classes(pb: Problem, groups: Blocks, label: np.ndarray, tied: bool = True) -> Classes:
    """The counts model's classes: kernels tied across layers (``label``, ``[n]``, from
    :func:`~torch_tessera.scheduler.blocks.tie_layers`) lifted to the groups of ``groups`` and, when layers are
    ``tied``, split where tied members' costs differ (:func:`split_by_cost`)."""
    glabel = np.zeros(groups.B, dtype=np.int64)
    glabel[pb.group] = label
    return build_classes(pb, groups, split_by_cost(groups, glabel) if tied else glabel)


def build_classes(pb: Problem, groups: Blocks, group_label: np.ndarray) -> Classes:
    """Classes from a partition of the groups (``group_label[g]``: class of group ``g``)."""
    G, D = groups.B, pb.D
    _, of = np.unique(group_label, return_inverse=True)
    C = int(of.max()) + 1 if G else 0
    first = np.full(G, pb.n)
    np.minimum.at(first, pb.group, np.arange(pb.n))
    members = [np.array([], np.int64)] * C
    order = np.lexsort((first, of))
    bounds = np.flatnonzero(np.r_[True, of[order][1:] != of[order][:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:]):
        members[of[order[a]]] = order[a:b]
    L = np.bincount(of, minlength=C)
    cost = np.full((C, D), np.inf)
    np.minimum.at(cost, of, groups.cost)
    pinned = np.full(C, -1, dtype=np.int64)
    pinned[of[groups.pinned >= 0]] = groups.pinned[groups.pinned >= 0]
    fs, ft = of[groups.esrc], of[groups.edst]
    keys = fs * max(C, 1) + ft
    uniq, inv = np.unique(keys, return_inverse=True)
    F = len(uniq)
    fcoef = np.full((F, D, D), np.inf)
    np.minimum.at(fcoef, inv, groups.coef)
    fdcoef = None
    if groups.dcoef is not None:
        fdcoef = np.full((F, D, D), np.inf)
        np.minimum.at(fdcoef, inv, groups.dcoef)
    fk = np.bincount(inv, minlength=F)
    ends = []
    for end in (groups.esrc, groups.edst):  # distinct end groups per edge class, and most instances sharing one
        pair, mult = np.unique(inv * G + end, return_counts=True)
        fam = pair // max(G, 1)
        most = np.zeros(F, np.int64)
        np.maximum.at(most, fam, mult)
        ends += [np.bincount(fam, minlength=F), most]
    units = layer_units(pb)
    unit = np.array([-1 if units[k] is None else units[k] for k in first.tolist()], dtype=np.int64)
    return Classes(of, members, L, cost, pinned, uniq // max(C, 1), uniq % max(C, 1), fk, ends[0], ends[2],
                   ends[1], ends[3], fcoef, _families(groups, of, L), unit, fdcoef)


def split_by_cost(groups: Blocks, group_label: np.ndarray, rtol: float = 1e-6) -> np.ndarray:
    """Refine a partition of the groups so that each class's members cost the same on every device (within
    ``rtol``). The counts MILP charges a class its least member cost; a class whose members differ (the first repeated
    layer also reads the embedding, Inductor fuses one layer's norm differently) would make its bound loose."""
    if groups.B == 0:
        return group_label
    key = np.round(np.log(np.maximum(groups.cost, 1e-30)) / max(rtol, 1e-12)).astype(np.int64)
    rows = np.c_[group_label, key]
    # np.unique(rows, axis=0, return_inverse=True), without its slow row view: rows sorted lexicographically,
    # numbered in that order
    order = np.lexsort(rows.T[::-1])
    new = np.r_[True, (rows[order][1:] != rows[order][:-1]).any(1)]
    lab = np.empty(len(rows), dtype=np.int64)
    lab[order] = np.cumsum(new) - 1
    return lab


def _families(groups: Blocks, of: np.ndarray, L: np.ndarray) -> list[tuple[float, int, list[tuple[int, float, int]]]]:
    """Resident buffers grouped by the set of classes holding them: ``(least bytes, count, [(class, slack, M)])``
    where ``slack = L_c - (members of c holding one)`` and ``M`` = most members of c holding the same buffer."""
    fams: dict[tuple[int, ...], list[int]] = {}
    sizes = [len(h) for h in groups.res_holders]
    if sizes:  # the sorted distinct classes holding each buffer, as Python slices of one sorted array
        item = np.repeat(np.arange(len(sizes)), sizes)
        pairs = np.unique(item * max(len(L), 1) + of[np.concatenate(groups.res_holders)])
        cls_of, cuts = (pairs % max(len(L), 1)).tolist(), np.r_[0, np.cumsum(np.bincount(
            pairs // max(len(L), 1), minlength=len(sizes)))].tolist()
        for i in range(len(sizes)):
            fams.setdefault(tuple(cls_of[cuts[i]:cuts[i + 1]]), []).append(i)
    out = []
    for key, items in fams.items():
        h = np.concatenate([groups.res_holders[i] for i in items])
        item = np.repeat(np.arange(len(items)), [len(groups.res_holders[i]) for i in items])
        hc = of[h]
        holders = []
        for c in key:
            sel = hc == c
            h_c = len(np.unique(h[sel]))
            M = int(np.bincount(item[sel]).max())
            holders.append((c, float(L[c] - h_c), M))
        out.append((float(min(groups.res_bytes[i] for i in items)), len(items), holders))
    return out


def solve_counts(pb: Problem, cls: Classes, forbidden: np.ndarray, time_limit: float,
                 upper: float | None = None, mip_gap: float = 5e-3, relax: bool = False,
                 presolve: bool = True) -> tuple[MilpResult, np.ndarray | None]:
    """Solve the counts MILP until proven within ``mip_gap`` (relative) or ``time_limit`` seconds.

    Args:
        relax: solve the LP relaxation instead (its optimum is also a valid bound; the counts come back fractional).
        presolve: run HiGHS' presolve.

    Returns ``(result, n)`` with ``n [C, D]`` integer counts (float when ``relax``; ``None`` if no solution);
    ``result.bound`` is a valid lower bound on the cycle time of every placement."""
    t0 = time.perf_counter()
    D, C, F = pb.D, cls.C, len(cls.fk)
    scale = float(upper) if upper and np.isfinite(upper) and upper > 0 else float(np.minimum(
        cls.cost.min(1) * cls.L, 1e30).sum() or 1.0)
    m = MilpModel()
    T = m.vars(1, lb=0.0, ub=np.inf, cost=1.0)[0]
    ub = np.repeat(cls.L[:, None], D, 1).astype(float)
    ub[:, forbidden] = 0.0
    lb = np.zeros((C, D))
    pin = cls.pinned >= 0
    ub[pin] = 0.0
    ub[pin, cls.pinned[pin]] = cls.L[pin]
    lb[pin, cls.pinned[pin]] = cls.L[pin]
    cost = np.where(np.isfinite(cls.cost), cls.cost, 0.0) / scale
    n = m.vars(C * D, lb=lb.ravel(), ub=ub.ravel(), integer=True, cost=(EPS / D) * cost.ravel()).reshape(C, D)
    m.rows_coo(np.repeat(np.arange(C), D), n.ravel(), np.ones(C * D), cls.L.astype(float), cls.L.astype(float), C)
    charged = cls.fdcoef is not None and F > 0 and D > 1
    if not charged:  # device rows: compute load <= T
        m.rows_coo(np.r_[np.tile(np.arange(D), C), np.arange(D)], np.r_[n.ravel(), np.full(D, T)],
                   np.r_[cost.ravel(), -np.ones(D)], -np.inf, 0.0, D)
    if F and D > 1:
        coef = np.where(np.isfinite(cls.fcoef), cls.fcoef, 0.0) / scale
        off = ~np.eye(D, dtype=bool)
        dc = np.where(np.isfinite(cls.fdcoef), cls.fdcoef, 0.0) / scale * off if charged else 0.0
        mv = m.vars(F * D * D, lb=0.0, ub=np.inf, cost=(EPS / D) * ((coef + 2 * dc) * off).ravel()).reshape(F, D, D)
        if charged:  # device rows: compute load + the hops of its cut edges (either end) <= T
            for g in range(D):
                cols = np.r_[n[:, g], mv[:, g, :].ravel(), mv[:, :, g].ravel(), T]
                vals = np.r_[cost[:, g], dc[:, g, :].ravel(), dc[:, :, g].ravel(), -1.0]
                m.rows_coo(np.zeros(len(cols), np.int64), cols, vals, -np.inf, 0.0, 1)
        m.rows_coo(np.repeat(np.arange(F), D * D), mv.ravel(), np.ones(F * D * D), cls.fk.astype(float),
                   cls.fk.astype(float), F)
        for side, cl, ends, most in ((0, cls.fsrc, cls.fnsrc, cls.fmsrc), (1, cls.fdst, cls.fndst, cls.fmdst)):
            # margin rows: the instances leaving device g come from the class's groups on g, each sending at most
            # `most`; at least n - (L - distinct ends) of those groups send one:
            #   n - (L - ends) <= sum m <= most * n      (one row  0 <= n - sum m <= L - ends  when most == 1)
            slack = (cls.L[cl] - ends).astype(float)
            one = most == 1
            for g in range(D):
                flows = mv[:, g, :] if side == 0 else mv[:, :, g]
                r = np.r_[np.arange(F), np.repeat(np.arange(F), D)]
                c = np.r_[n[cl, g], flows.ravel()]
                m.rows_coo(r, c, np.r_[most.astype(float), -np.ones(F * D)], 0.0, np.where(one, slack, np.inf), F)
                if not one.all():
                    m.rows_coo(r, c, np.r_[np.ones(F), -np.ones(F * D)], -np.inf, np.where(one, np.inf, slack), F)
        P = [(a, b) for a in range(D) for b in range(D) if a != b]
        r = np.r_[np.tile(np.arange(len(P)), F), np.arange(len(P))]
        c = np.r_[np.stack([mv[:, a, b] for a, b in P], 1).ravel(), np.full(len(P), T)]
        v = np.r_[np.stack([coef[:, a, b] for a, b in P], 1).ravel(), -np.ones(len(P))]
        m.rows_coo(r, c, v, -np.inf, 0.0, len(P))
    _memory_rows(m, pb, cls, n, forbidden)
    for g, h in identical_device_pairs(pb, forbidden):  # symmetry: identical devices ordered by load
        m.rows_coo(np.zeros(2 * C, np.int64), np.r_[n[:, g], n[:, h]], np.r_[cost[:, g], -cost[:, h]], 0.0, np.inf, 1)
    shrink = 1.0 + EPS * D
    ob = upper / scale * shrink * (1 + 1e-6) if upper and np.isfinite(upper) else None
    res = m.solve(time_limit, ob, mip_gap, relax=relax, presolve=presolve)
    out = milp_result(res, scale, lambda xs: None, t0, shrink)
    counts = None if res.x is None else res.x[n] if relax else np.rint(res.x[n]).astype(np.int64)
    log.debug("counts %s: %d classes, %d edge classes, %d vars: %s %.3f s", "LP" if relax else "MILP", C, F, m.nv,
              out.status, out.wall)
    return out, counts


def round_counts(frac: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Integer counts ``[C, D]`` from fractional ones: each row floored, then its remaining members given to the
    devices with the largest fractional parts (so every row still sums to ``L``; a device with 0 stays at 0)."""
    frac = np.maximum(np.asarray(frac, dtype=np.float64), 0.0)
    out = np.floor(frac + 1e-6).astype(np.int64)
    rest = np.where(frac > 0, frac - out, -1.0)  # devices the LP left empty come last
    short = np.asarray(L, dtype=np.int64) - out.sum(1)
    order = np.argsort(-rest, axis=1, kind="stable")
    give = np.arange(frac.shape[1])[None, :] < short[:, None]  # the first `short` devices of each row's order
    np.add.at(out, (np.nonzero(give)[0], order[give]), 1)
    return out


def identical_device_pairs(pb: Problem, forbidden: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive pairs ``(g, h)`` of interchangeable devices: same kernel costs, same links to every other device
    and to each other, same budget. Any placement stays feasible and equally good with g and h swapped, so the MILP
    may require ``load_g >= load_h`` (symmetry breaking)."""
    pairs = []
    D = pb.D
    for g in range(D):
        for h in range(g + 1, D):
            others = [o for o in range(D) if o not in (g, h)]
            if (not forbidden[g] and not forbidden[h] and np.array_equal(pb.cost[:, g], pb.cost[:, h])
                    and pb.budgets[g] == pb.budgets[h] and np.array_equal(pb.pools[:, g], pb.pools[:, h])
                    and np.array_equal(pb.bw[g, others], pb.bw[h, others])
                    and np.array_equal(pb.bw[others, g], pb.bw[others, h])
                    and np.array_equal(pb.alpha[g, others], pb.alpha[h, others])
                    and np.array_equal(pb.alpha[others, g], pb.alpha[others, h])
                    and pb.bw[g, h] == pb.bw[h, g] and pb.alpha[g, h] == pb.alpha[h, g]
                    and all(np.array_equal(x[g, others], x[h, others]) and np.array_equal(x[others, g], x[others, h])
                            and x[g, h] == x[h, g] for x in (pb.hop, pb.expose))
                    and not (pb.pinned == g).any() and not (pb.pinned == h).any()):
                pairs.append((g, h))
                break
    return pairs


def _memory_rows(m: MilpModel, pb: Problem, cls: Classes, n: np.ndarray, forbidden: np.ndarray) -> None:
    """Resident bytes of each device within its budget less the activation reserve, and of each memory pool's members
    together within its budget less one reserve per member (in GB; a buffer held on two members of one pool counts
    twice here, once at run time: the realisation is checked exactly); no rows when every resident buffer fits on
    every device and pool together (then no placement can break a budget)."""
    if not budgets_bind(pb):
        return
    cap = (pb.budgets - pb.reserve) / 1e9
    pooled = pb.pools.any(0)
    limited = [g for g in range(pb.D) if (np.isfinite(cap[g]) or pooled[g]) and not forbidden[g]]
    if not limited or not cls.res:
        return
    Q = len(cls.res)
    w = m.vars(Q * pb.D, lb=0.0, ub=np.repeat([float(q) for _, q, _ in cls.res], pb.D)).reshape(Q, pb.D)
    rr, cc, vv, lo, row = [], [], [], [], 0
    for f, (_, _, holders) in enumerate(cls.res):
        for c, slack, M in holders:  # M w[f,g] - n[c,g] >= -slack
            for g in limited:
                rr += [row, row]
                cc += [w[f, g], n[c, g]]
                vv += [float(M), -1.0]
                lo.append(-slack)
                row += 1
    if row:
        m.rows_coo(np.array(rr), np.array(cc), np.array(vv), np.array(lo), np.inf, row)
    gb = np.array([b / 1e9 for b, _, _ in cls.res])
    for g in limited:
        if np.isfinite(cap[g]):
            m.rows_coo(np.zeros(Q, np.int64), w[:, g], gb, -np.inf, cap[g], 1)
    for k in range(len(pb.pool_budgets)):  # members of one pool together; a forbidden member holds nothing
        members = [g for g in np.flatnonzero(pb.pools[k]).tolist() if g in limited]
        if members:
            m.rows_coo(np.zeros(Q * len(members), np.int64), w[:, members].T.ravel(), np.tile(gb, len(members)),
                       -np.inf, (pb.pool_budgets[k] - pb.reserve * len(members)) / 1e9, 1)


def unit_orders(units: np.ndarray) -> dict[str, np.ndarray]:
    """Rank of each layer unit in the orders the realisation fills layers in: forward, backward, from both ends
    inward (the middle layers last) and from the middle outward. Consecutive layers stay a few ranks apart in each,
    so the fill keeps inter-layer edges mostly uncut; the end-first orders put a class's minority device in the
    middle, away from the untied first and last layers.

    Args:
        units: ``[U]`` distinct unit indices (layer numbers), ascending.

    Returns:
        order name -> ``[max(units) + 1]`` rank of each unit index (entries of absent indices are unused).
    """
    U = len(units)
    ends = np.empty(U, np.int64)
    ends[0::2] = np.arange((U + 1) // 2)
    ends[1::2] = np.arange(U - 1, (U + 1) // 2 - 1, -1)[:U // 2]
    out = {}
    for name, seq in (("forward", np.arange(U)), ("backward", np.arange(U)[::-1]), ("ends-in", ends),
                      ("middle-out", ends[::-1])):
        rank = np.zeros(int(units.max()) + 1 if U else 0, np.int64)
        rank[units[seq]] = np.arange(U)
        out[name] = rank
    return out


def realize(pb: Problem, groups: Blocks, cls: Classes, counts: np.ndarray) -> np.ndarray:
    """Group placement from counts: every class's members filled device by device (``counts[c, g]`` members on
    device ``g``), all classes with the same device order and the same order of layer units (:func:`unit_orders`), so
    that the members of one layer get nested device ranges and within-layer edges cross only where counts differ.

    Of all device orders (up to 24) and unit orders, returns the one with the least cycle time among those that fit
    the memory budgets (the least by cycle if none fits); all candidates are built and scored at once."""
    D = pb.D
    dorders = np.array(list(itertools.permutations(range(D))) if D <= 4 else [tuple(range(D))], dtype=np.int64)
    known = cls.unit >= 0
    ranks = unit_orders(np.unique(cls.unit[known])) if known.any() else {"forward": np.zeros(0, np.int64)}
    counts = np.asarray(counts, dtype=np.int64)
    cum = np.cumsum(counts[:, dorders], axis=2)  # [C, K, D]: members filled once each device of an order is full
    sizes = np.array([len(m) for m in cls.members], dtype=np.int64)
    of = np.repeat(np.arange(cls.C), sizes)
    pos = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # rank of a member in its class
    slot = (cum[of] <= pos[:, None, None]).sum(2)  # [members, K]: index into the device order (D: past the counts)
    slot[slot >= D] = 0  # members beyond the counts go to the order's first device
    devs = np.take_along_axis(dorders, slot.T, axis=1)  # [K, members]
    cands = []
    allmem = np.concatenate(cls.members) if cls.C else np.zeros(0, np.int64)
    for rank in ranks.values():
        key = np.where(known, rank[np.maximum(cls.unit, 0)] if len(rank) else 0, -1)
        flat = allmem[np.lexsort((key[allmem], of))]  # each class's members by key, stably, classes in order
        gp = np.zeros((len(dorders), groups.B), dtype=np.int64)
        gp[:, flat] = devs
        cands.append(gp)
    cands = np.concatenate(cands)
    order = np.argsort(block_cycle_many(groups, cands), kind="stable")
    if block_memory_ok_many(pb, groups, cands[order[:1]])[0]:  # usually the best fits: check it alone first
        return cands[order[0]]
    ok = block_memory_ok_many(pb, groups, cands[order])
    return cands[order[int(np.argmax(ok))] if ok.any() else order[0]]


def layer_split(pb: Problem, groups: Blocks, cls: Classes, frac: np.ndarray, base: np.ndarray,
                top: int = 2) -> list[np.ndarray]:
    """Placements that split each program's layer units into contiguous ranges, one per device of a device order
    (every layer wholly on one device): up to ``top`` of them, least cycle time first, that fit the memory budgets.

    Why: when cut edges charge the devices they join (:attr:`Problem.hop`), every cut edge costs a per-hop overhead,
    but the counts LP cannot see the cuts a split *between* layers makes (the edges from layer ``i`` to ``i + 1`` join
    two classes with equal counts, which the relaxation lets go uncut). Its rounded counts then differ by a layer or
    two from class to class, the fill cuts those layers inside (Llama-3.1-8B decode, A100 + L40S: 25 cut edges where a
    split between layers cuts 7), and the LP's shares can be far from the best split (Mamba-2.8B on two devices: the
    LP splits decode, the best plan runs prefill on one device and decode on the other, with no cut at all).

    Search: seeds are the LP's shares of each program's repeated classes, as boundaries in every device order, and
    every assignment of whole programs to devices; from the best two seeds, coordinate descent moves one boundary of
    one program at a time to its best position over its whole range (two rounds). All candidates of a step are scored
    at once (:func:`block_cycle_many`; when a budget can bind, a split that breaks one scores as infinite, so the
    descent stays among those that fit and none is returned). Groups outside the layer units keep their device in
    ``base``; pinned groups keep their pin. Returns ``[]`` when no program has two layer units (or no split fits).
    """
    D, G = pb.D, groups.B
    gprog = np.zeros(G, dtype=np.int64)
    gprog[pb.group] = pb.prog
    known = cls.unit >= 0
    cprog = np.array([gprog[m[0]] for m in cls.members], dtype=np.int64)
    multi = cls.L > 1
    P = len(pb.programs)
    free = groups.pinned < 0
    progs, shares, sizes, sel = [], [], [], []
    pos = np.zeros(G, dtype=np.int64)
    for p in range(P):
        mine = known & (gprog == p)
        units = np.unique(cls.unit[mine])
        if len(units) < 2:
            continue
        pos[mine] = np.searchsorted(units, cls.unit[mine])  # rank of the group's unit in its program
        c = multi & (cprog == p)
        progs.append(p), sizes.append(len(units)), sel.append(np.flatnonzero(mine & free))
        shares.append(frac[c].sum(0) / max(frac[c].sum(), 1e-30) if c.any() else np.full(D, 1.0 / D))
    if not progs or D < 2:
        return []
    dorders = np.array(list(itertools.permutations(range(D))) if D <= 4 else [tuple(range(D))], dtype=np.int64)

    def build(o: int, cuts: list[np.ndarray]) -> np.ndarray:
        gp = base.copy()
        for i, c in enumerate(cuts):
            gp[sel[i]] = dorders[o][np.searchsorted(c, pos[sel[i]], side="right")]
        return gp

    def trials(o: int, cuts: list[np.ndarray], i: int, j: int, opts: list[int]) -> np.ndarray:
        """``[len(opts), G]``: ``build`` with cut ``j`` of program ``i`` at each of ``opts`` (each cut vector stays
        sorted, so a group's range is the number of cuts at or below its unit, as ``searchsorted`` gives)."""
        stack = np.repeat(build(o, cuts)[None], len(opts), axis=0)
        c = np.repeat(cuts[i][None], len(opts), axis=0)
        c[:, j] = opts
        stack[:, sel[i]] = dorders[o][(c[:, None, :] <= pos[sel[i]][None, :, None]).sum(2)]
        return stack

    keep: dict[bytes, tuple[float, np.ndarray]] = {}  # the best few candidates scored so far, by placement
    binds = memory_binds(pb, groups)

    def score(stack: np.ndarray) -> np.ndarray:
        vals = block_cycle_many(groups, stack)
        vals[groups.forbidden[stack].any(1)] = np.inf
        if binds:  # a split that breaks a budget is no candidate (nor a step of the descent)
            vals[~block_memory_ok_many(pb, groups, stack)] = np.inf
        for i in np.argsort(vals, kind="stable")[:4 * top].tolist():
            if np.isfinite(vals[i]):
                keep.setdefault(stack[i].tobytes(), (float(vals[i]), stack[i]))
        if len(keep) > 4 * top:
            for key, _ in sorted(keep.items(), key=lambda kv: kv[1][0])[4 * top:]:
                del keep[key]
        return vals

    seeds = [(o, [np.rint(np.cumsum(shares[i][dorders[o]])[:-1] * sizes[i]).astype(np.int64)
                  for i in range(len(progs))]) for o in range(len(dorders))]
    whole = itertools.product(range(D), repeat=len(progs)) if D ** len(progs) <= 256 else []
    for devs in whole:  # every program wholly on one device (first device order: device g's range is all units)
        seeds.append((0, [np.where(np.arange(D - 1) < int(np.flatnonzero(dorders[0] == g)[0]), 0, sizes[i])
                          for i, g in enumerate(devs)]))
    vals = score(np.stack([build(o, cuts) for o, cuts in seeds]))
    for s in np.argsort(vals, kind="stable")[:2].tolist():
        o, cuts = seeds[s][0], [c.copy() for c in seeds[s][1]]
        cur = vals[s]
        for _ in range(2):
            moved = False
            for i in range(len(progs)):
                for j in range(D - 1):
                    lo = cuts[i][j - 1] if j else 0
                    hi = cuts[i][j + 1] if j + 1 < D - 1 else sizes[i]
                    opts = [v for v in range(lo, hi + 1) if v != cuts[i][j]]
                    if not opts:
                        continue
                    tv = score(trials(o, cuts, i, j, opts))
                    k = int(np.argmin(tv))
                    if tv[k] < cur * (1 - 1e-12):
                        cuts[i][j], cur, moved = opts[k], float(tv[k]), True
            if not moved:
                break
    return [gp for _, gp in sorted(keep.values(), key=lambda kv: kv[0])][:top]


def shift_search(pb: Problem, groups: Blocks, cls: Classes, gp: np.ndarray, deadline: float) -> np.ndarray:
    """Rotate each class's device sequence over its layers by one position either way while that lowers (cycle
    time, sum of squared loads): keeps every count, realigns cuts across layer boundaries; moves that break a memory
    budget are not taken.

    Each sweep over the classes is first-improvement in class order; the trials of all classes still ahead of the
    sweep are scored at once, and scoring restarts after the class of an accepted move. A rotation moves only the
    members whose device differs from their neighbour's in the layer order (a few per class for a fill), so each trial
    is scored from the current loads over those members (:func:`~torch_tessera.scheduler.blocks.moved_loads_many`)."""
    gp = gp.copy()
    movable = [c for c, mem in enumerate(cls.members) if len(mem) >= 2]
    if not movable:
        return gp
    mem = np.concatenate([cls.members[c] for c in movable])
    size = np.array([len(cls.members[c]) for c in movable], dtype=np.int64)
    seg = np.repeat(np.arange(len(movable)), size)
    first = np.repeat(np.cumsum(size) - size, size)
    last = first + np.repeat(size, size) - 1
    pos = np.arange(len(mem))
    prev, nxt = np.where(pos == first, last, pos - 1), np.where(pos == last, first, pos + 1)
    binds = memory_binds(pb, groups)
    dev, link = (loads[0] for loads in block_loads_many(groups, gp[None]))
    key = load_key(dev[None], link[None])[:, 0]
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        start = 0
        while start < len(movable) and time.perf_counter() < deadline:
            x = gp[mem]
            # trial 2j rolls class movable[j] forward (each member takes its predecessor's device), 2j + 1 backward
            moved = [np.flatnonzero((x[prev] != x) & (seg >= start)), np.flatnonzero((x[nxt] != x) & (seg >= start))]
            if not len(moved[0]):
                break
            move = np.concatenate([2 * seg[moved[0]], 2 * seg[moved[1]] + 1])
            at = np.concatenate(moved)
            to = np.concatenate([x[prev[moved[0]]], x[nxt[moved[1]]]])
            k = load_key(*moved_loads_many(groups, gp, move, mem[at], to, 2 * len(movable), dev, link))
            better = (k[0] < key[0] * (1 - 1e-9)) | ((k[0] <= key[0] * (1 + 1e-12)) & (k[1] < key[1] * (1 - 1e-9)))
            better[:2 * start] = False
            cand = np.flatnonzero(better)
            if len(cand) and binds:
                trials = np.repeat(gp[None], len(cand), axis=0)
                for i, t in enumerate(cand.tolist()):
                    sel = move == t
                    trials[i, mem[at[sel]]] = to[sel]
                cand = cand[block_memory_ok_many(pb, groups, trials)]
            if not len(cand):
                break
            t = int(cand[0])
            sel = move == t
            gp[mem[at[sel]]] = to[sel]
            dev, link = (loads[0] for loads in block_loads_many(groups, gp[None]))  # exact sums again
            key, improved = load_key(dev[None], link[None])[:, 0], True
            start = t // 2 + 1
    return gp


def load_key(dev: np.ndarray, link: np.ndarray) -> np.ndarray:
    """``[2, P]``: cycle time and sum of squared resource loads from ``[P, D]`` device and ``[P, D * D]`` link loads."""
    allr = np.concatenate([dev, link], axis=1)
    return np.stack([allr.max(1), (allr ** 2).sum(1)])
