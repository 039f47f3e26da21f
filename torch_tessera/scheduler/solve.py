"""The two policies: how the heuristics, the MILPs and the bounds are combined into one placement.

Throughput: repeated layers become classes (structures aligned across layers, :func:`blocks.tie_layers`) -> the
counts LP (:mod:`counts`; its optimum is a valid lower bound for every placement) -> its counts rounded and realised
(a fill of each class's layers, device by device, in a common layer order; rounded-up members given back while a
memory budget breaks), shift search, untied local search -> only if that plan is not within ``max(mip_gap,
LP_PLAN_GAP)`` of the bound: list heuristic + local search on the tied classes (the MILP's cut-off), then the counts
MILP, realised the same way -> the untied MILP when the problem is small for ``time_limit`` (:func:`untied_fits`) and
the plan is not yet within ``RESOLVE_GAP`` of the bound -> untied local search (unless the plan already is a local
optimum of it) -> transfer trimming. When cut edges charge the devices they join (the per-hop charge), the LP plan is
followed by whole-layer searches instead of the counts MILP (:func:`counts.layer_split`, then
:func:`chains.chain_search` from those splits, the plan and whole programs), and the untied MILP starts only up to
:data:`CHARGED_EXACT_BINARIES`. Without repeated layers (or ``tie_layers=False``) the list heuristic gives the
incumbent and the counts MILP is the exact placement MILP.

Latency: exact DP when every program is a path; otherwise HEFT, single-device and baseline (layer, af, pd)
candidates (the throughput plan when none fits memory), then the critical-path MILP (skipped with tied layers above
``LATENCY_TIED_MILP_KERNELS``), each candidate re-scored by the list-schedule simulator, then single-block moves
scored the same way; last, cut edges are shed while the predicted latency stays within
``LATENCY_CUT_TOLERANCE`` of the best found (:func:`shed_latency_cuts`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from torch_tessera.errors import InfeasiblePlanError
from torch_tessera.scheduler import milp
from torch_tessera.scheduler.blocks import (Blocks, aggregate, block_cycle, block_memory_ok, block_memory_over,
                                            tie_layers)
from torch_tessera.scheduler.chains import chain_search
from torch_tessera.scheduler.counts import (build_classes, layer_split, realize, round_counts, shift_search,
                                             solve_counts, tied_classes)
from torch_tessera.scheduler.evaluate import latency_seconds, memory_ok, pool_line
from torch_tessera.scheduler.heuristics import (chain_dp, greedy_cycle, heft_latency, is_chain, latency_bound,
                                                 local_search, zero_comm_bound)
from torch_tessera.scheduler.problem import Problem
from torch_tessera.target.devices import format_bytes
from torch_tessera.scheduler.transfers import trim_limit, trim_transfers

log = logging.getLogger(__name__)


#: Relative gap at which the counts MILP stops when layers repeat (its placement is realised and polished afterwards,
#: so a tighter gap costs time without changing the plan; docs/BENCHMARKS.md, solver constants).
COUNTS_GAP = 1e-2
#: Method name of a plan polished from a whole-layer split of each program (:func:`counts.layer_split`).
SPLIT = "lp-split+local"
#: Method name of a plan polished from the interval search over whole layers (:func:`chains.chain_search`).
CHAIN = "chain+local"
#: Whether the counts MILP still runs after the whole-layer searches (made only when cut edges charge devices). Off:
#: its relaxation misses the cuts between layers as the LP's does, so its bound is as weak and it changed no plan on
#: the registry models (docs/BENCHMARKS.md, solver constants).
CHARGED_COUNTS_MILP = False
#: A tied plan realised from the rounded counts LP is returned without the counts MILP when it is within this relative
#: gap of the LP bound (or within ``mip_gap``, if larger). The counts MILP, which would run next, stops at
#: ``max(2 mip_gap, COUNTS_GAP)`` and its counts are realised and polished the same way, so it promises no more
#: (docs/BENCHMARKS.md, solver constants).
LP_PLAN_GAP = COUNTS_GAP
#: A tied plan proven within this relative gap of the counts bound is returned without the untied MILP (seconds on
#: model DAGs). 2 %: the plan-quality target (docs/BENCHMARKS.md, solver constants); ``tie_layers=False`` runs the
#: exact MILP.
RESOLVE_GAP = 2e-2
#: Below this many (group x device) binaries the untied MILP also runs when the polished counts plan is left more
#: than ``max(2 mip_gap, RESOLVE_GAP)`` from its bound, provided ``time_limit`` also allows
#: :data:`EXACT_BINARIES_PER_SECOND`.
EXACT_BLOCKS = 20000
#: Binaries (groups x devices) the untied MILP is given per second of ``time_limit`` (binaries/s): above
#: ``EXACT_BINARIES_PER_SECOND x time_limit`` it is not started, since it cannot finish (4000 binaries at the default
#: 10 s). HiGHS through SciPy on a 2-core CPU (docs/BENCHMARKS.md, solver constants).
EXACT_BINARIES_PER_SECOND = 400.0


#: With the per-hop charge, once the whole-layer search ran (:func:`chains.chain_search`), the untied MILP starts
#: only up to this many binaries (groups x devices): the counts bound misses the cuts between layers, so above it the
#: MILP runs to ``time_limit`` without changing the plan (docs/BENCHMARKS.md, solver constants).
CHARGED_EXACT_BINARIES = 800

#: Share of ``time_limit`` each MILP may take: the counts MILP (on a DAG without repeated layers, the exact placement
#: MILP) and the untied MILP after the tied path. Planning must stay within 1 s for
#: DAGs of up to 2,000 kernels on up to 4 devices at the default ``time_limit`` (issue 23); measured on the 2-core
#: machine (docs/results, pipesched NOTES.md: ``bench/bench_scheduler.py --hop-us 52``), these MILPs ran to the time
#: limit on 47-201 kernels (3-10 s) and their plans are polished by the local searches afterwards. A larger
#: ``time_limit`` gives them proportionally more; ``tie_layers=False`` (the exact MILP) is not bounded by this.
EXACT_MILP_SHARE = 0.04
#: MILPs of at most this many placement binaries (classes or groups x devices) are not bounded by
#: :data:`EXACT_MILP_SHARE`: tiny problems (a handful of kernels) finish when they can, and under load HiGHS took
#: 0.45 s to prove a 6-kernel, 3-device placement optimal (tests/scheduler/test_optimal.py).
EXACT_MILP_UNCAPPED = 64

#: Relative cycle-time increase a throughput plan may take to move fewer bytes (:mod:`.transfers`): the MILP's own
#: default stopping gap, so the plan stays as close to optimal as the solver promised.
TRANSFER_TOLERANCE = 5e-3

#: With tied layers, the latency MILP runs only up to this many kernels: its finish-time and cut variables grow with
#: kernels and edges, not with tied blocks, and above it the local search reaches the same plans sooner
#: (docs/BENCHMARKS.md, solver constants).
LATENCY_TIED_MILP_KERNELS = 500

#: Relative latency increase a latency plan may take to keep fewer cut edges (:func:`shed_latency_cuts`). 5 %: half
#: the per-hop model's mean error on plans with cuts, so a smaller predicted gain does not justify a cut
#: (docs/BENCHMARKS.md, per-hop charge).
LATENCY_CUT_TOLERANCE = 5e-2


@dataclass
class Solution:
    """A kernel placement with its score and how it was found (internal)."""

    place: np.ndarray
    value: float
    bound: float
    method: str
    status: str
    nodes: int = 0
    blocks: int = 0
    notes: list[str] = field(default_factory=list)


def _gb(x: float, scale_of: float | None = None) -> str:
    return format_bytes(x, scale_of)


def raise_infeasible(pb: Problem, groups: Blocks, reason: str = "") -> None:
    """Raise :class:`InfeasiblePlanError` naming each short device and each GPU whose partitions lack memory together,
    with the shortfall (least overflow over all placements, from a MILP with per-device and per-pool slack; when no
    device can hold even the activation reserve, every device's reserve against its budget)."""
    lines, shortfalls = [], []
    if groups.forbidden.all():
        for g in range(pb.D):
            have = float(pb.budgets[g])
            need = float(pb.reserve)
            lines.append(f"device {pb.devices[g]} needs at least {_gb(need)} for activations, has {_gb(have, need)}")
            shortfalls.append((pb.devices[g], need, have))
        short = None
    else:
        short = milp.memory_shortfall(pb, groups)
    if short is not None:
        short, pool_short = short
        for g in np.flatnonzero(short > 1.0):
            have = pb.budgets[g]
            need = have + short[g]
            lines.append(f"device {pb.devices[g]} needs {_gb(need)}, has {_gb(have, need)} "
                         f"(short by {_gb(short[g], need)})")
            shortfalls.append((pb.devices[g], float(have + short[g]), float(have)))
        for k in np.flatnonzero(pool_short > 1.0):
            have = float(pb.pool_budgets[k])
            need = have + float(pool_short[k])
            lines.append(pool_line(pb, k, need))
            shortfalls.append((pb.pool_names[k], need, have))
    if not lines:
        lines.append(reason or "no placement satisfies the pins and memory budgets")
    pooled = any(name in pb.pool_names for name, _, _ in shortfalls)
    fix = (" The partitions of one GPU share its memory. Fix: add a GPU, or lower the batch / context so state and "
           "activations shrink." if pooled else
           " Fix: raise memory_budgets, add a device, or lower the batch / context so state and activations shrink.")
    raise InfeasiblePlanError(
        "no feasible placement: " + "; ".join(lines) + f" (activation reserve {_gb(pb.reserve)} per device counted)."
        + fix, tuple(shortfalls), lower_bound=short is None and bool(shortfalls))


def solve_throughput(pb: Problem, time_limit: float, use_ties: bool = True, mip_gap: float = 5e-3,
                     transfer_tolerance: float | None = TRANSFER_TOLERANCE) -> Solution:
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    groups = aggregate(pb, pb.group)
    if groups.forbidden.all():
        raise_infeasible(pb, groups)
    label, tied = tie_layers(pb) if use_ties else (pb.group, 0)
    notes = [f"{tied} repeated layer(s) counted: {groups.B} groups -> {int(label.max()) + 1} classes"] if tied else []

    best, method = None, "heft"
    polished = False  # best is a local optimum of the untied local search (no need to run it again)
    split = None  # (value, placement, polished, method) of the best whole-layer plan (SPLIT, CHAIN), kept apart

    def warm_start() -> float | None:
        """List heuristic + local search on the tied blocks (few when layers repeat): an incumbent for the MILP.
        Returns its cycle time (``None`` when it breaks a budget)."""
        nonlocal best, method, polished
        work = aggregate(pb, label) if tied else groups
        hp = local_search(pb, work, greedy_cycle(pb, work), t0 + 0.15 * time_limit)
        if not block_memory_ok(pb, work, hp):
            return None
        v = block_cycle(work, hp)
        if best is None or v < best[0] * (1 - 1e-12):
            best, method = (v, work.expand(hp)), "heft"
            polished = not tied and time.perf_counter() < t0 + 0.15 * time_limit  # untied, and it ended by itself
        return v

    cls = tied_classes(pb, groups, label, tied)

    def realise(counts: np.ndarray, how: str, frac: np.ndarray | None = None) -> None:
        """Realise ``counts`` as a group placement, polish it, keep it if it beats ``best``. With the LP's ``frac``
        counts, while the realisation breaks a memory budget, the class rounded up on a short device that holds the
        most resident bytes gives that member back to the device it was rounded down on."""
        gp = realize(pb, groups, cls, counts)
        while frac is not None:
            over = block_memory_over(pb, groups, gp[None])[0]
            up = (counts > frac + 1e-6) & over[None, :]
            if not up.any():
                break
            c = max(np.flatnonzero(up.any(1)), key=lambda c: class_bytes[c])
            room = np.where((frac[c] > 0) & ~over, frac[c] - counts[c], -np.inf)
            if not np.isfinite(room).any():
                break
            counts = counts.copy()
            counts[c, int(np.flatnonzero(up[c])[0])] -= 1
            counts[c, int(np.argmax(room))] += 1
            gp = realize(pb, groups, cls, counts)
        polish(gp, how)

    def polish(gp: np.ndarray, how: str) -> None:
        """Shift search, then (tied) untied local search from group placement ``gp``; keep it if it beats ``best``
        (a whole-layer split: if it beats ``split``)."""
        nonlocal best, method, polished, split
        gp = shift_search(pb, groups, cls, gp, t0 + 0.9 * time_limit)
        if tied:  # single-group moves repair what the fill order got wrong (edges to the untied end layers)
            gp = local_search(pb, groups, gp, t0 + 0.9 * time_limit)
        if block_memory_ok(pb, groups, gp):
            v = block_cycle(groups, gp)
            done = tied and time.perf_counter() < t0 + 0.9 * time_limit  # the search ended by itself
            if how in (SPLIT, CHAIN):
                if split is None or v < split[0] * (1 - 1e-12):
                    split = (v, groups.expand(gp), done, how)
            elif best is None or v < best[0] * (1 - 1e-12):
                best, method, polished = (v, groups.expand(gp)), how, done

    def incumbent() -> float:
        """The best cycle time found so far, the whole-layer splits included (``inf``: none)."""
        return min(best[0] if best else np.inf, split[0] if split else np.inf)

    class_bytes = np.zeros(cls.C)  # resident bytes held by each class (what rounding it down frees)
    for nbytes, q, holders in cls.res:
        for c, _, _ in holders:
            class_bytes[c] += nbytes * q
    counts_end = t0 + 0.85 * time_limit
    counts_gap, bound, res = mip_gap, 0.0, None
    if use_ties and cls.C * pb.D > EXACT_MILP_UNCAPPED:  # bounded like the untied MILP below
        counts_end = min(counts_end, time.perf_counter() + EXACT_MILP_SHARE * time_limit)
    if tied:  # the counts MILP is a relaxation whose plan is polished afterwards: stop it at a looser gap
        counts_gap = max(2 * mip_gap, COUNTS_GAP)
        # its LP relaxation first: a bound as good as the MILP's root bound on real DAGs, and rounded counts that
        # often realise within LP_PLAN_GAP of it, in a fraction of the MILP's time (Llama-3.1-8B, 4 devices: 0.06 s
        # vs 2.3 s); the MILP runs only when they do not
        res, frac = solve_counts(pb, cls, groups.forbidden, max(1e-3, counts_end - time.perf_counter()), relax=True,
                                 presolve=False)
        if res.status == "optimal":
            bound = res.bound
        if frac is not None:
            realise(round_counts(frac, cls.L), "lp+local", frac)
        if frac is not None and pb.charges_devices and best is not None:
            # cut edges cost their devices a hop each, which the LP does not see between layers: also try each
            base = np.zeros(groups.B, dtype=np.int64)
            base[pb.group] = best[1]
            # program's layers split into whole-layer ranges by the LP's shares (counts.layer_split), then
            # whole-layer placements searched an interval of layers at a time from those splits, the plan so far and
            # each program wholly on one device (chains.chain_search); only the latter's best (two; one on two
            # devices) are polished: they are no slower than the splits they start from, and polishing more changed
            # no plan on the registry models (docs/BENCHMARKS.md, solver constants)
            splits = layer_split(pb, groups, cls, frac, base)
            for gp in chain_search(pb, groups, [base] + splits, t0 + 0.5 * time_limit, top=1 if pb.D == 2 else 2):
                polish(gp, CHAIN)
    searched = split is not None and not CHARGED_COUNTS_MILP  # the whole-layer searches ran (cut edges charge)
    if (incumbent() > bound * (1 + max(mip_gap, LP_PLAN_GAP)) or not tied) and not searched:
        # the cut-off is the list heuristic's plan, not a better realised LP plan: the MILP's objective is a
        # relaxation of the realised cycle time, and a cut-off that close to its optimum makes HiGHS search longer
        # for a first solution (docs/BENCHMARKS.md, solver constants)
        heuristic = warm_start()
        upper = heuristic if heuristic is not None else best[0] if best else None
        res, counts = solve_counts(pb, cls, groups.forbidden, max(1e-3, counts_end - time.perf_counter()),
                                   upper=upper, mip_gap=counts_gap)
        if res.status in ("optimal", "time limit"):
            bound = max(bound, res.bound)
        if counts is not None:
            realise(counts, "milp+local" if tied else "milp")
    if pb.streams and max(pb.streams) > 0:  # replicated workload: also search from request-dist (stream r on r)
        gp = np.zeros(groups.B, dtype=np.int64)
        gp[pb.group] = np.asarray(pb.streams, dtype=np.int64)[pb.prog] % pb.D
        gp = local_search(pb, groups, gp, t0 + 0.9 * time_limit)
        if block_memory_ok(pb, groups, gp):
            v = block_cycle(groups, gp)
            if best is None or v < best[0] * (1 - 1e-12):
                best, method = (v, groups.expand(gp)), "request-dist+local"
                polished = time.perf_counter() < t0 + 0.9 * time_limit  # an untied local optimum, if it ended itself
    if bound <= 0.0:
        bound = zero_comm_bound(cls.cost, cls.L, cls.pinned, groups.forbidden)
    if best is None and split is not None:
        best, method, polished, split = split[:2], split[3], split[2], None
    if best is None:
        raise_infeasible(pb, groups, "" if res.status == "infeasible" else
                         f"no feasible placement found within time_limit={time_limit:.3g} s; raise time_limit")
    value, place = best
    # the untied MILP (when it runs) is cut off at the counts path's plan, not at a better whole-layer split: that
    # cut-off only prunes, and HiGHS' time-limited search from the split's value can stop at a worse plan
    # (docs/BENCHMARKS.md, solver constants); the split is kept if it is still the better plan afterwards
    loose = tied and min(value, incumbent()) > bound * (1 + max(2 * mip_gap, RESOLVE_GAP))
    if loose and not untied_fits(groups.B * pb.D, time_limit):
        notes.append(f"untied MILP not started: {groups.B} groups x {pb.D} devices exceed "
                     f"{EXACT_BINARIES_PER_SECOND:g} binaries per second of time_limit={time_limit:g} s")
    elif loose and searched and groups.B * pb.D > CHARGED_EXACT_BINARIES:
        notes.append(f"untied MILP not started: {groups.B} groups x {pb.D} devices exceed "
                     f"{CHARGED_EXACT_BINARIES} binaries after the whole-layer search")
    elif loose:
        # small enough for the untied MILP: solve it exactly (within the time left), from the incumbent
        exact = build_classes(pb, groups, np.arange(groups.B))
        left = deadline - time.perf_counter()
        if groups.B * pb.D > EXACT_MILP_UNCAPPED:
            left = min(left, EXACT_MILP_SHARE * time_limit)
        r2, c2 = solve_counts(pb, exact, groups.forbidden, max(1e-3, left),
                              upper=value, mip_gap=mip_gap)
        if r2.status in ("optimal", "time limit"):
            bound = max(bound, r2.bound)
        if c2 is not None:
            gp = c2.argmax(1)
            v = block_cycle(groups, gp)
            if v < value * (1 - 1e-12) and block_memory_ok(pb, groups, gp):
                value, place, method, polished = v, groups.expand(gp), "milp(untied)", False
        notes.append(f"untied MILP on {groups.B} groups: {r2.status}")
    if split is not None and split[0] < value * (1 - 1e-12):
        value, place, method, polished = split[0], split[1], split[3], split[2]
    if value > bound * (1 + 1e-4) and not polished:  # polish untied
        gp = np.zeros(groups.B, dtype=np.int64)
        gp[pb.group] = place
        gp = local_search(pb, groups, gp, max(deadline, time.perf_counter() + 0.05 * time_limit))
        v2 = block_cycle(groups, gp)
        if v2 < value * (1 - 1e-12) and block_memory_ok(pb, groups, gp):
            value, place, method = v2, groups.expand(gp), method + "+local"
    if transfer_tolerance is not None and pb.D > 1:  # second objective: the same cycle with fewer bytes moved
        gp = np.zeros(groups.B, dtype=np.int64)
        gp[pb.group] = place
        gp2, v2, saved = trim_transfers(groups, gp, trim_limit(value, bound, transfer_tolerance, mip_gap),
                                        max(deadline, time.perf_counter() + 0.05 * time_limit), pb)
        if saved > 0:
            notes.append(f"{int((gp2 != gp).sum())} group(s) moved to cut {saved * 1e3:.3g} ms/step of link load "
                         f"(cycle {value * 1e3:.4g} -> {v2 * 1e3:.4g} ms)")
            value, place = v2, groups.expand(gp2)
    method = f"counts-{method}" if tied else method
    gap = 1 - bound / value if value > 0 else 0.0
    status = throughput_status(method, gap, mip_gap, res.status)
    return Solution(place, value, min(bound, value), method, status, res.nodes, cls.C, notes)


def throughput_status(method: str, gap: float, mip_gap: float, milp_status: str) -> str:
    """The throughput solve's status: a MIP gap is named only when a MILP found the plan (``method`` says
    ``milp``); a heuristic's or the LP rounding's plan states its distance from the bound instead."""
    if gap <= 1e-4:
        return "optimal"
    if gap <= mip_gap * (1 + 1e-6):
        return f"within mip_gap {mip_gap:g}" if "milp" in method else f"within {100 * gap:.2g} % of the bound"
    return "time limit" if milp_status == "time limit" else "feasible"


def untied_fits(binaries: int, time_limit: float) -> bool:
    """Whether the untied MILP over ``binaries`` (groups x devices) placement variables is worth starting within
    ``time_limit`` seconds: at most :data:`EXACT_BLOCKS` and :data:`EXACT_BINARIES_PER_SECOND` per second."""
    return binaries <= min(EXACT_BLOCKS, EXACT_BINARIES_PER_SECOND * time_limit)


def solve_latency(pb: Problem, time_limit: float, use_ties: bool = True) -> Solution:
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    groups = aggregate(pb, pb.group)
    if groups.forbidden.all():
        raise_infeasible(pb, groups)
    bound = latency_bound(pb)
    coupled = any(k == "STATE" for k in pb.ekind) or not np.isinf(pb.budgets).all()
    if not coupled and all(is_chain(pb, p) for p in range(len(pb.programs))):
        parts = [chain_dp(pb, p, pb.group) for p in range(len(pb.programs))]
        if all(x is not None for x in parts):
            place = np.concatenate(parts)
            v = latency_seconds(pb, place)
            notes = ["program is a chain: exact DP"]
            singles = [(latency_seconds(pb, h), h, f"homo-{g}") for g in range(pb.D)
                       for h in [np.full(pb.n, g, dtype=np.int64)] if _pins_allow(pb, h)]
            shed = shed_latency_cuts(pb, singles + [(v, place, "dp")], groups, LATENCY_CUT_TOLERANCE,
                                     t0 + 0.1 * time_limit)
            if shed is None:
                return Solution(place, v, v, "dp", "optimal", 0, groups.B, notes)
            value, kept, note = shed
            return Solution(kept, value, v, "dp+shed", "feasible", 0, groups.B, notes + [note])
    label, tied = tie_layers(pb) if use_ties else (pb.group, 0)
    work = aggregate(pb, label) if tied else groups
    cands: list[tuple[float, np.ndarray, str]] = []
    for name, place in [("heft", heft_latency(pb, label))] + [
            (f"homo-{g}", np.full(pb.n, g, dtype=np.int64)) for g in range(pb.D)] + _latency_baselines(pb):
        if (pb.pinned < 0).all() or name == "heft" or np.all(
                (pb.pinned[pb.group] < 0) | (pb.pinned[pb.group] == place)):
            if memory_ok(pb, place):
                cands.append((latency_seconds(pb, place), place, name))
    if not cands:  # nothing simple fits memory: the throughput plan does, if anything does
        try:
            place = solve_throughput(pb, 0.3 * time_limit, use_ties).place
            cands.append((latency_seconds(pb, place), place, "throughput"))
        except InfeasiblePlanError:
            pass
    upper = min(cands, key=lambda c: c[0])[0] if cands else None
    # tied, the MILP is a restriction: one more candidate, not a bound. Large, it is skipped; else it gets half the
    # time left, the local search the rest
    left = deadline - time.perf_counter()
    if tied and cands and pb.n > LATENCY_TIED_MILP_KERNELS:
        res = milp.MilpResult(None, np.inf, 0.0, f"skipped ({pb.n} kernels, tied)", 0, 0.0)
    else:
        res = milp.solve_latency(pb, work, max(1e-3, 0.5 * left if tied and cands else left), upper=upper)
    if res.bplace is not None:
        place = work.expand(res.bplace)
        cands.append((latency_seconds(pb, place), place, "milp"))
    if not tied and res.status in ("optimal", "time limit"):
        bound = max(bound, res.bound)
    if not tied and res.status == "no better than cutoff" and upper is not None:
        bound = max(bound, upper / (1 + 1e-6))  # the relaxation cannot beat the incumbent: it is optimal
    if not cands:
        raise_infeasible(pb, groups, "" if res.status == "infeasible" else
                         f"no feasible placement found within time_limit={time_limit:.3g} s; raise time_limit")
    value, place, method = min(cands, key=lambda c: c[0])
    if value > bound * (1 + 1e-4):
        for blocks in ([work, groups] if tied else [groups]):
            v2, p2 = latency_local_search(pb, blocks, place, value, deadline)
            if v2 < value * (1 - 1e-12):
                value, place, method = v2, p2, method + "+local"
    notes = [f"{tied} repeated layer(s) tied in the MILP"] if tied else []
    notes.append(f"critical-path MILP: {res.status}")
    shed = shed_latency_cuts(pb, cands + [(value, place, method)], groups, LATENCY_CUT_TOLERANCE,
                             max(deadline, time.perf_counter() + 0.1 * time_limit))
    if shed is not None:
        value, place, note = shed
        notes.append(note)
        method = method + "+shed"
    status = "optimal" if value <= bound * (1 + 1e-4) else ("time limit" if res.status == "time limit" else "feasible")
    return Solution(place, value, min(bound, value), method + ("(tied)" if tied and method == "milp" else ""),
                    status, res.nodes, work.B, notes)


def _pins_allow(pb: Problem, place: np.ndarray) -> bool:
    """Whether ``place`` keeps every pinned group on its pin (no memory check: the chain path has no budgets)."""
    pins = pb.pinned[pb.group]
    return bool(np.all((pins < 0) | (pins == place)))


def cut_count(pb: Problem, place: np.ndarray) -> int:
    """Number of dependency edges of ``pb`` whose two kernels ``place`` puts on different devices."""
    return int((place[pb.esrc] != place[pb.edst]).sum())


def shed_latency_cuts(pb: Problem, cands: list[tuple[float, np.ndarray, str]], groups: Blocks,
                      tolerance: float, deadline: float) -> tuple[float, np.ndarray, str] | None:
    """A latency plan with fewer cut edges whose predicted latency is within ``tolerance`` of the best of ``cands``.

    First the candidate with the fewest cut edges within that limit (single devices, baselines, HEFT, the MILP and
    the polished plan are all candidates; ties go to the lower latency); then, until ``deadline``, single-group
    moves that remove cut edges (each group of ``groups`` to the device most of its cut neighbours use) while the
    plan stays within the limit and fits memory.

    Args:
        pb: the problem.
        cands: ``(latency seconds, placement [n], name)`` of every plan found, the best one included.
        groups: ``pb`` aggregated over its hard groups (moves keep groups whole and respect their pins).
        tolerance: relative latency increase allowed (:data:`LATENCY_CUT_TOLERANCE`).
        deadline: ``time.perf_counter()`` value after which no move is tried.

    Returns:
        ``(latency seconds, placement, note for the plan)`` when it keeps fewer cut edges than the best of
        ``cands``, else ``None``.
    """
    incumbent = min(cands, key=lambda c: c[0])
    best = incumbent[0]
    limit = best * (1 + tolerance)
    ok = [c for c in cands if c[0] <= limit]
    value, place, name = min(ok, key=lambda c: (cut_count(pb, c[1]), c[0]))
    cuts = cut_count(pb, place)
    start = cut_count(pb, incumbent[1])
    moved = 0
    improved = cuts > 0
    while improved and time.perf_counter() < deadline:
        improved = False
        cut = place[pb.esrc] != place[pb.edst]
        touched = np.unique(np.concatenate([groups.label[pb.esrc[cut]], groups.label[pb.edst[cut]]]))
        for b in touched.tolist():
            if groups.pinned[b] >= 0 or time.perf_counter() > deadline:
                continue
            members = groups.label == b
            cur = int(place[members][0])
            # neighbours across this group's cut edges, by device
            out = members[pb.esrc] & cut
            inn = members[pb.edst] & cut
            others = np.concatenate([place[pb.edst[out]], place[pb.esrc[inn]]])
            if len(others) == 0:
                continue
            for g in np.argsort(-np.bincount(others, minlength=pb.D)).tolist():
                if g == cur or groups.forbidden[g]:
                    continue
                trial = place.copy()
                trial[members] = g
                c2 = cut_count(pb, trial)
                if c2 >= cuts:
                    continue
                v2 = latency_seconds(pb, trial)
                if v2 <= limit and memory_ok(pb, trial):
                    place, value, cuts, improved = trial, v2, c2, True
                    moved += 1
                    break
    if cuts >= start:
        return None
    how = f"from {name}" + (f", {moved} group move(s)" if moved else "")
    return value, place, (f"kept {cuts} of {start} cut edges ({how}) for a predicted latency "
                          f"{(value / best - 1) * 100:.2f} % above the best found (tolerance {tolerance:.0%})")


def _latency_baselines(pb: Problem) -> list[tuple[str, np.ndarray]]:
    """The ``layer``, ``af`` and ``pd`` baselines' placements chosen for latency (those that apply and fit): cheap
    candidates that respect memory budgets, which HEFT and single devices may not (a layer split can beat the tied
    MILP's time-limited plan; docs/BENCHMARKS.md, solver constants)."""
    from torch_tessera.errors import NotApplicableError
    from torch_tessera.scheduler import baselines

    out = []
    for name in ("layer", "af", "pd"):
        try:
            out.append((name, getattr(baselines, name)(pb, "latency")))
        except (NotApplicableError, InfeasiblePlanError):
            continue
    return out


def latency_local_search(pb: Problem, blocks: Blocks, place: np.ndarray, value: float,
                         deadline: float) -> tuple[float, np.ndarray]:
    """First-improvement moves of one block to another device, scored by the list-schedule simulator, until no move
    helps or ``deadline``. Keeps pins and memory budgets."""
    place = place.copy()
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for b in range(blocks.B):
            if blocks.pinned[b] >= 0:
                continue
            members = blocks.label == b
            cur = place[members][0]
            for g in range(pb.D):
                if g == cur or blocks.forbidden[g] or time.perf_counter() > deadline:
                    continue
                trial = place.copy()
                trial[members] = g
                v = latency_seconds(pb, trial)
                if v < value * (1 - 1e-9) and memory_ok(pb, trial):
                    place, value, improved = trial, v, True
                    break
    return value, place
