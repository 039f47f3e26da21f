"""MILP building blocks and the latency MILP, solved with SciPy's HiGHS (:mod:`torch_tessera.compat.scipy_highs`).

The throughput MILP lives in :mod:`counts` (placement counts per repeated-layer class; with no repetition it is the
plain placement MILP). Here: the shared model builder, placement and cut variables, memory rows, the least memory
shortfall (for error messages), and the latency MILP. The throughput model, for reference (Tessera paper §III-C;
docs/DESIGN.md):

    x[b,g] in {0,1}, sum_g x[b,g] = 1                       every block on one device
    sum_b cost[b,g] x[b,g] <= T                             compute load of device g
    sum_e coef[e,a,c] (edge e cut a -> c) <= T              transfer load of link a -> c
    sum_r bytes[r] (r held on g) <= budget[g] - reserve     memory of g (weights, state, inputs; activation reserve)
    minimise T + eps (sum of loads)                         eps breaks ties towards less work and traffic

Latency (min one request's critical path), over kernels k with finish times f[k]:

    f[j] >= f[i] + sum_g c[j,g] x[b(j),g] + sum_{a!=c} tau[e,a,c] z[e,a,c]    every edge i -> j
    L_p >= f[k] (k in program p), L_p >= sum_{k in p} c[k,g] x[b(k),g]      makespan bounds
    minimise sum_p frequency_p L_p + hand-overs

The latency MILP is a relaxation of the list-scheduled latency (:func:`evaluate.latency_seconds`): it ignores the
waiting of independent kernels for a busy device or link. So its dual bound is a valid lower bound, and its solution
is re-scored by the simulator.

Times are scaled by ``scale`` (seconds) so that T is near 1, bytes by 1e9; both keep HiGHS' absolute tolerances
meaningful.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix

from torch_tessera.scheduler.blocks import Blocks
from torch_tessera.scheduler.problem import Problem

log = logging.getLogger(__name__)

#: Folder every MILP is written to (``milp_<n>.mps``) before it is solved, while :func:`torch_tessera.scheduler.plan`
#: runs with ``dump_dir`` set; ``None``: no dump.
DUMP_DIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("tessera_milp_dump_dir", default=None)

#: Weight of the tie-breaking term relative to T (dimensionless).
EPS = 1e-5


@dataclass
class MilpResult:
    bplace: np.ndarray | None  # block placement, None when no solution
    objective: float  # seconds (tie-break term removed from the bound side conservatively)
    bound: float  # seconds, valid lower bound of the solved model's objective
    status: str  # "optimal" | "time limit" | "infeasible" | "failed"
    nodes: int
    wall: float


class MilpModel:
    """Accumulates variables and sparse rows; ``solve`` calls HiGHS once."""

    def __init__(self) -> None:
        self.lb, self.ub, self.integ, self.c = [], [], [], []
        self.rows, self.cols, self.vals, self.rlo, self.rhi = [], [], [], [], []
        self.nv = 0
        self.nr = 0

    def vars(self, k: int, lb=0.0, ub=1.0, integer=False, cost=0.0) -> np.ndarray:
        idx = np.arange(self.nv, self.nv + k)
        self.nv += k
        self.lb.append(np.broadcast_to(np.asarray(lb, float), (k,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, float), (k,)))
        self.integ.append(np.full(k, 1 if integer else 0))
        self.c.append(np.broadcast_to(np.asarray(cost, float), (k,)))
        return idx

    def rows_coo(self, r: np.ndarray, c: np.ndarray, v: np.ndarray, lo, hi, nrows: int) -> None:
        """Add ``nrows`` rows; ``r`` holds local row indices 0..nrows-1."""
        self.rows.append(np.asarray(r) + self.nr)
        self.cols.append(np.asarray(c))
        self.vals.append(np.asarray(v, float))
        self.rlo.append(np.broadcast_to(np.asarray(lo, float), (nrows,)))
        self.rhi.append(np.broadcast_to(np.asarray(hi, float), (nrows,)))
        self.nr += nrows

    def solve(self, time_limit: float, objective_bound: float | None = None, mip_gap: float = 1e-6,
              relax: bool = False, presolve: bool = True):
        """Solve with HiGHS; ``relax``: the LP relaxation (integrality dropped, no cut-off); ``presolve=False`` skips
        HiGHS' presolve (on the counts LPs it costs more than it saves: 14 vs 7 ms, 160 vs 37 ms)."""
        A = coo_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                       shape=(self.nr, self.nv)).tocsr()
        dump_dir = DUMP_DIR.get()
        if dump_dir is not None:
            from torch_tessera.compat.scipy_highs import write_mps

            os.makedirs(dump_dir, exist_ok=True)
            path = os.path.join(dump_dir, f"milp_{len([f for f in os.listdir(dump_dir) if f.endswith('.mps')])}.mps")
            write_mps(path, np.concatenate(self.c), np.concatenate(self.integ), np.concatenate(self.lb),
                      np.concatenate(self.ub), A, np.concatenate(self.rlo), np.concatenate(self.rhi))
            log.info("wrote the MILP (%d variables, %d rows) to %s", self.nv, self.nr, path)
        opts = {"time_limit": max(1e-3, float(time_limit)), "presolve": bool(presolve), "mip_rel_gap": float(mip_gap)}
        if objective_bound is not None and not relax:
            opts["objective_bound"] = float(objective_bound)
        integ = np.concatenate(self.integ)
        # the model scipy.optimize.milp would pass, without its per-column Python overhead (compat.scipy_highs)
        from torch_tessera.compat.scipy_highs import solve

        return solve(np.concatenate(self.c), np.zeros_like(integ) if relax else integ, np.concatenate(self.lb),
                     np.concatenate(self.ub), A, np.concatenate(self.rlo), np.concatenate(self.rhi), opts)


