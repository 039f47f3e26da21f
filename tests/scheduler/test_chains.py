"""Whole-layer search an interval of layers at a time (``scheduler.chains``): the unit coarsening, the batched move
scores against full recomputation, the search against brute force over every whole-layer placement of small charged
workloads, and its use in the throughput plan (only with the per-hop charge, never worse, the counts MILP skipped)."""

from __future__ import annotations

import functools

import itertools
import time

import numpy as np
import pytest

from test_hop_overhead import _charged_llm
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.blocks import aggregate, block_cycle, block_cycle_many, block_loads_many
from torch_tessera.scheduler.chains import (Units, chain_search, interval_descent, interval_moves,
                                            moved_loads_batched, whole_program_seeds)
from torch_tessera.scheduler.problem import compile_problem

#: these tests check the cycle model's solver (the per-cut charge of Topology.hop_overhead): the model
#: ``score="cycle"`` keeps; the simulated score is tested in test_pipeline_plan.py
plan = functools.partial(plan, score="cycle")


def _problem(D: int, layers: int = 3, **kw):
    wl, tp = _charged_llm(D, layers)
    pb = compile_problem(wl, tp, micro_batches=2, **kw)
    return pb, aggregate(pb, pb.group)


@pytest.mark.parametrize("stride", [1, 2])
def test_units_merge_whole_layers_and_chain_each_program(stride):
    pb, groups = _problem(2, 4)
    u = Units(pb, groups, stride)
    assert len(u.chains) == len(pb.programs)
    from torch_tessera.scheduler.blocks import layer_units

    units = np.array([-1 if x is None else x // stride for x in layer_units(pb)])
    kb = u.of_group[pb.group]
    for p in range(len(pb.programs)):  # every (program, unit) is one block, distinct units distinct blocks
        ks = pb.program_slice(p)
        for x in np.unique(units[ks][units[ks] >= 0]):
            assert len(set(kb[ks[units[ks] == x]].tolist())) == 1
        assert len(set(kb[ks].tolist())) == len(u.chains[p])
    gp = np.random.default_rng(0).integers(0, 2, u.blocks.B)
    assert (u.of(u.expand(gp)) == gp).all()
    assert block_cycle(u.blocks, gp) == pytest.approx(block_cycle(groups, u.expand(gp)), rel=1e-12)


@pytest.mark.parametrize("D", [2, 3])
def test_batched_move_loads_equal_recomputed_loads(D):
    pb, groups = _problem(D, 4)
    u = Units(pb, groups)
    rng = np.random.default_rng(D)
    ups = rng.integers(0, D, (3, u.blocks.B))
    parts, mseed, m = [], [], 0
    for s in range(3):
        move, block, to, M = interval_moves(u, ups[s])
        parts.append((move + m, block, to))
        mseed.append(np.full(M, s))
        m += M
    move, block, to = (np.concatenate(x) for x in zip(*parts))
    mseed = np.concatenate(mseed)
    dev, link = block_loads_many(u.blocks, ups)
    d1, l1 = moved_loads_batched(u.blocks, ups, mseed, move, block, to, dev, link)
    trials = ups[mseed].copy()
    trials[move, block] = to
    d2, l2 = block_loads_many(u.blocks, trials)
    np.testing.assert_allclose(d1, d2, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(l1, l2, rtol=1e-9, atol=1e-15)
    # every move is one interval of one chain (or one block in no chain) sent to one device
    for t in np.unique(move).tolist():
        sel = move == t
        assert len(set(to[sel].tolist())) == 1
        pos = [int(np.flatnonzero(ch == b)[0]) for b in block[sel] for ch in u.chains if b in ch]
        assert not pos or len(pos) == sel.sum()


def _brute_force(pb, u: Units) -> float:
    """Least cycle time over every unit placement (each layer wholly on one device, every device for each block)."""
    ub = u.blocks
    best = np.inf
    allp = np.array(list(itertools.product(range(pb.D), repeat=ub.B)), dtype=np.int64)
    for chunk in np.array_split(allp, max(1, len(allp) // 20000)):
        best = min(best, float(block_cycle_many(ub, chunk).min()))
    return best


@pytest.mark.parametrize("D,layers,hop", [(2, 3, 52e-6), (2, 4, 2e-4), (3, 2, 52e-6), (3, 2, 3e-4)])
def test_chain_search_reaches_the_whole_layer_optimum(D, layers, hop):
    """On small charged prefill + decode workloads the search's best whole-layer plan is the brute-force optimum
    over every placement of whole layers (and of the blocks outside them)."""
    from dataclasses import replace

    from torch_tessera.scheduler.synthetic import nvlink_topology  # noqa: F401  (the topology of _charged_llm)

    wl, tp = _charged_llm(D, layers)
    tp = replace(tp, hop_overhead=np.full((D, D), hop))
    pb = compile_problem(wl, tp, micro_batches=2)
    groups = aggregate(pb, pb.group)
    u = Units(pb, groups)
    assert u.blocks.B ** 1 and pb.D ** u.blocks.B <= 2e6
    got = chain_search(pb, groups, [np.zeros(groups.B, dtype=np.int64)], time.perf_counter() + 60, units=u)
    assert got
    assert block_cycle(groups, got[0]) == pytest.approx(_brute_force(pb, u), rel=1e-9)


def test_interval_descent_never_worsens_and_whole_seeds_cover_every_assignment():
    pb, groups = _problem(3, 4)
    u = Units(pb, groups)
    seeds = whole_program_seeds(u, np.zeros(u.blocks.B, dtype=np.int64))
    assert len(seeds) == 3 ** len(u.chains)
    start = np.stack(seeds)
    out = interval_descent(pb, u, start, time.perf_counter() + 60)
    assert block_cycle_many(u.blocks, out).min() <= block_cycle_many(u.blocks, start).min() * (1 + 1e-12)


def test_throughput_plan_uses_the_chain_search_only_with_the_charge_and_skips_the_counts_milp(monkeypatch):
    """Without the charge nothing changes (no chain search); with it the plan is never slower than without the
    search, and the counts MILP (``solve_counts`` on tied classes without ``relax``) is not called once it ran."""
    import torch_tessera.scheduler.solve as solve

    calls, milps = [], []
    real_chain, real_counts = solve.chain_search, solve.solve_counts

    def chain(*a, **k):
        out = real_chain(*a, **k)
        calls.append(len(out))
        return out

    def counts(pb, cls, *a, **k):  # the counts MILP: tied classes, not relaxed (the untied MILP may still run)
        if not k.get("relax") and cls.L.max() > 1:
            milps.append(1)
        return real_counts(pb, cls, *a, **k)

    monkeypatch.setattr(solve, "chain_search", chain)
    monkeypatch.setattr(solve, "solve_counts", counts)
    wl, tp = _charged_llm(3)
    plan(wl, None, tp.without_overheads(), cache_dir=False)
    assert calls == []
    milps.clear()
    with_chain = plan(wl, None, tp, cache_dir=False)
    assert calls and calls[0] >= 1
    assert milps == []
    monkeypatch.setattr(solve, "chain_search", lambda *a, **k: [])
    without = plan(wl, None, tp, cache_dir=False)
    assert with_chain.predicted_seconds <= without.predicted_seconds * (1 + 1e-12)


def test_chain_search_keeps_memory_budgets():
    """With budgets of about 60 % of the resident bytes each, no whole-program seed fits; from a seed that fits,
    every placement returned fits and is no slower than it; from none that fits, none is returned."""
    from torch_tessera.scheduler.blocks import block_memory_ok

    wl, tp = _charged_llm(2)
    total = sum(r.nbytes for r in compile_problem(wl, tp, micro_batches=2).resident)
    pb = compile_problem(wl, tp, micro_batches=2, memory_budgets=[int(0.6 * total)] * 2)
    groups = aggregate(pb, pb.group)
    assert chain_search(pb, groups, [np.zeros(groups.B, dtype=np.int64)], time.perf_counter() + 60) == []
    u = Units(pb, groups)
    up = np.zeros(u.blocks.B, dtype=np.int64)
    for ch in u.chains:  # each program's second half of layers on device 1: about half of the weights each
        up[ch[len(ch) // 2:]] = 1
    seed = u.expand(up)
    assert block_memory_ok(pb, groups, seed)
    got = chain_search(pb, groups, [seed], time.perf_counter() + 60)
    assert got
    for gp in got:
        assert block_memory_ok(pb, groups, gp)
    assert block_cycle(groups, got[0]) <= block_cycle(groups, seed) * (1 + 1e-12)


def test_untied_milp_after_the_chain_search_only_up_to_the_charged_limit(monkeypatch):
    """With the charge, once the whole-layer search ran, the untied MILP (``solve_counts`` on one group per class)
    starts only up to ``CHARGED_EXACT_BINARIES``; above, the plan says why it did not."""
    import torch_tessera.scheduler.solve as solve

    untied = []
    real = solve.solve_counts

    def counts(pb, cls, *a, **k):
        if not k.get("relax") and cls.L.max() == 1:
            untied.append(cls.C)
        return real(pb, cls, *a, **k)

    monkeypatch.setattr(solve, "solve_counts", counts)
    wl, tp = _charged_llm(2)
    small = plan(wl, None, tp, cache_dir=False)
    assert untied  # 8 layers on 2 devices: within the limit, and the plan is not within RESOLVE_GAP of the bound
    untied.clear()
    monkeypatch.setattr(solve, "CHARGED_EXACT_BINARIES", 10)
    capped = plan(wl, None, tp, cache_dir=False)
    assert untied == []
    assert any("after the whole-layer search" in n for n in capped.solver.notes)
    assert small.predicted_seconds <= capped.predicted_seconds * (1 + 1e-12)
