"""Whole-layer placements searched directly: each program's layers as a chain, moved an interval at a time.

Why: when cut edges charge the devices they join (:attr:`Problem.hop`), a plan pays for every boundary between two
devices inside a program, and the counts LP does not see the boundaries *between* layers (see
:func:`counts.layer_split`). ``layer_split`` searches splits seeded by the LP's shares and moves one boundary at a
time, and so misses plans no single boundary move reaches from the LP's shares, such as prefill on two devices and
decode on the other two (docs/BENCHMARKS.md, solver constants).

The search works on *units*: the groups of one (program, layer unit) (:func:`blocks.layer_units`) merged into one
block; groups outside the layers (embedding, head) and pinned groups stay blocks of their own. A program's blocks, in
the order of their first kernel, form its *chain*. A move sends one interval of a chain to one device, where the
interval starts or ends at a device boundary of the chain (or at either end): that moves a boundary by any distance,
hands a program's first or last layers to a new device, or moves a whole segment. Blocks in no chain (shared by two
programs) move one at a time. Steepest descent on (cycle time, sum of squared loads), every move of a step scored at
once from the current loads (:func:`moved_loads_batched`), from several seeds: each program wholly on one device
(every assignment, so the seeds include each device alone), and the caller's placements.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from torch_tessera.scheduler.blocks import (Blocks, aggregate, block_cycle_many, block_loads_many, block_memory_ok_many,
                                            edge_load_deltas, layer_units, memory_binds, touched_edges)
from torch_tessera.scheduler.problem import Problem

#: Interval lengths a move may have besides whole segments (between two device boundaries of a chain): roughly
#: geometric, so a boundary travels any distance in a few moves while a step scores about ten times fewer blocks
#: than with every length.
STEPS = np.unique(np.rint(1.5 ** np.arange(20)).astype(np.int64))

#: Chains longer than this many layer units are searched coarse first (:func:`chain_search`).
FINE_UNITS = 32

#: Seeds of whole programs on devices are all ``D ** P`` assignments up to this many.
MAX_WHOLE_SEEDS = 64


class Units:
    """The problem coarsened to whole layer units.

    Attributes:
        of_group: ``[G]`` unit block of each hard group.
        blocks: the problem aggregated over the unit blocks (:func:`blocks.aggregate`).
        chains: each program's unit blocks in the order of their first kernel (programs with fewer than two left
            out; blocks holding kernels of two programs are in no chain).

    Args:
        stride: layer units merged per block (``stride`` consecutive layers move together: a coarse search).
    """

    def __init__(self, pb: Problem, groups: Blocks, stride: int = 1):
        G = groups.B
        units = layer_units(pb)
        u = np.array([-1 if x is None else x // stride for x in units], dtype=np.int64)
        span = int(u.max()) + 2 if len(u) else 1
        pinned = groups.pinned[pb.group] >= 0
        node = np.where((u >= 0) & ~pinned, G + pb.prog * span + u, pb.group)  # a kernel joins its group and unit
        nn = G + len(pb.programs) * span
        _, comp = connected_components(coo_matrix((np.ones(pb.n), (pb.group, node)), shape=(nn, nn)), directed=False)
        _, self.of_group = np.unique(comp[:G], return_inverse=True)
        kb = self.of_group[pb.group]
        self.blocks = aggregate(pb, kb)
        B = self.blocks.B
        first = np.full(B, pb.n)
        np.minimum.at(first, kb, np.arange(pb.n))
        bprog = pb.prog[first]
        shared = np.zeros(B, dtype=bool)
        shared[kb[pb.prog != bprog[kb]]] = True
        self.chains = []
        for p in range(len(pb.programs)):
            bs = np.flatnonzero((bprog == p) & ~shared)
            if len(bs) >= 2:
                self.chains.append(bs[np.argsort(first[bs], kind="stable")])

    def of(self, gp: np.ndarray) -> np.ndarray:
        """Unit placement ``[B]`` of a group placement ``[G]`` (each unit block where most of its groups are)."""
        B, D = self.blocks.B, self.blocks.cost.shape[1]
        w = np.zeros((B, D))
        np.add.at(w, (self.of_group, gp), 1.0)
        return w.argmax(1)

    def expand(self, up: np.ndarray) -> np.ndarray:
        """Group placement ``[G]`` of a unit placement ``[B]``."""
        return up[self.of_group]


def interval_moves(units: Units, up: np.ndarray, max_len: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Every interval move of ``up`` (module docstring) and every single move of a block in no chain, as
    ``(move, block, to, M)`` entries for :func:`moved_loads_batched` (blocks already on the target device, pinned
    ones and forbidden devices left out; moves left empty dropped); ``max_len``: only intervals of at most that many
    blocks."""
    ub = units.blocks
    D = ub.cost.shape[1]
    free = ub.pinned < 0
    ok = ~ub.forbidden
    move, block, to = [], [], []
    m = 0
    for ch in units.chains:
        x = up[ch]
        U = len(ch)
        anchors = np.flatnonzero(np.r_[True, x[1:] != x[:-1], True])
        lo = np.concatenate([np.full(U - a, a) for a in anchors] + [np.arange(a) for a in anchors])
        hi = np.concatenate([np.arange(a + 1, U + 1) for a in anchors] + [np.full(a, a) for a in anchors])
        key = np.unique(lo * (U + 1) + hi)
        lo, hi = key // (U + 1), key % (U + 1)
        keep = np.isin(hi - lo, STEPS) | np.isin(lo, anchors) & np.isin(hi, anchors)
        if max_len is not None:
            keep &= hi - lo <= max_len
        lo, hi = lo[keep], hi[keep]
        size = hi - lo
        pos = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size) + np.repeat(lo, size)
        ivl = np.repeat(np.arange(len(lo)), size)
        b = ch[pos]
        for g in np.flatnonzero(ok).tolist():
            sel = (up[b] != g) & free[b]
            move.append(m + ivl[sel] * D + g)
            block.append(b[sel])
            to.append(np.full(int(sel.sum()), g))
        m += len(lo) * D
    inchain = np.zeros(ub.B, dtype=bool)
    for ch in units.chains:
        inchain[ch] = True
    single = np.flatnonzero(~inchain & free)
    for g in np.flatnonzero(ok).tolist():
        s = single[up[single] != g]
        move.append(m + np.arange(len(s)))
        block.append(s)
        to.append(np.full(len(s), g))
        m += len(s)
    move, block, to = np.concatenate(move), np.concatenate(block), np.concatenate(to)
    ids, move = np.unique(move, return_inverse=True)
    return move.reshape(-1), block, to, len(ids)


