"""The throughput plan's second objective: among placements of (nearly) the same cycle time, move fewer bytes.

The throughput model counts a transfer only as load on its link, overlapped with compute by micro-batching; while no
link binds, a plan that copies gigabytes per step scores the same as one that copies nothing. Executed, the copies are
not free: they take copy-engine time and memory bandwidth the model does not charge (docs/BENCHMARKS.md, transfer
trimming), while moving, say, a KV cache's update next to its reader costs the model only that update's time.

:func:`trim_transfers` takes a plan and moves single groups (hard groups: a STATE buffer's writers, an unsure kernel
and its neighbour) to another device while the total link load falls and the cycle time stays under a limit
(:func:`trim_limit`: within a tolerance of the plan's, and within the solver's gap to its bound), so the plan keeps
its objective and sheds the transfers it does not need.
"""

from __future__ import annotations

import time

import numpy as np

from torch_tessera.scheduler.blocks import (Blocks, block_cycle_many, block_loads_many, block_memory_ok_many,
                                            moved_loads_many)

#: Cluster moves are tried for this many of the heaviest cut edges per pass, over clusters of at most ``CLUSTER_MAX``
#: groups joined by edges at least ``CLUSTER_SHARE`` as heavy as the cut edge.
CLUSTER_EDGES, CLUSTER_MAX, CLUSTER_SHARE = 32, 16, 0.25

#: Cut edges lighter than this share of the cycle time are not worth a move (they also keep the search short: on
#: real DAGs most cut edges carry a few kilobytes).
MIN_SHARE = 1e-3

#: Passes over the candidate moves (each pass scores every candidate move from the pass's starting loads, then applies
#: the improving ones in order of bytes saved, re-checking each against the moves applied before it).
PASSES = 2


