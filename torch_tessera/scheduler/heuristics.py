"""Fast placement methods: list heuristics, local search, an exact DP on chains, and cheap lower bounds.

* :func:`greedy_cycle` places blocks in program order on the device that keeps the cycle time lowest (a HEFT-style
  list heuristic for the throughput objective).
* :func:`local_search` improves any block placement by steepest single-block moves, all moves scored at once with
  numpy; it minimises the cycle time, ties broken by the sum of squared resource loads (towards balance and less
  traffic), so it cannot cycle.
* :func:`heft_latency` is HEFT's earliest-finish-time rule in program order, for the latency objective.
* :func:`chain_dp` is an exact Viterbi DP when a program's DAG is a path (each kernel depends only on the previous).
* :func:`zero_comm_bound` is the LP bound with free transfers: a valid lower bound on the cycle time.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from torch_tessera.scheduler.blocks import Blocks, block_memory_ok, incident_edges, memory_binds
from torch_tessera.scheduler.problem import Problem


def _allowed(blocks: Blocks, b: int, D: int) -> list[int]:
    if blocks.pinned[b] >= 0:
        return [int(blocks.pinned[b])]
    return [g for g in range(D) if not blocks.forbidden[g]]


def greedy_cycle(pb: Problem, blocks: Blocks) -> np.ndarray:
    """Block placement by the list rule: in program order, each block goes where the running cycle time grows least
    (ties: least added work); a device whose memory budget the block would break is skipped while another fits."""
    D, B = pb.D, blocks.B
    first = np.full(B, pb.n)
    np.minimum.at(first, blocks.label, np.arange(pb.n))
    nbr: list[list[tuple[int, int, bool]]] = [[] for _ in range(B)]
    for e, (s, t) in enumerate(zip(blocks.esrc.tolist(), blocks.edst.tolist())):
        nbr[s].append((e, t, True))
        nbr[t].append((e, s, False))
    place = np.full(B, -1, dtype=np.int64)
    dev, link = np.zeros(D), np.zeros((D, D))
    dcoef = blocks.dcoef
    limited = memory_binds(pb, blocks)
    for b in np.argsort(first, kind="stable").tolist():
        best = None
        for g in _allowed(blocks, b, D):
            d2, l2 = dev.copy(), link.copy()
            d2[g] += blocks.cost[b, g]
            for e, o, out in nbr[b]:
                go = place[o]
                if go >= 0 and go != g:
                    a, c = (g, go) if out else (go, g)
                    l2[a, c] += blocks.coef[e, a, c]
                    if dcoef is not None:  # the hop's charge on both devices' timelines
                        d2[a] += dcoef[e, a, c]
                        d2[c] += dcoef[e, a, c]
            key = (max(d2.max(), l2.max()), d2.sum() + l2.sum())
            if limited:
                place[b] = g
                fits = block_memory_ok(pb, blocks, np.where(place >= 0, place, g))
                place[b] = -1
                key = (not fits,) + key
            if best is None or key < best[0]:
                best = (key, g, d2, l2)
        _, g, dev, link = best
        place[b] = g
    return place


def local_search(pb: Problem, blocks: Blocks, place: np.ndarray, deadline: float, max_iters: int = 10_000) -> np.ndarray:
    """Steepest-descent single-block moves on (cycle time, sum of squared loads); stops at a local optimum, after
    ``max_iters`` moves or at ``deadline`` (``time.perf_counter()`` seconds). Keeps pins and memory budgets.

    Every move's resource changes (:func:`_move_deltas`) are computed once, then after each move only for the moved
    block and its neighbours (the only rows a move changes), bit for bit as a full recomputation would give them; they
    are stored resources-first so that the max and the sum of squares over resources are fast element-wise
    reductions (the sum then adds in resource order, which could only reorder moves whose sums tie to the last bit;
    ``tests/scheduler/test_fast_paths.py`` checks the moves against recomputing every row with ``.sum(2)``)."""
    D, B = pb.D, blocks.B
    if D < 2 or B == 0:
        return place
    place = place.copy()
    bi = np.arange(B)
    src, dst, coef = blocks.esrc, blocks.edst, blocks.coef
    movable = np.ones((B, D), bool)
    movable[:, blocks.forbidden] = False
    pin = blocks.pinned >= 0
    movable[pin] = False
    limited = memory_binds(pb, blocks)
    nbr_ptr, nbr = _neighbours(B, src, dst)
    inc = incident_edges(blocks)
    delta = np.ascontiguousarray(_move_deltas(blocks, place, bi).transpose(2, 0, 1))  # [R, B, D]: reduce over R fast
    for _ in range(max_iters):
        if time.perf_counter() > deadline:
            break
        dev = np.bincount(place, weights=blocks.cost[bi, place], minlength=D)
        ps, pd_ = place[src], place[dst]
        cut = np.flatnonzero(ps != pd_)
        link = np.bincount(ps[cut] * D + pd_[cut], weights=coef[cut, ps[cut], pd_[cut]], minlength=D * D)
        if blocks.dcoef is not None:
            dv = blocks.dcoef[cut, ps[cut], pd_[cut]]  # as block_loads_many adds them
            dev = dev + np.bincount(np.r_[ps[cut], pd_[cut]], weights=np.r_[dv, dv], minlength=D)
        base = np.concatenate([dev, link])
        new = delta + base[:, None, None]
        score = np.maximum.reduce(new, axis=0)
        new *= new
        sq = np.add.reduce(new, axis=0)
        score[~movable] = np.inf
        score[bi, place] = np.inf
        cur_max, cur_sq = base.max(), (base ** 2).sum()
        better = (score < cur_max * (1 - 1e-9)) | ((score <= cur_max * (1 + 1e-12)) & (sq < cur_sq * (1 - 1e-9)))
        if not better.any():
            break
        cand = np.flatnonzero(better.ravel())
        order = cand[np.lexsort((sq.ravel()[cand], score.ravel()[cand]))]
        moved = -1
        for flat in order[:8]:
            b, g = divmod(int(flat), D)
            old = place[b]
            place[b] = g
            if not limited or block_memory_ok(pb, blocks, place):
                moved = b
                break
            place[b] = old
        if moved < 0:
            break
        rows = np.union1d(nbr[nbr_ptr[moved]:nbr_ptr[moved + 1]], [moved])
        delta[:, rows] = _move_deltas(blocks, place, rows, inc).transpose(2, 0, 1)
    return place


def _neighbours(B: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR adjacency of the undirected block graph: block ``b``'s neighbours are ``nbr[ptr[b]:ptr[b + 1]]``."""
    ends = np.r_[src, dst]
    other = np.r_[dst, src]
    order = np.argsort(ends, kind="stable")
    ptr = np.r_[0, np.cumsum(np.bincount(ends, minlength=B))]
    return ptr, other[order]