def moved_loads_batched(blocks: Blocks, bplaces: np.ndarray, mseed: np.ndarray, move: np.ndarray,
                        group: np.ndarray, to: np.ndarray, dev: np.ndarray, link: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`blocks.moved_loads_many` for moves from several placements at once: move ``m`` starts from
    ``bplaces[mseed[m]]``, whose loads are ``dev[mseed[m]]`` and ``link[mseed[m]]``.

    Args:
        blocks: the aggregated problem.
        bplaces: ``[S, B]`` current placements.
        mseed: ``[M]`` placement each move starts from.
        move / group / to: ``[K]`` move index, block and its new device, one entry per moved block.
        dev / link: ``[S, D]`` and ``[S, D * D]`` loads of ``bplaces``.

    Returns:
        ``([M, D], [M, D * D])`` device and link loads after each move alone.
    """
    D, E, B = blocks.cost.shape[1], len(blocks.esrc), blocks.B
    M = len(mseed)
    old = bplaces[mseed[move], group]
    ddev = np.bincount(move * D + to, weights=blocks.cost[group, to], minlength=M * D)
    ddev -= np.bincount(move * D + old, weights=blocks.cost[group, old], minlength=M * D)
    dev1 = dev[mseed] + ddev.reshape(M, D)
    link1 = link[mseed]
    if not E or not len(group):
        return dev1, link1
    em, e, moved, dest = touched_edges(blocks, move, group, to)
    base = bplaces[mseed[em]]

    def where(end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # an edge end's device before and after its move
        k = em * B + end
        i = np.minimum(np.searchsorted(moved, k), len(moved) - 1)
        before = base[np.arange(len(em)), end]
        return before, np.where(moved[i] == k, dest[i], before)

    (a0, a1), (b0, b1) = where(blocks.esrc[e]), where(blocks.edst[e])
    ddev, dlink = edge_load_deltas(blocks, e, em, (a0, b0), (a1, b1), M)
    return dev1 + ddev, link1 + dlink


def interval_descent(pb: Problem, units: Units, ups: np.ndarray, deadline: float, max_steps: int = 200,
                     max_len: int | None = None) -> np.ndarray:
    """Steepest descent of each unit placement of ``ups`` (``[S, B]``) over :func:`interval_moves` (intervals up to
    ``max_len`` blocks) on (cycle time, sum of squared loads), until no move improves, ``max_steps`` moves or
    ``deadline``; all placements step together (one scoring call per step). Moves that break a memory budget are not
    taken. Returns the ``[S, B]`` placements reached (a placement that reaches another's is dropped: rows may be
    fewer)."""
    from torch_tessera.scheduler.counts import load_key

    ub = units.blocks
    ups = np.unique(np.atleast_2d(np.asarray(ups, dtype=np.int64)), axis=0)
    binds = memory_binds(pb, ub)
    dev, link = block_loads_many(ub, ups)
    key = load_key(dev, link)
    active = np.ones(len(ups), dtype=bool)
    for _ in range(max_steps):
        if time.perf_counter() > deadline or not active.any():
            break
        parts, mseed, m = [], [], 0
        for s in np.flatnonzero(active).tolist():
            move, block, to, M = interval_moves(units, ups[s], max_len)
            parts.append((move + m, block, to))
            mseed.append(np.full(M, s))
            m += M
        if not m:
            break
        move, block, to = (np.concatenate(x) for x in zip(*parts))
        mseed = np.concatenate(mseed)
        k = load_key(*moved_loads_batched(ub, ups, mseed, move, block, to, dev, link))
        cur = key[:, mseed]
        better = (k[0] < cur[0] * (1 - 1e-9)) | ((k[0] <= cur[0] * (1 + 1e-12)) & (k[1] < cur[1] * (1 - 1e-9)))
        cand = np.flatnonzero(better)
        cand = cand[np.lexsort((k[1][cand], k[0][cand]))]
        if binds and len(cand):
            trials = ups[mseed[cand]]
            for i, t in enumerate(cand.tolist()):
                sel = move == t
                trials[i, block[sel]] = to[sel]
            cand = cand[block_memory_ok_many(pb, ub, trials)]
        stepped = np.zeros(len(ups), dtype=bool)
        for t in cand.tolist():  # each placement's best move
            s = int(mseed[t])
            if not stepped[s]:
                sel = move == t
                ups[s, block[sel]] = to[sel]
                stepped[s] = True
        active &= stepped
        if stepped.any():
            dev[stepped], link[stepped] = block_loads_many(ub, ups[stepped])  # exact sums again
            key = load_key(dev, link)
            _, first = np.unique(ups, axis=0, return_index=True)
            dup = np.ones(len(ups), dtype=bool)
            dup[first] = False
            active &= ~dup
    _, first = np.unique(ups, axis=0, return_index=True)
    return ups[np.sort(first)]


def whole_program_seeds(units: Units, base: np.ndarray) -> list[np.ndarray]:
    """Unit placements with every chain wholly on one device, each assignment of chains to allowed devices (up to
    :data:`MAX_WHOLE_SEEDS`, else each device for all chains); other blocks as in ``base``, pins kept."""
    ub = units.blocks
    devs = np.flatnonzero(~ub.forbidden).tolist()
    P = len(units.chains)
    combos = (itertools.product(devs, repeat=P) if len(devs) ** P <= MAX_WHOLE_SEEDS
              else [(g,) * P for g in devs])
    out = []
    for combo in combos:
        up = base.copy()
        for ch, g in zip(units.chains, combo):
            up[ch] = g
        up[ub.pinned >= 0] = ub.pinned[ub.pinned >= 0]
        out.append(up)
    return out


def chain_search(pb: Problem, groups: Blocks, seeds: list[np.ndarray], deadline: float, top: int = 2,
                 units: Units | None = None) -> list[np.ndarray]:
    """Whole-layer group placements from :func:`interval_descent` started at every whole-program seed and at each
    group placement of ``seeds`` (seen as units: each unit where most of its groups are); the ``top`` best distinct
    ones that fit the memory budgets, least cycle time first (``[]`` when no program has two units, or no seed fits
    the budgets: the descent only takes moves that keep them).

    Programs of more than :data:`FINE_UNITS` layers are first searched with layers merged in runs of ``stride``
    (:class:`Units`), then the best ``top`` results again layer by layer with intervals up to ``stride`` long (on
    Mamba-2.8B's 64 layers: 2 s for every seed layer by layer, 0.14 s this way, the same best plan).

    Args:
        pb: the problem.
        groups: the problem aggregated over its hard groups.
        seeds: ``[G]`` group placements (the first also places the blocks outside chains in the whole seeds).
        deadline: ``time.perf_counter()`` time after which the descents stop where they are.
        top: how many placements to return.
        units: the layer-by-layer coarsening, when the caller has it.
    """
    units = units or Units(pb, groups)
    if not units.chains or pb.D < 2:
        return []
    longest = max(len(ch) for ch in units.chains)
    stride = -(-longest // FINE_UNITS)
    coarse = Units(pb, groups, stride) if stride > 1 else units
    starts = [coarse.of(np.asarray(s, dtype=np.int64)) for s in seeds]
    starts += whole_program_seeds(coarse, starts[0] if starts else np.zeros(coarse.blocks.B, dtype=np.int64))
    starts = np.stack(starts)
    starts = starts[block_memory_ok_many(pb, coarse.blocks, starts)]  # the descent keeps budgets, from where they hold
    if not len(starts):
        return []
    ups = interval_descent(pb, coarse, starts, deadline)
    if stride > 1:
        best = np.argsort(block_cycle_many(coarse.blocks, ups), kind="stable")[:top]
        ups = interval_descent(pb, units, np.stack([units.of(coarse.expand(ups[i])) for i in best.tolist()]),
                               deadline, max_len=stride)
    ub = units.blocks
    ups = ups[block_memory_ok_many(pb, ub, ups)]
    vals = block_cycle_many(ub, ups)
    return [units.expand(ups[i]) for i in np.argsort(vals, kind="stable")[:top].tolist()]