def _placement_vars(m: MilpModel, blocks: Blocks, D: int) -> np.ndarray:
    """Binary x ``[B, D]`` with one device per block, pins and forbidden devices as bounds."""
    B = blocks.B
    ub = np.ones((B, D))
    ub[:, blocks.forbidden] = 0.0
    lb = np.zeros((B, D))
    pin = blocks.pinned >= 0
    ub[pin] = 0.0
    ub[pin, blocks.pinned[pin]] = 1.0
    lb[pin, blocks.pinned[pin]] = 1.0
    x = m.vars(B * D, lb=lb.ravel(), ub=ub.ravel(), integer=True).reshape(B, D)
    m.rows_coo(np.repeat(np.arange(B), D), x.ravel(), np.ones(B * D), 1.0, 1.0, B)
    return x


def _cut_vars(m: MilpModel, x: np.ndarray, src: np.ndarray, dst: np.ndarray, D: int, cost: np.ndarray | float = 0.0):
    """z ``[E, D, D]`` (diagonal unused) with z[e,a,c] >= x[src,a] + x[dst,c] - 1."""
    E = len(src)
    pairs = [(a, c) for a in range(D) for c in range(D) if a != c]
    P = len(pairs)
    z = m.vars(E * P, lb=0.0, ub=1.0, cost=cost).reshape(E, P)
    pa = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    rows = np.arange(E * P)
    cols = np.stack([z.ravel(), x[np.repeat(src, P), np.tile(pa[0], E)], x[np.repeat(dst, P), np.tile(pa[1], E)]], 1)
    vals = np.tile(np.array([1.0, -1.0, -1.0]), E * P)
    m.rows_coo(np.repeat(rows, 3), cols.ravel(), vals, -1.0, np.inf, E * P)
    return z, pairs


def _memory_rows(m: MilpModel, pb: Problem, blocks: Blocks, x: np.ndarray, slack: np.ndarray | None = None,
                 pool_slack: np.ndarray | None = None) -> None:
    """Resident bytes per device within ``budget - reserve``, and per memory pool within its budget less one reserve
    per member (in GB; a buffer held on several members counts once); ``slack`` / ``pool_slack`` add a per-device /
    per-pool overflow var."""
    D = pb.D
    cap = (pb.budgets - pb.reserve) / 1e9
    pooled = pb.pools.any(0)
    limited = [g for g in range(D) if (np.isfinite(cap[g]) or pooled[g]) and not blocks.forbidden[g]]
    if not limited or not len(blocks.res_bytes):
        return
    single = [i for i, h in enumerate(blocks.res_holders) if len(h) == 1]
    multi = [i for i, h in enumerate(blocks.res_holders) if len(h) > 1]
    w = m.vars(len(multi) * D, lb=0.0, ub=1.0).reshape(len(multi), D) if multi else np.zeros((0, D), np.int64)
    if multi:  # w[r,g] - x[b,g] >= 0
        rr, cc, vv, nrow = [], [], [], 0
        for j, i in enumerate(multi):
            for b in blocks.res_holders[i]:
                for g in limited:
                    rr += [nrow, nrow]
                    cc += [w[j, g], x[b, g]]
                    vv += [1.0, -1.0]
                    nrow += 1
        m.rows_coo(np.array(rr), np.array(cc), np.array(vv), 0.0, np.inf, nrow)
    terms = {g: ([x[blocks.res_holders[i][0], g] for i in single] + [w[j, g] for j in range(len(multi))],
                 [blocks.res_bytes[i] / 1e9 for i in single] + [blocks.res_bytes[i] / 1e9 for i in multi])
             for g in limited}
    for g in limited:
        if not np.isfinite(cap[g]):
            continue
        cols, vals = list(terms[g][0]), list(terms[g][1])
        if slack is not None:
            cols.append(slack[g])
            vals.append(-1.0)
        m.rows_coo(np.zeros(len(cols), np.int64), np.array(cols), np.array(vals), -np.inf, cap[g], 1)
    if len(pb.pool_budgets):
        _pool_rows(m, pb, blocks, x, w, single, multi, list(terms), pool_slack)