def trim_transfers(blocks: Blocks, bplace: np.ndarray, limit: float, deadline: float,
                   pb=None) -> tuple[np.ndarray, float, float]:
    """Move groups so that the plan transfers less without raising its cycle time above ``limit``.

    Args:
        blocks: the problem aggregated over its hard groups (:func:`~torch_tessera.scheduler.blocks.aggregate`).
        bplace: ``[B]`` device of each group in the plan.
        limit: the highest cycle time (seconds per workload step) a moved plan may have (see :func:`trim_limit`).
        deadline: ``time.perf_counter()`` value after which no further pass starts.
        pb: the :class:`~torch_tessera.scheduler.problem.Problem`, to keep memory budgets (``None``: not checked).

    Returns:
        ``(placement, cycle seconds, link seconds saved per workload step)``; the input placement when no move helps.
    """
    place = np.asarray(bplace, dtype=np.int64).copy()
    D = blocks.cost.shape[1]
    if D < 2 or len(blocks.esrc) == 0:
        return place, float(block_cycle_many(blocks, place[None])[0]), 0.0
    allowed = ~blocks.forbidden

    def score(places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dev, link = block_loads_many(blocks, places)
        return np.maximum(dev.max(1), link.max(1)), link.sum(1)

    cycle0, traffic0 = score(place[None])
    cur_cycle, cur_traffic = float(cycle0[0]), float(traffic0[0])
    start_traffic = cur_traffic
    weight = blocks.coef.reshape(len(blocks.esrc), -1).max(1)  # seconds per step an edge costs when cut
    if not ((place[blocks.esrc] != place[blocks.edst]) & (weight >= MIN_SHARE * cur_cycle)).any():
        return place, cur_cycle, 0.0  # nothing heavy is cut
    nbrs = _Adjacency(blocks)
    for _ in range(PASSES):
        if time.perf_counter() > deadline or cur_traffic <= 0:
            break
        moves = _moves(blocks, place, weight, nbrs, allowed, MIN_SHARE * cur_cycle)
        if not moves:
            break
        dev, link = (x[0] for x in block_loads_many(blocks, place[None]))
        cyc, traffic = _score_moves(blocks, place, moves, dev, link)
        good = np.flatnonzero((cyc <= limit) & (traffic < cur_traffic * (1 - 1e-9)))
        if pb is not None and len(good):
            trial = np.repeat(place[None], len(good), axis=0)
            for i, k in enumerate(good.tolist()):
                trial[i, moves[k][0]] = moves[k][1]
            good = good[block_memory_ok_many(pb, blocks, trial)]
        if not len(good):
            break
        order = good[np.argsort(traffic[good])][:CLUSTER_EDGES].tolist()
        start = place
        new_place = _apply(blocks, nbrs, moves, order, place, cur_traffic, limit, None, deadline)
        if pb is not None and not block_memory_ok_many(pb, blocks, new_place[None])[0]:
            # each move fitted alone, together they do not: apply them again, checking memory after each
            new_place = _apply(blocks, nbrs, moves, order, place, cur_traffic, limit, pb, deadline)
        place = new_place
        if (place == start).all():
            break
        cycle1, traffic1 = score(place[None])  # exact sums again (the deltas above accumulate rounding)
        cur_cycle, cur_traffic = float(cycle1[0]), float(traffic1[0])
    return place, cur_cycle, start_traffic - cur_traffic


def _apply(blocks: Blocks, nbrs: "_Adjacency", moves: list, order: list[int], place: np.ndarray, traffic: float,
           limit: float, pb, deadline: float) -> np.ndarray:
    """Apply ``moves[k]`` for ``k`` in ``order`` one after another, each only if it still lowers the total link load
    and keeps the cycle time within ``limit`` (and, with ``pb``, the memory budgets) after the ones applied before."""
    dev, link = (x[0] for x in block_loads_many(blocks, place[None]))
    for k in order:
        gs, d = moves[k]
        if (place[gs] == d).all():
            continue
        new = place.copy()
        new[gs] = d
        dev1, link1 = _moved_loads(blocks, nbrs, place, new, gs, dev, link)
        c1, t1 = max(dev1.max(), link1.max()), link1.sum()
        if c1 <= limit and t1 < traffic * (1 - 1e-9) and (
                pb is None or block_memory_ok_many(pb, blocks, new[None])[0]):
            place, dev, link, traffic = new, dev1, link1, float(t1)
        if time.perf_counter() > deadline:
            break
    return place


def _moved_loads(blocks: Blocks, nbrs: "_Adjacency", old: np.ndarray, new: np.ndarray, gs: np.ndarray,
                 dev: np.ndarray, link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device loads ``[D]`` and link loads ``[D * D]`` after moving groups ``gs`` (placement ``old`` -> ``new``),
    updated from ``dev`` / ``link`` over the moved groups' costs and incident edges only (with their device charges,
    ``blocks.dcoef``)."""
    D = blocks.cost.shape[1]
    dev, link = dev.copy(), link.copy()
    np.subtract.at(dev, old[gs], blocks.cost[gs, old[gs]])
    np.add.at(dev, new[gs], blocks.cost[gs, new[gs]])
    edges = np.unique(np.concatenate([nbrs.edges_of(g) for g in gs.tolist()]))
    if len(edges):
        a, b = blocks.esrc[edges], blocks.edst[edges]
        for pl, sign in ((old, -1.0), (new, 1.0)):
            pa, pb = pl[a], pl[b]
            cut = pa != pb
            np.add.at(link, pa[cut] * D + pb[cut], sign * blocks.coef[edges[cut], pa[cut], pb[cut]])
            if blocks.dcoef is not None:
                dv = sign * blocks.dcoef[edges[cut], pa[cut], pb[cut]]
                np.add.at(dev, np.r_[pa[cut], pb[cut]], np.r_[dv, dv])
    return dev, link


def _score_moves(blocks: Blocks, place: np.ndarray, moves: list[tuple[np.ndarray, int]], dev: np.ndarray,
                 link: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cycle time ``[M]`` and total link load ``[M]`` (seconds per step) after each move alone, all at once from the
    current loads ``dev`` / ``link`` (:func:`~torch_tessera.scheduler.blocks.moved_loads_many`); the moves taken are
    applied and re-checked one by one by :func:`_apply`."""
    size = np.array([len(gs) for gs, _ in moves], dtype=np.int64)
    group = np.concatenate([gs for gs, _ in moves]).astype(np.int64)
    to = np.repeat(np.array([d for _, d in moves], dtype=np.int64), size)
    dev1, link1 = moved_loads_many(blocks, place, np.repeat(np.arange(len(moves)), size), group, to, len(moves),
                                   dev, link)
    return np.maximum(dev1.max(1), link1.max(1)), link1.sum(1)


class _Adjacency:
    """Neighbours of each group over the aggregated edges, as ``(group, edge)`` pairs (CSR arrays, built once)."""

    def __init__(self, blocks: Blocks) -> None:
        E = len(blocks.esrc)
        ends = np.concatenate([blocks.esrc, blocks.edst])
        self.other = np.concatenate([blocks.edst, blocks.esrc])
        self.edge = np.concatenate([np.arange(E), np.arange(E)])
        self.order = np.argsort(ends, kind="stable")
        self.ptr = np.searchsorted(ends[self.order], np.arange(blocks.B + 1))
        self._heavy: tuple | None = None  # (weight, floor, lists) of the last heavy() call

    def edges_of(self, g: int) -> np.ndarray:
        return self.edge[self.order[self.ptr[g]:self.ptr[g + 1]]]

    def heavy(self, weight: np.ndarray, floor: float) -> tuple[list[tuple[float, int]], list[int]]:
        """Every group's ``(edge weight, neighbour)`` pairs over edges of weight at least ``floor`` (or a lower floor:
        the lists of an earlier call with the same ``weight`` are reused), heaviest first: group ``g``'s are
        ``pairs[ptr[g]:ptr[g + 1]]`` (Python lists, for the cluster search's loop)."""
        if self._heavy is not None and self._heavy[0] is weight and self._heavy[1] <= floor:
            return self._heavy[2]
        ends = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))  # self.order is grouped by end
        w = weight[self.edge[self.order]]
        keep = np.flatnonzero(w >= floor)  # on real DAGs most edges carry a few kilobytes
        o = keep[np.lexsort((-w[keep], ends[keep]))]  # by group, heaviest first
        ptr = np.r_[0, np.cumsum(np.bincount(ends[o], minlength=len(self.ptr) - 1))]
        out = list(zip(w[o].tolist(), self.other[self.order][o].tolist())), ptr.tolist()
        self._heavy = (weight, floor, out)
        return out

    def of(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """``(neighbour groups, edges)`` of group ``g``, one entry per incident edge."""
        idx = self.order[self.ptr[g]:self.ptr[g + 1]]
        return self.other[idx], self.edge[idx]


def _moves(blocks: Blocks, place: np.ndarray, weight: np.ndarray, nbrs: _Adjacency, allowed: np.ndarray,
           min_weight: float) -> list[tuple[np.ndarray, int]]:
    """Candidate moves ``(groups, device)`` around the ``CLUSTER_EDGES`` heaviest cut edges (those costing at least
    ``min_weight`` seconds per step): each group at either end, alone to every other device; and the *cluster* at
    either end to the other end's device: the groups on that end's
    device joined to it by edges at least ``CLUSTER_SHARE`` as heavy as the cut. A single move cannot shed a cut
    inside a chain of heavy edges (KV-cache update -> cache read -> attention: moving either kernel alone only moves
    the cut), a cluster move can."""
    D = blocks.cost.shape[1]
    cut = np.flatnonzero((place[blocks.esrc] != place[blocks.edst]) & (weight >= min_weight))
    cut = cut[np.argsort(-weight[cut], kind="stable")][:CLUSTER_EDGES]  # the heaviest cuts: where bytes are shed
    free = blocks.pinned < 0
    ends = np.unique(np.concatenate([blocks.esrc[cut], blocks.edst[cut]]))
    moves = [(np.array([g]), d) for g in ends[free[ends]].tolist() for d in range(D) if d != place[g] and allowed[d]]
    seen: set[tuple[tuple[int, ...], int]] = set()
    at = place.tolist()
    heavy, ptr = nbrs.heavy(weight, CLUSTER_SHARE * min_weight)  # the lightest edge any cluster below can use

    for e in cut.tolist():
        for start, target in ((int(blocks.esrc[e]), int(place[blocks.edst[e]])),
                              (int(blocks.edst[e]), int(place[blocks.esrc[e]]))):
            if not allowed[target]:
                continue
            # the groups on start's device joined to it by edges >= cutoff; the set does not depend on the order
            # they are visited in (all of them, or more than CLUSTER_MAX: not a move)
            home, cutoff = at[start], CLUSTER_SHARE * weight[e]
            comp, todo = {start}, [start]
            while todo and len(comp) <= CLUSTER_MAX:
                g = todo.pop()
                for w, h in heavy[ptr[g]:ptr[g + 1]]:
                    if w < cutoff:
                        break
                    if at[h] == home and h not in comp:
                        comp.add(h)
                        todo.append(h)
            key = (tuple(sorted(comp)), target)
            if 1 < len(comp) <= CLUSTER_MAX and free[list(comp)].all() and key not in seen:
                seen.add(key)
                moves.append((np.array(key[0]), target))
    return moves


def trim_limit(value: float, bound: float, tolerance: float, mip_gap: float) -> float:
    """Cycle time a trimmed plan may reach: ``value * (1 + tolerance)``, but never so far that a plan within
    ``mip_gap`` of the lower ``bound`` falls outside it (the solver's promise stands), and never below ``value``."""
    cap = bound / (1 - mip_gap) * (1 - 1e-9) if 0 < bound and mip_gap < 1 else np.inf
    return max(value, min(value * (1 + tolerance), cap))
