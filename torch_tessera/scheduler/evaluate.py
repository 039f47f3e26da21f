"""Score a placement: pipeline cycle time, one request's latency, and per-device memory.

Every plan, found by a solver or fixed by a baseline, is scored by these functions, so predicted times are comparable.

Cycle time (throughput policies). With enough micro-batches in flight, compute and copies overlap, and a workload
step takes ``max(max_g load_g, max_(a,b) link_ab)`` where ``load_g`` sums ``frequency x seconds`` of the kernels on
``g`` and ``link_ab`` sums ``frequency x (bytes / bandwidth_ab + micro_batches x latency_ab)`` over edges cut
``a -> b`` (each micro-batch pays the per-hop latency; Tessera paper §III-C, "min-max GPU load and link load").
The overlap is not perfect on real GPUs (each cut edge costs tens of microseconds of step time beyond its bytes;
docs/BENCHMARKS.md, cut cost), so ``load_g`` also holds, for every edge cut ``a -> b`` with ``g`` in ``{a, b}``,
``frequency x micro_batches x hop_ab + frequency x exposure_ab x bytes / bandwidth_ab``
(:meth:`Problem.device_coef`; figures in :attr:`Topology.hop_overhead`, :attr:`Topology.copy_exposure`).

Latency (latency policy). Each program is list-scheduled once: kernels in program order, each device runs one
kernel at a time, a cut edge's copy starts when its producer ends and its link is free and takes ``latency + bytes /
bandwidth``. A request's latency is ``sum_p frequency_p x makespan_p`` plus the STATE hand-overs between programs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torch_tessera.scheduler.problem import Problem
from torch_tessera.target.devices import format_bytes

if TYPE_CHECKING:
    from torch_tessera.scheduler.types import Plan, Workload


def link_coef(pb: Problem) -> np.ndarray:
    """``pb.link_coef()``, computed once per problem."""
    return pb.memo("link_coef", pb.link_coef)


def device_coef(pb: Problem) -> np.ndarray | None:
    """``pb.device_coef()``, computed once per problem; ``None`` when cut edges charge no device."""
    if not pb.charges_devices:
        return None
    return pb.memo("device_coef", pb.device_coef)


def loads(pb: Problem, place: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-device compute load ``[D]`` and per-link transfer load ``[D, D]`` (seconds per workload step)."""
    dev, link = loads_many(pb, np.asarray(place)[None])
    return dev[0], link[0]