def _pool_rows(m: MilpModel, pb: Problem, blocks: Blocks, x: np.ndarray, w: np.ndarray, single: list[int],
               multi: list[int], limited: list[int], pool_slack: np.ndarray | None) -> None:
    """Resident bytes of each memory pool's members together within its budget less one reserve per member (in GB):
    a buffer of one holder block counts where that block runs, one of several (``w[j, g]``, see
    :func:`_memory_rows`) once per pool through ``u[j] >= w[j, g]`` for each member ``g``."""
    for k in range(len(pb.pool_budgets)):  # members of one pool together; a forbidden member holds nothing
        members = [g for g in np.flatnonzero(pb.pools[k]).tolist() if g in limited]
        if not members:
            continue
        u = m.vars(len(multi), lb=0.0, ub=1.0)
        if multi:
            nrow = len(multi) * len(members)
            rows = np.repeat(np.arange(nrow), 2)
            cc = np.array([[u[j], w[j, g]] for j in range(len(multi)) for g in members]).ravel()
            m.rows_coo(rows, cc, np.tile([1.0, -1.0], nrow), 0.0, np.inf, nrow)
        cols = [x[blocks.res_holders[i][0], g] for g in members for i in single] + u.tolist()
        vals = [blocks.res_bytes[i] / 1e9 for _ in members for i in single] + [blocks.res_bytes[i] / 1e9 for i in multi]
        if pool_slack is not None:
            cols.append(pool_slack[k])
            vals.append(-1.0)
        pcap = (pb.pool_budgets[k] - pb.reserve * len(members)) / 1e9
        m.rows_coo(np.zeros(len(cols), np.int64), np.array(cols), np.array(vals), -np.inf, pcap, 1)


def milp_result(res, scale: float, bplace_from, t0: float, shrink: float = 1.0) -> MilpResult:
    """A :class:`MilpResult` from HiGHS' result ``res``: the objective times ``scale``, the bound times
    ``scale / shrink``, the placement from ``bplace_from(x)``, wall seconds since ``t0``."""
    status = {0: "optimal", 1: "time limit", 2: "infeasible"}.get(res.status, "failed")
    wall = time.perf_counter() - t0
    nodes = int(getattr(res, "mip_node_count", 0) or 0)
    bound = getattr(res, "mip_dual_bound", None)
    if bound is None and status == "optimal" and res.fun is not None:  # an LP: its optimum bounds the MILP
        bound = float(res.fun) * (1 - 1e-7)  # within HiGHS' LP tolerances
    bound = 0.0 if bound is None or not np.isfinite(bound) else float(bound) * scale / shrink
    if res.x is None:
        return MilpResult(None, np.inf, bound, status if status != "optimal" else "failed", nodes, wall)
    return MilpResult(bplace_from(res.x), float(res.fun) * scale, bound, status, nodes, wall)


def memory_shortfall(pb: Problem, blocks: Blocks, time_limit: float = 5.0) -> tuple[np.ndarray, np.ndarray] | None:
    """Least bytes each device (``[D]``) and each memory pool (``[K]``) lacks for any placement to fit (a pool's
    counts one activation reserve per member), or ``None`` if it could not be computed."""
    D, B = pb.D, blocks.B
    m = MilpModel()
    x = _placement_vars(m, blocks, D)
    slack = m.vars(D, lb=0.0, ub=np.inf, cost=1.0)
    K = len(pb.pool_budgets)
    pool_slack = m.vars(K, lb=0.0, ub=np.inf, cost=1.0) if K else np.zeros(0, np.int64)
    _memory_rows(m, pb, blocks, x, slack=slack, pool_slack=pool_slack)
    res = m.solve(time_limit)
    if res.x is None:
        return None
    return np.maximum(res.x[slack], 0.0) * 1e9, np.maximum(res.x[pool_slack], 0.0) * 1e9 if K else np.zeros(0)