def _move_deltas(blocks: Blocks, place: np.ndarray, rows: np.ndarray,
                 inc: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """``[len(rows), D, D + D * D]``: the change of every resource (device loads, then links ``a * D + c``) when
    block ``rows[i]`` alone moves to device ``g``, for sorted distinct ``rows``. Each entry sums its terms in the
    order of the full computation (compute, then per end: each edge's current load removed, its new load added, in
    edge order; then, with device charges, per end: the edge's current charge removed from both its devices, its new
    charge added to both), so the rows of any subset equal those of all rows bit for bit. ``inc``: the blocks' edge
    incidence (:func:`~torch_tessera.scheduler.blocks.incident_edges`), to visit only the rows' edges."""
    D, B = blocks.cost.shape[1], blocks.B
    R = D + D * D
    src, dst, coef = blocks.esrc, blocks.edst, blocks.coef
    g_ar = np.arange(D)
    ri = np.arange(len(rows))
    local = np.full(B, -1, dtype=np.int64)
    local[rows] = ri
    out = np.zeros((len(rows), D, R))
    out[ri[:, None], g_ar[None], g_ar[None]] += blocks.cost[rows]
    out[ri, :, place[rows]] -= blocks.cost[rows, place[rows]][:, None]
    if not len(src):
        return out
    idx, val, ends = [], [], []
    near = None
    if inc is not None:  # the rows' incident edges, ascending (a superset of each end's edges below)
        ptr, edge = inc
        cnt = ptr[rows + 1] - ptr[rows]
        near = np.unique(edge[np.repeat(ptr[rows], cnt) + np.arange(int(cnt.sum()))
                              - np.repeat(np.cumsum(cnt) - cnt, cnt)])
    for end, side in ((src, 0), (dst, 1)):
        # this end's edges that touch the rows, in edge order
        e = np.flatnonzero(local[end] >= 0) if near is None else near[local[end[near]] >= 0]
        ps, pd_ = place[src[e]], place[dst[e]]
        cur = np.where(ps != pd_, coef[e, ps, pd_], 0.0)
        at = (local[end[e]][:, None] * D + g_ar[None]) * R + D  # [edges, D]: row-major, as edge by edge
        # remove the edge's current load for every target device, add its load for the new pair
        idx.append((at + (ps * D + pd_)[:, None]).ravel())
        val.append(np.repeat(-cur, D))
        oth = (pd_ if side == 0 else ps)[:, None]
        a, c = (g_ar[None], oth) if side == 0 else (oth, g_ar[None])
        idx.append((at + a * D + c).ravel())
        val.append(np.where(a != c, coef[e[:, None], a, c], 0.0).ravel())
        ends.append(e)
    if blocks.dcoef is not None:
        dcoef = blocks.dcoef
        for e, side in zip(ends, (0, 1)):
            end = src if side == 0 else dst
            ps, pd_ = place[src[e]], place[dst[e]]
            cur = np.repeat(np.where(ps != pd_, dcoef[e, ps, pd_], 0.0), D)
            at = (local[end[e]][:, None] * D + g_ar[None]) * R  # [edges, D]: row-major, as edge by edge
            oth = (pd_ if side == 0 else ps)[:, None]
            a, c = (np.broadcast_to(g_ar[None], at.shape), np.broadcast_to(oth, at.shape)) if side == 0 else \
                (np.broadcast_to(oth, at.shape), np.broadcast_to(g_ar[None], at.shape))
            new = np.where(a != c, dcoef[e[:, None], a, c], 0.0).ravel()
            idx += [(at + ps[:, None]).ravel(), (at + pd_[:, None]).ravel(), (at + a).ravel(), (at + c).ravel()]
            val += [-cur, -cur, new, new]
    out += np.bincount(np.concatenate(idx), weights=np.concatenate(val), minlength=len(rows) * D * R).reshape(
        len(rows), D, R)
    return out


def heft_latency(pb: Problem, label: np.ndarray) -> np.ndarray:
    """Kernel placement by earliest finish time, kernels in program order, a block's first kernel deciding for the
    block (pins respected). Transfers cost ``latency + bytes / bandwidth``; devices run one kernel at a time."""
    D = pb.D
    B = int(label.max()) + 1
    bdev = np.full(B, -1, dtype=np.int64)
    gp = pb.pinned[pb.group]
    bdev[label[gp >= 0]] = gp[gp >= 0]
    cap = pb.budgets - pb.reserve
    ok = [g for g in range(D) if not cap[g] < 0]
    preds: list[list[int]] = [[] for _ in range(pb.n)]
    for e, t in enumerate(pb.edst.tolist()):
        if pb.ekind[e] != "STATE":
            preds[t].append(e)
    place = np.zeros(pb.n, dtype=np.int64)
    finish = np.zeros(pb.n)
    for p in range(len(pb.programs)):
        dev_free = np.zeros(D)
        for k in pb.program_slice(p).tolist():
            cands = [int(bdev[label[k]])] if bdev[label[k]] >= 0 else ok
            best = None
            for g in cands:
                ready = 0.0
                for e in preds[k]:
                    s = pb.esrc[e]
                    t = finish[s]
                    if place[s] != g and pb.ebytes[e] > 0:
                        t += pb.hop_latency[place[s], g] + pb.ebytes[e] / pb.bw[place[s], g]
                    ready = max(ready, t)
                f = max(ready, dev_free[g]) + pb.cost[k, g]
                if best is None or (f, pb.cost[k, g]) < best[:2]:
                    best = (f, pb.cost[k, g], g)
            f, _, g = best
            place[k], finish[k] = g, f
            dev_free[g] = f
            bdev[label[k]] = g
    return place


def is_chain(pb: Problem, p: int) -> bool:
    """Whether program ``p``'s DAG is a path in program order (every edge joins consecutive kernels, all joined)."""
    ks = pb.program_slice(p)
    if len(ks) < 2:
        return True
    mask = (pb.prog[pb.esrc] == p) & (np.array(pb.ekind) != "STATE")
    s, t = pb.esrc[mask], pb.edst[mask]
    if not np.all(t - s == 1):
        return False
    return len(np.unique(s)) == len(ks) - 1


def chain_dp(pb: Problem, p: int, label: np.ndarray) -> np.ndarray | None:
    """Exact latency placement of a path-shaped program by Viterbi DP over (kernel, device).

    Returns the kernel placement of program ``p`` (``[len(program)]``), or ``None`` when a block is not a
    contiguous run of the chain (the DP cannot keep it on one device).
    """
    ks = pb.program_slice(p)
    lab = label[ks]
    seen, prev = set(), None
    for b in lab.tolist():  # blocks must be contiguous runs
        if b != prev and b in seen:
            return None
        seen.add(b)
        prev = b
    D = pb.D
    cap = pb.budgets - pb.reserve
    allowed = np.ones((len(ks), D), bool)
    allowed[:, cap < 0] = False
    gp = pb.pinned[pb.group[ks]]
    for i, g in enumerate(gp.tolist()):
        if g >= 0:
            allowed[i] = False
            allowed[i, g] = True
    hop = np.zeros((len(ks), D, D))  # hop[i]: transfer into kernel i from i-1
    mask = (pb.prog[pb.esrc] == p) & (np.array(pb.ekind) != "STATE")
    first = ks[0]
    for e in np.flatnonzero(mask).tolist():
        i = int(pb.edst[e]) - first
        if pb.ebytes[e] > 0:
            h = pb.hop_latency + pb.ebytes[e] / pb.bw
            np.fill_diagonal(h, 0.0)
            hop[i] += h
    cost = np.where(allowed, pb.cost[ks], np.inf)
    best = cost[0].copy()
    back = np.zeros((len(ks), D), dtype=np.int64)
    for i in range(1, len(ks)):
        trans = best[:, None] + hop[i]
        if lab[i] == lab[i - 1]:
            trans = np.where(np.eye(D, dtype=bool), trans, np.inf)
        back[i] = trans.argmin(0)
        best = trans.min(0) + cost[i]
    place = np.zeros(len(ks), dtype=np.int64)
    place[-1] = int(best.argmin())
    if not np.isfinite(best[place[-1]]):
        return None
    for i in range(len(ks) - 1, 0, -1):
        place[i - 1] = back[i, place[i]]
    return place


def zero_comm_bound(cost: np.ndarray, mult: np.ndarray, pinned: np.ndarray, forbidden: np.ndarray) -> float:
    """Lower bound on the cycle time with free transfers: the LP ``min T, sum_c cost[c,g] n[c,g] <= T,
    sum_g n[c,g] = mult[c], n >= 0`` (pinned classes fixed, forbidden devices unused, memory ignored).

    Args:
        cost: ``[C, D]`` seconds per step of one member of each class on each device (the least over its members).
        mult: ``[C]`` members per class (1 for plain groups).
        pinned: ``[C]`` device or -1.
        forbidden: ``[D]`` devices that may run nothing.
    """
    C, D = cost.shape
    if C == 0:
        return 0.0
    cost = np.where(np.isfinite(cost), cost, 0.0)
    scale = float((cost.min(1) * mult).sum()) or 1.0
    nv = C * D + 1
    c = np.zeros(nv)
    c[-1] = 1.0
    idx = np.arange(C * D)
    A_ub = csr_matrix((np.r_[(cost / scale).ravel(), -np.ones(D)],
                       (np.r_[np.tile(np.arange(D), C), np.arange(D)], np.r_[idx, np.full(D, nv - 1)])), shape=(D, nv))
    A_eq = csr_matrix((np.ones(C * D), (np.repeat(np.arange(C), D), idx)), shape=(C, nv))
    ub = np.repeat(mult[:, None], D, 1).astype(float)
    ub[:, forbidden] = 0.0
    lb = np.zeros((C, D))
    pin = pinned >= 0
    ub[pin] = 0.0
    ub[pin, pinned[pin]] = mult[pin]
    lb[pin, pinned[pin]] = mult[pin]
    bounds = np.stack([np.r_[lb.ravel(), 0.0], np.r_[ub.ravel(), np.inf]], 1)
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(D), A_eq=A_eq, b_eq=mult.astype(float), bounds=bounds, method="highs")
    return float(res.fun) * scale * (1 - 1e-7) if res.status == 0 else 0.0


def latency_bound(pb: Problem) -> float:
    """Lower bound on latency: per program, the longest path with each kernel at its cheapest device and no
    transfers, or the least total work spread evenly over the devices; frequency-weighted sum."""
    total = 0.0
    cmin = pb.cost.min(1)
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p)
        f = {}
        mask = (pb.prog[pb.esrc] == p) & (np.array(pb.ekind) != "STATE")
        preds: dict[int, list[int]] = {}
        for s, t in zip(pb.esrc[mask].tolist(), pb.edst[mask].tolist()):
            preds.setdefault(t, []).append(s)
        for k in ks.tolist():
            f[k] = max((f[s] for s in preds.get(k, ())), default=0.0) + cmin[k]
        cp = max(f.values(), default=0.0)
        spread = float(cmin[ks].sum()) / pb.D  # the busiest device does at least the average of the least work
        total += pb.freq[p] * max(cp, spread)
    return total * (1 - 1e-9)