def loads_many(pb: Problem, places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`loads` of ``P`` placements at once.

    Args:
        pb: the problem.
        places: ``[P, n]`` device of every kernel in each placement.

    Returns:
        ``([P, D] compute loads, [P, D, D] link loads)`` in seconds per workload step; each entry sums its terms in
        kernel (edge) order (then the cut edges' device charges, in edge order, source ends before destination
        ends), so it equals the one-placement sum bit for bit.
    """
    places = np.asarray(places, dtype=np.int64)
    P, D = places.shape[0], pb.D
    rows = np.arange(P)[:, None] * D
    w = pb.wcost[np.arange(pb.n)[None], places]
    dev = np.bincount((rows + places).ravel(), weights=w.ravel(), minlength=P * D).reshape(P, D)
    data = np.flatnonzero(pb.ewbytes > 0)
    a, b = places[:, pb.esrc[data]], places[:, pb.edst[data]]
    cut = a != b
    pi, ei = np.nonzero(cut)
    a, b = a[pi, ei], b[pi, ei]
    vals = link_coef(pb)[data[ei], a, b]
    link = np.bincount(pi * D * D + a * D + b, weights=vals, minlength=P * D * D).reshape(P, D, D)
    dcoef = device_coef(pb)
    if dcoef is not None and len(pi):
        dv = dcoef[data[ei], a, b]
        dev = dev + np.bincount(np.r_[pi * D + a, pi * D + b], weights=np.r_[dv, dv], minlength=P * D).reshape(P, D)
    return dev, link


def cycle_seconds(pb: Problem, place: np.ndarray) -> float:
    """Cycle time of one placement (seconds per workload step)."""
    return float(cycle_many(pb, np.asarray(place)[None])[0])


def cycle_many(pb: Problem, places: np.ndarray) -> np.ndarray:
    """Cycle times ``[P]`` of ``[P, n]`` placements (each equal to :func:`cycle_seconds` of that placement)."""
    dev, link = loads_many(pb, places)
    return np.maximum(dev.max(1), link.reshape(len(link), -1).max(1))


def _preds(pb: Problem) -> list[list[tuple[int, float]]]:
    """Per kernel its ``(source kernel, bytes)`` over the program's edges (STATE hand-overs left out), in edge order;
    computed once per problem."""
    def compute() -> list[list[tuple[int, float]]]:
        keep = np.flatnonzero(np.array(pb.ekind) != "STATE")
        keep = keep[np.argsort(pb.edst[keep], kind="stable")]  # by target kernel, each in edge order
        pairs = list(zip(pb.esrc[keep].tolist(), pb.ebytes[keep].tolist()))
        ptr = np.r_[0, np.cumsum(np.bincount(pb.edst[keep], minlength=pb.n))].tolist()
        return [pairs[a:b] for a, b in zip(ptr[:-1], ptr[1:])]

    return pb.memo("preds", compute)


def _as_lists(pb: Problem) -> tuple[list, list, list, list]:
    """``(cost, per-hop latency (:attr:`Problem.hop_latency`), bw, kernels of each program)`` as Python lists, for
    the list-schedule loop (indexing numpy arrays element by element costs several times more); once per problem."""
    return pb.memo("lists", lambda: (pb.cost.tolist(), pb.hop_latency.tolist(), pb.bw.tolist(),
                                     [pb.program_slice(p).tolist() for p in range(len(pb.programs))]))


def makespans(pb: Problem, place: np.ndarray) -> np.ndarray:
    """Makespan of one run of each program (seconds), list-scheduled as in the module docstring."""
    preds = _preds(pb)
    cost, alpha, bw, kernels = _as_lists(pb)
    finish = [0.0] * pb.n
    pl = np.asarray(place).tolist()
    out = np.zeros(len(pb.programs))
    for p in range(len(pb.programs)):
        dev_free = [0.0] * pb.D
        link_free = [[0.0] * pb.D for _ in range(pb.D)]
        end = 0.0
        for k in kernels[p]:
            d = pl[k]
            ready = 0.0
            for s, nbytes in preds[k]:
                a = pl[s]
                if a == d:  # finished on d before dev_free[d]: cannot delay k
                    continue
                t = finish[s]
                if nbytes > 0:  # the copy waits for its producer and for its link
                    free = link_free[a]
                    t = max(t, free[d]) + alpha[a][d] + nbytes / bw[a][d]
                    free[d] = t
                if t > ready:
                    ready = t
            f = max(ready, dev_free[d]) + cost[k][d]
            finish[k] = f
            dev_free[d] = f
            if f > end:
                end = f
        out[p] = end
    return out


def handover_seconds(pb: Problem, place: np.ndarray) -> float:
    """Seconds of STATE hand-overs between programs per workload step (one copy each, when owners differ)."""
    state = pb.memo("state_edges", lambda: [e for e, kind in enumerate(pb.ekind) if kind == "STATE"])
    tot = 0.0
    for e in state:
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
    on = resident_on(pb, np.asarray(place)[None])[0]  # [R, D]
    nbytes = holder_entries(pb)[2]
    kinds = np.array([r.kind for r in pb.resident], dtype=object)
    part = {k: (nbytes * (kinds == k)) @ on.astype(np.int64) for k in ("parameter", "state")}
    weight, state = part["parameter"].astype(np.float64), part["state"].astype(np.float64)
    act = ((nbytes * ((kinds != "parameter") & (kinds != "state"))) @ on.astype(np.int64)).astype(np.float64)
    params = np.flatnonzero(kinds == "parameter")
    names = [[pb.resident[r].name for r in params[on[params, g]]] for g in range(D)]
    peak = np.zeros(D)
    for p in range(len(pb.programs)):
        ks = pb.program_slice(p)
        for g in range(D):
            mine = ks[place[ks] == g]
            if len(mine):
                peak[g] = max(peak[g], _peak(mine, pb))
    act += peak
    return {"weight": weight, "state": state, "activation": act, "total": weight + state + act,
            "weights": [sorted(n) for n in names]}


def _peak(kernels: np.ndarray, pb: Problem) -> float:
    """Peak TEMP bytes of ``kernels`` (ascending, one program) run in order on one device."""
    from torch_tessera.scheduler.problem import live_peak, temp_entries

    temps = pb.memo("temps", lambda: temp_entries([r | w for r, w in zip(pb.reads, pb.writes)], pb.temp_bytes,
                                                  pb.prog.tolist()))  # compile_problem stores them first
    return float(live_peak(kernels, temps, pb.n))


def holder_entries(pb: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(buffer, kernel, nbytes)``: one entry per (resident buffer, holder kernel) pair, and the buffers' bytes;
    computed once per problem."""
    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sizes = [len(r.holders) for r in pb.resident]
        buf = np.repeat(np.arange(len(pb.resident)), sizes)
        ker = np.concatenate([r.holders for r in pb.resident]) if pb.resident else np.zeros(0, np.int64)
        return buf, ker.astype(np.int64), np.array([r.nbytes for r in pb.resident], dtype=np.int64)

    return pb.memo("holder_entries", compute)


def resident_on(pb: Problem, places: np.ndarray) -> np.ndarray:
    """Whether each resident buffer lives on each device: ``[P, R, D]`` bool for ``[P, n]`` placements (a buffer
    lives wherever one of its holder kernels runs)."""
    places = np.asarray(places, dtype=np.int64)
    buf, ker, _ = holder_entries(pb)
    on = np.zeros((places.shape[0], len(pb.resident), pb.D), dtype=bool)
    on[np.arange(places.shape[0])[:, None], buf[None], places[:, ker]] = True
    return on


def resident_bytes(pb: Problem, place: np.ndarray) -> np.ndarray:
    """Bytes of resident buffers (weights, state, inputs) per device: what the solvers' memory rows count.

    Args:
        pb: the problem.
        place: ``[n]`` placement (returns ``[D]``) or ``[P, n]`` placements (returns ``[P, D]``).
    """
    place = np.asarray(place, dtype=np.int64)
    many = place.ndim == 2
    on = resident_on(pb, place if many else place[None])
    nbytes = holder_entries(pb)[2]
    out = np.einsum("prd,r->pd", on.astype(np.int64), nbytes).astype(np.float64)  # integers: exact
    return out if many else out[0]


def budgets_bind(pb: Problem) -> bool:
    """Whether some placement could break a memory budget: ``False`` when all resident buffers together with the
    activation reserve fit on every device and every shared pool (then every placement fits)."""
    if np.isinf(pb.budgets).all() and not len(pb.pool_budgets):
        return False
    return pb.memory_could_bind(float(holder_entries(pb)[2].sum()))


def fits_many(pb: Problem, places: np.ndarray) -> np.ndarray:
    """``[P]`` bool: whether each placement fits every budget it uses (resident bytes + activation reserve), and
    the devices of each memory pool (partitions of one GPU) fit its budget together (:meth:`Problem.pool_bytes`)."""
    places = np.asarray(places, dtype=np.int64)
    if not budgets_bind(pb):
        return np.ones(len(places), dtype=bool)
    held, nbytes = resident_on(pb, places), holder_entries(pb)[2]
    used = np.einsum("prd,r->pd", held.astype(np.int64), nbytes).astype(np.float64) + pb.reserve
    on = (places[:, :, None] == np.arange(pb.D)[None, None]).any(1)
    return np.all(~on | (used <= pb.budgets * (1 + 1e-9)), axis=1) & ~pb.pool_over(held, nbytes, on).any(1)


def memory_ok(pb: Problem, place: np.ndarray) -> bool:
    """Whether ``place`` fits every budget with the activation reserve of :attr:`Problem.reserve`."""
    return bool(fits_many(pb, np.asarray(place)[None])[0])


def pool_line(pb: Problem, k: int, need: float) -> str:
    """What memory pool ``k`` lacks, in words: ``"GPU cuda:0 (the 141.00 GB of one NVIDIA H200, shared by ...) needs
    207.34 GB, has 141.00 GB (short by 66.34 GB)"``."""
    have = float(pb.pool_budgets[k])
    members = [pb.devices[g] for g in np.flatnonzero(pb.pools[k])]
    whom = "its partitions together" if len(members) > 1 else members[0]
    return (f"GPU {pb.pool_names[k]} ({pb.pool_sources[k] or 'shared by ' + ', '.join(members)}) needs "
            f"{format_bytes(need)} for {whom}, has {format_bytes(have, need)} "
            f"(short by {format_bytes(need - have, need)})")


def fill_drain_seconds(plan: "Plan", workload: "Workload", in_flight: int) -> float:
    """Seconds per workload step a plan's programs that span devices idle filling and draining their pipeline,
    beyond the cycle time: ``sum_p f_p x (sum_d L_pd - max_d L_pd) / M``.

    ``L_pd`` is program ``p``'s kernel seconds per call on device ``d`` under the plan (the workload's per-launch
    costs), ``f_p`` its runs per step (the plan's ``frequencies``, else the workload's), ``M`` = ``in_flight`` the
    calls kept in flight (the measured bench times rounds of ``micro_batches`` calls; 1: one call at a time, a
    chain over two devices then runs serially). A program on one device adds nothing. The cycle model assumes every
    device busy all the time; a program whose calls pass from one device to the other leaves each device idle while
    a round of ``M`` calls fills and drains, about the other devices' share of one call.

    Not fitted: a model term with no free parameter, checked against executed plans (docs/BENCHMARKS.md, step
    model; ``tessera report step-model``).

    Raises:
        ValueError: ``in_flight`` < 1, or a program of the plan has no costs in ``workload``.
    """
    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    progs = {p.name: p for p in workload.programs}
    total = 0.0
    for name, placement in plan.placements.items():
        prog = progs.get(name) or progs.get(name.rsplit("@", 1)[0])  # a request stream's program: same costs
        if prog is None or prog.costs is None:
            raise ValueError(f"program {name!r} of the plan has no costs in the workload")
        freq = (plan.frequencies or {}).get(name, prog.frequency)
        per_device = np.zeros(len(prog.costs.devices))
        for launch, dev in placement.items():
            per_device[dev] += prog.costs.row(launch)[dev]
        total += freq * (per_device.sum() - per_device.max()) / in_flight
    return float(total)