def solve_latency(pb: Problem, blocks: Blocks, time_limit: float, upper: float | None = None) -> MilpResult:
    """Minimise the critical-path relaxation of one request's latency (see module docstring)."""
    t0 = time.perf_counter()
    D, B, n = pb.D, blocks.B, pb.n
    scale = float(upper) if upper and np.isfinite(upper) and upper > 0 else 1e-3
    m = MilpModel()
    x = _placement_vars(m, blocks, D)
    _memory_rows(m, pb, blocks, x)
    P = len(pb.programs)
    L = m.vars(P, lb=0.0, ub=np.inf, cost=pb.freq)
    f = m.vars(n, lb=0.0, ub=np.inf)
    c = pb.cost / scale
    lab = blocks.label
    data = np.flatnonzero((pb.ebytes > 0) & (np.array(pb.ekind) != "STATE") & (lab[pb.esrc] != lab[pb.edst]))
    tau = (pb.hop_latency[None] + pb.ebytes[data, None, None] / pb.bw[None]) / scale  # [Ed, D, D]
    hand = np.flatnonzero((np.array(pb.ekind) == "STATE") & (lab[pb.esrc] != lab[pb.edst]))
    tau_h = (pb.alpha[None] + pb.ebytes[hand, None, None] / pb.bw[None]) / scale
    pairs = [(a, b) for a in range(D) for b in range(D) if a != b]
    if len(hand) and D > 1:
        _cut_vars(m, x, lab[pb.esrc[hand]], lab[pb.edst[hand]], D,
                  cost=np.array([tau_h[:, a, b] for a, b in pairs]).T.ravel())
    z = _cut_vars(m, x, lab[pb.esrc[data]], lab[pb.edst[data]], D)[0] if len(data) and D > 1 else None
    # own cost: f[k] - sum_g c[k,g] x[b(k),g] >= 0
    r = np.concatenate([np.arange(n), np.repeat(np.arange(n), D)])
    cc = np.concatenate([f, x[lab].ravel()])
    v = np.concatenate([np.ones(n), -c.ravel()])
    m.rows_coo(r, cc, v, 0.0, np.inf, n)
    # precedence: f[j] - f[i] - cost_j - transfer >= 0
    prec = np.flatnonzero(np.array(pb.ekind) != "STATE")
    slot = {e: i for i, e in enumerate(data.tolist())}
    rr, cl, vl = [], [], []
    for row, e in enumerate(prec.tolist()):
        i, j = int(pb.esrc[e]), int(pb.edst[e])
        rr += [row, row]
        cl += [f[j], f[i]]
        vl += [1.0, -1.0]
        rr += [row] * D
        cl += x[lab[j]].tolist()
        vl += (-c[j]).tolist()
        if z is not None and e in slot:
            s = slot[e]
            rr += [row] * len(pairs)
            cl += z[s].tolist()
            vl += [-tau[s, a, b] for a, b in pairs]
    m.rows_coo(np.array(rr, np.int64), np.array(cl, np.int64), np.array(vl), 0.0, np.inf, len(prec))
    # makespan bounds: L_p - f[k] >= 0, L_p - load_{p,g} >= 0
    m.rows_coo(np.concatenate([np.arange(n), np.arange(n)]), np.concatenate([L[pb.prog], f]),
               np.concatenate([np.ones(n), -np.ones(n)]), 0.0, np.inf, n)
    for p in range(P):
        ks = pb.program_slice(p)
        for g in range(D):
            m.rows_coo(np.zeros(len(ks) + 1, np.int64), np.concatenate([[L[p]], x[lab[ks], g]]),
                       np.concatenate([[1.0], -c[ks, g]]), 0.0, np.inf, 1)
    ob = upper / scale * (1 + 1e-6) if upper and np.isfinite(upper) else None
    res = m.solve(time_limit, ob)
    out = milp_result(res, scale, lambda xs: xs[x].reshape(B, D).argmax(1), t0)
    if out.bplace is None and out.status == "infeasible" and ob is not None:
        out.status = "no better than cutoff"
    log.debug("latency MILP: %d blocks, %d vars, %d rows: %s in %.3f s", B, m.nv, m.nr, out.status, out.wall)
    return out
