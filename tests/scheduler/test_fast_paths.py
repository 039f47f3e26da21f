"""The scheduler's batched / vectorised scoring against the per-placement, per-buffer loops it replaced.

Each reference below is the earlier implementation, kept here verbatim in spirit (loops over buffers, placements,
candidates), so that a fast path that drifts from the documented model fails here, not in a plan's quality.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from torch_tessera.scheduler import Workload
from torch_tessera.scheduler.baselines import _layer_dp
from torch_tessera.scheduler.blocks import (aggregate, block_cycle, block_cycle_many, block_memory_ok,
                                            block_memory_ok_many, tie_layers)
from torch_tessera.scheduler.counts import (realize, round_counts, shift_search, solve_counts,
                                            split_by_cost, tied_classes, unit_orders)
from torch_tessera.scheduler.evaluate import (cycle_many, cycle_seconds, fits_many, link_coef, loads, makespans,
                                              memory, memory_ok, resident_bytes)
from torch_tessera.scheduler.problem import _temp_peak, compile_problem
from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag



def _problem(D: int, tight: bool = False, hop: bool = False):
    """Prefill + decode of a 4-layer transformer with a KV cache (STATE shared by name), ``D`` devices; ``tight``:
    budgets that about half of :func:`_placements` fit; ``hop``: cut edges also charge the devices they join (a
    per-hop overhead and exposed copy time, different per device pair)."""
    devs = ("big", "small", "mid", "big2")[:D]
    peaks = {"big2": (800e12, 4.2e12, 4e-6)}
    from torch_tessera.scheduler.synthetic import DEVICE_PEAKS

    peaks.update(DEVICE_PEAKS)
    pre = transformer_dag(layers=4, tokens=256, context=1024, rope_tables=True, unlabelled_boundary=True)
    dec = transformer_dag(layers=4, tokens=16, context=1024, rope_tables=True, unlabelled_boundary=True)
    wl = Workload.llm(pre, roofline_costs(pre, devs, peaks=peaks), dec, roofline_costs(dec, devs, seed=1, peaks=peaks),
                      8.0)
    tp = nvlink_topology(devs)
    if hop:
        from dataclasses import replace

        rng = np.random.default_rng(D)
        tp = replace(tp, hop_overhead=rng.uniform(20e-6, 80e-6, (D, D)), copy_exposure=rng.uniform(0.2, 0.8, (D, D)))
    pb = compile_problem(wl, tp, micro_batches=2)
    if not tight:
        return pb
    peak = [ref_resident_bytes(pb, place).max() for place in _placements(pb, 40, seed=D)]
    return compile_problem(wl, tp, micro_batches=2, memory_budgets=[pb.reserve + np.median(peak)] * D)


def _placements(pb, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.integers(0, pb.D, size=(count, int(pb.group.max()) + 1))[:, pb.group]  # groups kept together
    out[0] = 0  # one device only
    return out


# -- references: the per-buffer / per-placement loops -------------------------------------------------------------

def ref_resident_bytes(pb, place):
    out = np.zeros(pb.D)
    for r in pb.resident:
        out[np.unique(place[r.holders])] += r.nbytes
    return out


def ref_memory_ok(pb, place):
    if np.isinf(pb.budgets).all():
        return True
    used = ref_resident_bytes(pb, place)
    on = np.bincount(place, minlength=pb.D) > 0
    return bool(np.all(~on | (used + pb.reserve <= pb.budgets * (1 + 1e-9))))


def ref_device_charges(D, a, b, charge):
    """Each cut edge's charge added to its source device, then (a second pass) to its destination device, in edge
    order: the documented model, in the order the fast paths sum it."""
    out = np.zeros(D)
    for x, c in zip(a, charge):
        out[x] += c
    for y, c in zip(b, charge):
        out[y] += c
    return out


def ref_loads(pb, place):
    dev = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=pb.D).astype(np.float64)
    link = np.zeros((pb.D, pb.D))
    a, b = place[pb.esrc], place[pb.edst]
    cut = (a != b) & (pb.ewbytes > 0)
    np.add.at(link, (a[cut], b[cut]), link_coef(pb)[np.flatnonzero(cut), a[cut], b[cut]])
    if pb.charges_devices and cut.any():  # every cut edge but the STATE hand-overs, at its ends
        e = np.flatnonzero(cut)
        hops = pb.ewcount[e] * pb.hop[a[cut], b[cut]] + pb.ewbytes[e] * pb.expose[a[cut], b[cut]] / pb.bw[a[cut], b[cut]]
        hops[np.array([pb.ekind[i] == "STATE" for i in e], dtype=bool)] = 0.0
        dev = dev + ref_device_charges(pb.D, a[cut], b[cut], hops)
    return dev, link


def ref_memory(pb, place):
    weight, state, act = np.zeros(pb.D), np.zeros(pb.D), np.zeros(pb.D)
    names = [[] for _ in range(pb.D)]
    for r in pb.resident:
        on = np.unique(place[r.holders])
        target = weight if r.kind == "parameter" else state if r.kind == "state" else act
        target[on] += r.nbytes
        if r.kind == "parameter":
            for g in on:
                names[g].append(r.name)
    peak = np.zeros(pb.D)
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p)
        for g in range(pb.D):
            mine = ks[place[ks] == g]
            if len(mine):
                peak[g] = max(peak[g], _temp_peak(mine.tolist(), pb.reads, pb.writes, pb.temp_bytes[p]))
    return weight, state, act + peak, [sorted(n) for n in names]


def ref_makespans(pb, place):
    preds = [[] for _ in range(pb.n)]
    for e, t in enumerate(pb.edst.tolist()):
        if pb.ekind[e] != "STATE":
            preds[t].append(e)
    finish = np.zeros(pb.n)
    out = np.zeros(len(pb.programs))
    for p in range(len(pb.programs)):
        dev_free = [0.0] * pb.D
        link_free = np.zeros((pb.D, pb.D))
        for k in pb.program_slice(p).tolist():
            d = place[k]
            ready = 0.0
            for e in preds[k]:
                s = pb.esrc[e]
                t = finish[s]
                if place[s] != d and pb.ebytes[e] > 0:
                    start = max(t, link_free[place[s], d])
                    # the link's latency plus the per-hop charge (Problem.hop_latency), then the bytes
                    t = start + (pb.alpha[place[s], d] + pb.hop[place[s], d]) + pb.ebytes[e] / pb.bw[place[s], d]
                    link_free[place[s], d] = t
                ready = max(ready, t)
            finish[k] = max(ready, dev_free[d]) + pb.cost[k, d]
            dev_free[d] = finish[k]
            out[p] = max(out[p], finish[k])
    return out


def ref_block_dev(blocks, bplace):
    D = blocks.cost.shape[1]
    dev = np.bincount(bplace, weights=blocks.cost[np.arange(blocks.B), bplace], minlength=D)
    a, b = bplace[blocks.esrc], bplace[blocks.edst]
    cut = a != b
    if blocks.dcoef is not None and cut.any():
        dev = dev + ref_device_charges(D, a[cut], b[cut], blocks.dcoef[np.flatnonzero(cut), a[cut], b[cut]])
    return dev


def ref_block_cycle(blocks, bplace):
    D = blocks.cost.shape[1]
    dev = ref_block_dev(blocks, bplace)
    link = np.zeros((D, D))
    a, b = bplace[blocks.esrc], bplace[blocks.edst]
    cut = a != b
    np.add.at(link, (a[cut], b[cut]), blocks.coef[np.flatnonzero(cut), a[cut], b[cut]])
    return float(max(dev.max(), link.max()))


def ref_block_memory_ok(pb, blocks, bplace):
    used = np.zeros(pb.D)
    for nb, h in zip(blocks.res_bytes, blocks.res_holders):
        used[np.unique(bplace[h])] += nb
    on = np.bincount(bplace, minlength=pb.D) > 0
    return bool(np.all(~on | (used + pb.reserve <= pb.budgets * (1 + 1e-9))))


def ref_realize(pb, groups, cls, counts, ok):
    D = pb.D
    dorders = list(itertools.permutations(range(D))) if D <= 4 else [tuple(range(D))]
    known = cls.unit >= 0
    ranks = unit_orders(np.unique(cls.unit[known]))
    cands = []
    for rank in ranks.values():
        key = np.where(known, rank[np.maximum(cls.unit, 0)], -1)
        ordered = [mem[np.argsort(key[mem], kind="stable")] for mem in cls.members]
        for dorder in dorders:
            gp = np.zeros(groups.B, dtype=np.int64)
            for c, mem in enumerate(ordered):
                seq = np.repeat(np.array(dorder), counts[c, list(dorder)])
                seq = seq[:len(mem)] if len(seq) >= len(mem) else np.r_[seq, np.full(len(mem) - len(seq), dorder[0])]
                gp[mem] = seq
            cands.append((ref_block_cycle(groups, gp), gp))
    cands.sort(key=lambda x: x[0])
    for _, gp in cands:
        if ok(gp):
            return gp
    return cands[0][1]


def ref_loads_key(groups, gp):
    D = groups.cost.shape[1]
    dev = ref_block_dev(groups, gp)
    link = np.zeros(D * D)
    a, b = gp[groups.esrc], gp[groups.edst]
    cut = a != b
    np.add.at(link, a[cut] * D + b[cut], groups.coef[np.flatnonzero(cut), a[cut], b[cut]])
    allr = np.r_[dev, link]
    return float(allr.max()), float((allr ** 2).sum())


def ref_shift_search(groups, cls, gp, ok):
    gp = gp.copy()
    key = ref_loads_key(groups, gp)
    improved = True
    while improved:
        improved = False
        for c, mem in enumerate(cls.members):
            if len(mem) < 2 or len(np.unique(gp[mem])) < 2:
                continue
            for step in (1, -1):
                trial = gp.copy()
                trial[mem] = np.roll(gp[mem], step)
                k = ref_loads_key(groups, trial)
                if (k[0] < key[0] * (1 - 1e-9) or (k[0] <= key[0] * (1 + 1e-12) and k[1] < key[1] * (1 - 1e-9))) \
                        and ok(trial):
                    gp, key, improved = trial, k, True
                    break
    return gp


def ref_layer_dp(seq, pre, cross, U, unit):
    k = len(seq)
    best = np.full((k, U + 1), np.inf)
    arg = np.zeros((k, U + 1), dtype=np.int64)
    best[0, 1:] = pre[1:, seq[0]] - pre[0, seq[0]]
    for s in range(1, k):
        g, gp = seq[s], seq[s - 1]
        for i in range(s + 1, U + 1):
            j = np.arange(s, i)
            val = np.maximum.reduce([best[s - 1, j], pre[i, g] - pre[j, g], cross[j, gp, g]])
            arg[s, i] = j[int(val.argmin())]
            best[s, i] = val.min()
    bounds = [U]
    for s in range(k - 1, 0, -1):
        bounds.append(int(arg[s, bounds[-1]]))
    stage = np.searchsorted(np.array(bounds[::-1]), unit, side="right")
    return np.array(seq, dtype=np.int64)[np.minimum(stage, k - 1)]


# -- tests ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("D", [2, 3, 4])
def test_resident_bytes_and_memory_match_per_buffer_loops(D):
    pb = _problem(D, tight=True)
    places = _placements(pb, 40, seed=D)
    many = resident_bytes(pb, places)
    fits = fits_many(pb, places)
    for i, place in enumerate(places):
        ref = ref_resident_bytes(pb, place)
        assert np.array_equal(resident_bytes(pb, place), ref)
        assert np.array_equal(many[i], ref)
        assert fits[i] == memory_ok(pb, place) == ref_memory_ok(pb, place)
        w, s, a, names = ref_memory(pb, place)
        m = memory(pb, place)
        assert np.array_equal(m["weight"], w) and np.array_equal(m["state"], s)
        assert np.array_equal(m["activation"], a) and m["weights"] == names
    assert fits.any() and not fits.all()


@pytest.mark.parametrize("hop", [False, True])
@pytest.mark.parametrize("D", [2, 4])
def test_cycle_times_of_many_placements_match_one_at_a_time(D, hop):
    pb = _problem(D, hop=hop)
    places = _placements(pb, 30, seed=10 + D)
    cyc = cycle_many(pb, places)
    for i, place in enumerate(places):
        dev, link = ref_loads(pb, place)
        d2, l2 = loads(pb, place)
        assert np.array_equal(dev, d2) and np.array_equal(link, l2)  # same sums in the same order: bit for bit
        assert cyc[i] == cycle_seconds(pb, place) == max(dev.max(), link.max())


@pytest.mark.parametrize("D", [2, 3])
@pytest.mark.parametrize("hop", [False, True])
def test_makespans_match_the_loop_over_numpy_arrays(D, hop):
    """The list schedule (its same-device shortcut included) against the loop, with and without the per-hop charge
    on each cut copy of the critical path (the latency policy's model)."""
    pb = _problem(D, hop=hop)
    for place in _placements(pb, 20, seed=20 + D):
        assert np.array_equal(makespans(pb, place), ref_makespans(pb, place))
    if hop:  # the charge lengthens some run
        free = _problem(D)
        assert any((makespans(pb, pl) > makespans(free, pl)).any() for pl in _placements(pb, 5, seed=3))


@pytest.mark.parametrize("hop", [False, True])
@pytest.mark.parametrize("D", [2, 3])
def test_block_scoring_and_memory_match_one_at_a_time(D, hop):
    pb = _problem(D, tight=True, hop=hop)
    label, _ = tie_layers(pb)
    for blocks in (aggregate(pb, pb.group), aggregate(pb, label)):
        rng = np.random.default_rng(D)
        bp = rng.integers(0, D, size=(25, blocks.B))
        cyc, ok = block_cycle_many(blocks, bp), block_memory_ok_many(pb, blocks, bp)
        for i in range(len(bp)):
            assert cyc[i] == block_cycle(blocks, bp[i]) == ref_block_cycle(blocks, bp[i])
            assert ok[i] == block_memory_ok(pb, blocks, bp[i]) == ref_block_memory_ok(pb, blocks, bp[i])
        assert ok.any() and not ok.all()


@pytest.mark.parametrize("D,tight,hop", [(2, False, False), (3, False, False), (2, True, False), (2, False, True),
                                         (3, True, True)])
def test_realize_and_shift_search_match_the_loops(D, tight, hop):
    pb = _problem(D, tight, hop)
    groups = aggregate(pb, pb.group)
    label, _ = tie_layers(pb)
    cls = tied_classes(pb, groups, label)
    ok = lambda gp: ref_block_memory_ok(pb, groups, gp)  # noqa: E731
    rng = np.random.default_rng(D)
    for _ in range(4):
        counts = np.zeros((cls.C, D), np.int64)
        for c in range(cls.C):  # random counts summing to L
            counts[c] = np.bincount(rng.integers(0, D, size=cls.L[c]), minlength=D)
        gp = realize(pb, groups, cls, counts)
        assert np.array_equal(gp, ref_realize(pb, groups, cls, counts, ok))
        far = time.perf_counter() + 60
        assert np.array_equal(shift_search(pb, groups, cls, gp, far), ref_shift_search(groups, cls, gp, ok))


def test_layer_dp_matches_the_loop():
    rng = np.random.default_rng(0)
    for U, D in ((1, 2), (5, 2), (12, 3), (32, 4)):
        ucost = rng.uniform(1e-4, 1e-3, (U, D))
        pre = np.vstack([np.zeros(D), np.cumsum(ucost, 0)])
        cross = rng.uniform(0, 5e-4, (U + 1, D, D))
        unit = np.repeat(np.arange(U), 3)
        for k in range(1, min(D, U) + 1):
            for seq in itertools.permutations(range(D), k):
                assert np.array_equal(_layer_dp(seq, pre, cross, U, unit), ref_layer_dp(seq, pre, cross, U, unit))


def test_round_counts_keeps_every_class_size():
    rng = np.random.default_rng(0)
    for D in (2, 3, 4):
        L = rng.integers(1, 40, size=50)
        frac = rng.dirichlet(np.ones(D), size=50) * L[:, None]
        frac[::7, -1] = 0.0  # devices the LP left empty
        frac[::7] *= (L[::7] / frac[::7].sum(1))[:, None]
        n = round_counts(frac, L)
        assert np.array_equal(n.sum(1), L) and (n >= 0).all()
        assert np.all(np.abs(n - frac) < 1.0 + 1e-9)
        assert np.all(n[::7, -1] == 0)
        assert np.array_equal(round_counts(np.rint(frac * 0 + n), L), n)  # integral counts stay as they are


@pytest.mark.parametrize("D", [2, 3])
def test_counts_lp_bound_is_below_the_milp_bound(D):
    """The LP relaxation's optimum is a valid bound too: never above the MILP's proven bound."""
    pb = _problem(D, tight=D == 2)
    groups = aggregate(pb, pb.group)
    label, _ = tie_layers(pb)
    cls = tied_classes(pb, groups, label)
    lp, frac = solve_counts(pb, cls, groups.forbidden, 30.0, relax=True, presolve=False)
    mip, counts = solve_counts(pb, cls, groups.forbidden, 30.0, mip_gap=1e-6)
    assert lp.status == "optimal" and mip.status == "optimal"
    assert 0 < lp.bound <= mip.bound * (1 + 1e-6) and mip.bound <= mip.objective * (1 + 1e-6)
    assert np.allclose(frac.sum(1), cls.L) and np.array_equal(counts.sum(1), cls.L)


def ref_local_search(pb, blocks, place, max_iters=10_000):
    """The local search recomputing every block's move deltas after each move (the implementation before the
    incremental update), with the same acceptance rule and tie-breaks."""
    from torch_tessera.scheduler.blocks import memory_binds

    D, B = pb.D, blocks.B
    place = place.copy()
    R = D + D * D
    bi, g_ar = np.arange(B), np.arange(D)
    src, dst, coef = blocks.esrc, blocks.edst, blocks.coef
    E = len(src)
    movable = np.ones((B, D), bool)
    movable[:, blocks.forbidden] = False
    movable[blocks.pinned >= 0] = False
    limited = memory_binds(pb, blocks)
    for _ in range(max_iters):
        dev = ref_block_dev(blocks, place)
        ps, pd_ = place[src], place[dst]
        cut = ps != pd_
        link = np.zeros(D * D)
        np.add.at(link, ps[cut] * D + pd_[cut], coef[np.flatnonzero(cut), ps[cut], pd_[cut]])
        base = np.concatenate([dev, link])
        delta = np.zeros((B, D, R))
        delta[bi[:, None], g_ar[None], g_ar[None]] += blocks.cost
        delta[bi, :, place] -= blocks.cost[bi, place][:, None]
        cur = np.where(cut, coef[np.arange(E), ps, pd_], 0.0)
        gs = np.tile(g_ar, E)
        idx, val = [], []
        for end, other in ((src, pd_), (dst, ps)):
            rows = np.repeat(end, D)
            idx.append((rows * D + gs) * R + D + np.repeat(ps * D + pd_, D))
            val.append(-np.repeat(cur, D))
            oth = np.repeat(other, D)
            a, c = (gs, oth) if end is src else (oth, gs)
            idx.append((rows * D + gs) * R + D + a * D + c)
            val.append(np.where(a != c, coef[np.repeat(np.arange(E), D), a, c], 0.0))
        if blocks.dcoef is not None:  # the moved end's edges: charge removed from both old ends, added to both new
            dcur = np.repeat(np.where(cut, blocks.dcoef[np.arange(E), ps, pd_], 0.0), D)
            for end, other in ((src, pd_), (dst, ps)):
                rows = np.repeat(end, D)
                base_r = (rows * D + gs) * R
                oth = np.repeat(other, D)
                a, c = (gs, oth) if end is src else (oth, gs)
                new_c = np.where(a != c, blocks.dcoef[np.repeat(np.arange(E), D), a, c], 0.0)
                idx += [base_r + np.repeat(ps, D), base_r + np.repeat(pd_, D), base_r + a, base_r + c]
                val += [-dcur, -dcur, new_c, new_c]
        delta += np.bincount(np.concatenate(idx), weights=np.concatenate(val), minlength=B * D * R).reshape(B, D, R)
        new = base[None, None] + delta
        score, sq = new.max(2), (new ** 2).sum(2)
        score[~movable] = np.inf
        score[bi, place] = np.inf
        cur_max, cur_sq = base.max(), (base ** 2).sum()
        better = (score < cur_max * (1 - 1e-9)) | ((score <= cur_max * (1 + 1e-12)) & (sq < cur_sq * (1 - 1e-9)))
        if not better.any():
            break
        cand = np.flatnonzero(better.ravel())
        moved = False
        for flat in cand[np.lexsort((sq.ravel()[cand], score.ravel()[cand]))][:8]:
            b, g = divmod(int(flat), D)
            old, place[b] = place[b], g
            if not limited or ref_block_memory_ok(pb, blocks, place):
                moved = True
                break
            place[b] = old
        if not moved:
            break
    return place


@pytest.mark.parametrize("D,tight,hop", [(2, False, False), (3, False, False), (4, False, False), (2, True, False),
                                         (3, True, False), (2, False, True), (3, True, True), (4, False, True)])
def test_local_search_with_incremental_deltas_matches_full_recomputation(D, tight, hop):
    from torch_tessera.scheduler.heuristics import local_search

    pb = _problem(D, tight, hop)
    label, _ = tie_layers(pb)
    moves = 0
    for blocks in (aggregate(pb, pb.group), aggregate(pb, label)):
        rng = np.random.default_rng(D)
        for start in [np.zeros(blocks.B, np.int64)] + [rng.integers(0, D, size=blocks.B) for _ in range(3)]:
            got = local_search(pb, blocks, start, time.perf_counter() + 60)
            assert np.array_equal(got, ref_local_search(pb, blocks, start))
            moves += int((got != start).sum())
    assert moves > 10  # the searches moved blocks (a start that breaks a budget may not move)


@pytest.mark.parametrize("hop", [False, True])
@pytest.mark.parametrize("D", [2, 3, 4])
def test_moved_loads_of_many_moves_match_full_recomputation(D, hop):
    """Loads after each of many few-block moves, from the current loads over the moved blocks' costs and edges (and,
    with ``hop``, the cut edges' charges on both end devices), against summing every term of each moved placement
    (equal up to rounding)."""
    from torch_tessera.scheduler.blocks import block_loads_many, moved_loads_many

    pb = _problem(D, hop=hop)
    label, _ = tie_layers(pb)
    for blocks in (aggregate(pb, pb.group), aggregate(pb, label)):
        rng = np.random.default_rng(D)
        place = rng.integers(0, D, size=blocks.B)
        dev, link = (x[0] for x in block_loads_many(blocks, place[None]))
        move, group, to, want = [], [], [], []
        for m in range(40):  # 1-4 blocks each, some already on their target, some joined by an edge
            k = int(rng.integers(1, 5))
            gs = rng.choice(blocks.B, size=k, replace=False) if m % 3 else np.unique(
                [blocks.esrc[m], blocks.edst[m]])
            ds = rng.integers(0, D, size=len(gs))
            moved = place.copy()
            moved[gs] = ds
            want.append(moved)
            move += [m] * len(gs)
            group += list(gs)
            to += list(ds)
        dev1, link1 = moved_loads_many(blocks, place, np.array(move), np.array(group), np.array(to), 40, dev, link)
        ref_dev, ref_link = block_loads_many(blocks, np.stack(want))
        assert np.allclose(dev1, ref_dev, rtol=1e-12, atol=1e-15)
        assert np.allclose(link1, ref_link, rtol=1e-12, atol=1e-15)
        assert np.allclose(dev1, np.stack([ref_block_dev(blocks, w) for w in want]), rtol=1e-12, atol=1e-15)
        if hop:  # the charge moved the device loads
            assert (blocks.dcoef is not None) and not np.allclose(
                dev1, np.stack([np.bincount(w, weights=blocks.cost[np.arange(blocks.B), w], minlength=D)
                                for w in want]))


def test_split_by_cost_numbers_classes_as_unique_rows():
    rng = np.random.default_rng(0)
    for D in (2, 4):
        B = 300
        cost = rng.choice([1e-4, 2e-4, 3e-4 * (1 + 1e-9)], size=(B, D))
        groups = type("G", (), {"B": B, "cost": cost})()
        label = rng.integers(0, 7, size=B)
        key = np.round(np.log(np.maximum(cost, 1e-30)) / 1e-6).astype(np.int64)
        _, want = np.unique(np.c_[label, key], axis=0, return_inverse=True)
        assert np.array_equal(split_by_cost(groups, label), want.ravel())


def test_union_find_labels_and_reserve_match_the_loops():
    from torch_tessera.scheduler.problem import _UnionFind, _live_peak

    rng = np.random.default_rng(1)
    uf = _UnionFind(500)
    for a, b in rng.integers(0, 500, size=(300, 2)):
        uf.union(int(a), int(b))
    _, want = np.unique([uf.find(i) for i in range(500)], return_inverse=True)
    assert np.array_equal(uf.labels(), want)
    for D in (2, 3):
        pb = _problem(D)
        touch = [r | w for r, w in zip(pb.reads, pb.writes)]
        assert pb.reserve == max(_live_peak(pb.program_slice(p).tolist(), touch, pb.temp_bytes[p])
                                 for p in range(len(pb.programs)))


@pytest.mark.parametrize("relax", [False, True])
def test_direct_highs_call_matches_scipy_milp(relax):
    """compat.scipy_highs.solve passes scipy.optimize.milp's model and options to the same HiGHS: same status,
    solution, objective and bound, on the counts model (optimal, and with a cut-off no placement beats)."""
    import warnings

    import torch_tessera.scheduler.milp as milp_mod
    from scipy.optimize import Bounds, LinearConstraint, milp
    from torch_tessera.compat.scipy_highs import solve

    models = []

    def keep(self, *args, **kwargs):
        models.append(self)
        return orig(self, *args, **kwargs)

    orig = milp_mod.MilpModel.solve
    milp_mod.MilpModel.solve = keep
    try:
        pb = _problem(2)
        groups = aggregate(pb, pb.group)
        label, _ = tie_layers(pb)
        solve_counts(pb, tied_classes(pb, groups, label), groups.forbidden, 30.0)
    finally:
        milp_mod.MilpModel.solve = orig
    m = models[0]
    from scipy.sparse import coo_matrix

    A = coo_matrix((np.concatenate(m.vals), (np.concatenate(m.rows), np.concatenate(m.cols))),
                   shape=(m.nr, m.nv)).tocsr()
    integ = np.zeros(m.nv) if relax else np.concatenate(m.integ)
    args = (np.concatenate(m.c), integ, np.concatenate(m.lb), np.concatenate(m.ub), A, np.concatenate(m.rlo),
            np.concatenate(m.rhi))
    for extra in ({}, {"objective_bound": -1.0}):  # the second: nothing beats the cut-off (infeasible for a MILP)
        if relax and extra:
            continue
        opts = {"time_limit": 30.0, "presolve": True, "mip_rel_gap": 1e-6, **extra}
        got = solve(*args, dict(opts))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = milp(args[0], integrality=integ, bounds=Bounds(args[2], args[3]),
                       constraints=LinearConstraint(A, args[5], args[6]), options=dict(opts))
        assert got.status == ref.status and (got.x is None) == (ref.x is None)
        if ref.x is not None:
            assert np.array_equal(got.x, ref.x) and got.fun == ref.fun
        assert got.mip_dual_bound == getattr(ref, "mip_dual_bound", None)
        assert got.mip_node_count == getattr(ref, "mip_node_count", None)


def ref_buffers(wl, touch, writes, prog, esrc, ebytes, eranges):
    """Resident buffers and STATE hand-overs, kernel by kernel over every touched name (the loop that
    problem._buffers replaced), with request streams: a non-weight buffer of stream ``r >= 1`` is ``"<name>@<r>"``."""
    from torch_tessera.lowering.program import BufferKind

    spans = {}
    for s, b, rs in zip(esrc, ebytes, eranges):
        if b:
            for name, lo, hi in rs:
                spans.setdefault((prog[s], name), []).append((lo, hi))
    written = {}
    for key, iv in spans.items():
        total, end = 0, None
        for lo, hi in sorted(iv):
            if end is None or lo > end:
                total, end = total + hi - lo, hi
            elif hi > end:
                total, end = total + hi - end, hi
        written[key] = total
    holders, kinds, writers, access, progs_of, raw = {}, {}, {}, {}, {}, {}
    for k in range(len(prog)):
        p = wl.programs[prog[k]]
        for name in touch[k]:
            b = p.dag.buffers.get(name)
            if b is None or b.kind is BufferKind.TEMP:
                continue
            key = name
            if p.stream and b.kind is not BufferKind.PARAMETER:
                key = f"{name}@{p.stream}"
                raw[key] = name
            holders.setdefault(key, []).append(k)
            old = kinds.get(key)
            kinds[key] = (b.kind.value, int(b.nbytes)) if old is None else (old[0], max(old[1], int(b.nbytes)))
            if b.kind is BufferKind.STATE:
                access.setdefault((prog[k], key), []).append(k)
                progs_of.setdefault(key, set()).add(prog[k])
                if name in writes[k]:
                    writers.setdefault((prog[k], key), []).append(k)
    handovers = []
    for name in sorted({nm for (_, nm) in writers}):
        ps = sorted(progs_of[name])
        for p, q in zip(ps, ps[1:]):
            src = writers.get((p, name))
            if not src or (wl.tie_state and (q, name) in writers):
                continue
            dst = writers.get((q, name)) or access[(q, name)]
            handovers.append((src[0], dst[0], written.get((p, raw.get(name, name)), kinds[name][1]), name))
    resident = [(nm, kinds[nm][0], kinds[nm][1], sorted(set(ks))) for nm, ks in sorted(holders.items())]
    return resident, handovers


@pytest.mark.parametrize("streams,tie", [(1, False), (2, False), (3, False), (2, True)])
def test_buffers_of_request_streams_match_the_loop(streams, tie):
    """problem._buffers (one pass over codes) against the kernel-by-kernel loop, on prefill + decode with a KV cache
    served as ``streams`` request streams: each stream's state and inputs its own, weights shared."""
    from dataclasses import replace

    from torch_tessera.scheduler.problem import _buffers, _UnionFind

    devs = ("big", "small")
    pre = transformer_dag(layers=3, tokens=128, context=512)
    dec = transformer_dag(layers=3, tokens=1, context=512)
    wl = Workload.llm(pre, roofline_costs(pre, devs), dec, roofline_costs(dec, devs, seed=1), 8.0)
    wl = replace(wl, tie_state=tie)
    if streams > 1:
        wl = wl.replicated([1.0 / streams] * streams)
    pb = compile_problem(wl, nvlink_topology(devs), micro_batches=2)
    touch = [r | w for r, w in zip(pb.reads, pb.writes)]
    prog = pb.prog.tolist()
    keep = [i for i, kind in enumerate(pb.ekind) if kind != "STATE"]  # the programs' own edges
    esrc, ebytes, eranges = ([x[i] for i in keep] for x in (pb.esrc.tolist(), pb.ebytes.tolist(), pb.eranges))
    ebytes = [int(b) for b in ebytes]
    resident, handovers, _, _ = _buffers(wl, touch, pb.writes, prog, _UnionFind(pb.n), (esrc, ebytes, eranges))
    want_res, want_hand = ref_buffers(wl, touch, pb.writes, prog, esrc, ebytes, eranges)
    assert [(r.name, r.kind, r.nbytes, r.holders.tolist()) for r in resident] == want_res
    assert handovers == want_hand
    names = {r.name for r in resident}
    for r in range(1, streams):  # each stream's own KV cache, one set of weights
        assert any(nm.endswith(f"@{r}") for nm in names)
        assert all(not nm.endswith(f"@{r}") for nm in names if dict((x.name, x.kind) for x in resident)[nm]
                   == "parameter")
    if streams > 1 and not tie:
        assert {nm for (_, _, _, nm) in handovers} & {nm for nm in names if "@" in nm}
