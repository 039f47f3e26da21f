"""Kernel-to-device planning: one entry function, :func:`plan`, returning a :class:`Plan` (and
:func:`plan_streams`, the throughput plan of a workload served as one request stream per device).

Policies: ``"throughput"`` (min pipeline cycle time, MILP), ``"latency"`` (min one request's critical path), and the
baselines ``"homo-<i>"`` (``"homo-L"``/``"homo-R"`` on a pair), ``"request-dist"``, ``"pd"``, ``"af"``, ``"layer"``
(see :mod:`torch_tessera.scheduler.baselines`). A baseline that does not apply raises :class:`NotApplicableError`;
a budget nothing fits raises :class:`~torch_tessera.errors.InfeasiblePlanError` naming the short device.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from torch_tessera import jsonout
from torch_tessera.errors import ConfigError, InfeasiblePlanError
from torch_tessera.options import SCHEDULER_POLICIES, homo_names
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler import baselines, cache
from torch_tessera.scheduler.blocks import aggregate
from torch_tessera.scheduler.build import make_plan
from torch_tessera.scheduler.heuristics import latency_bound, zero_comm_bound
from torch_tessera.scheduler.pipeline_plan import (SCORES, PipelineModel, simulated_schedules, simulated_seconds,
                                                   step_lower_bound, surrogate_topology)
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.solve import LP_PLAN_GAP, TRANSFER_TOLERANCE, solve_latency, solve_throughput
from torch_tessera.scheduler.types import (CutEdge, NotApplicableError, Plan, SolverInfo, Workload,  # noqa: F401
                                           WorkloadProgram)

log = logging.getLogger(__name__)

POLICIES = SCHEDULER_POLICIES


def plan(dag_or_workload: DependencyGraph | Workload, costs: CostTable | Mapping[str, CostTable] | None,
         topology: Topology, *, policy: str = "throughput",
         memory_budgets: Sequence[int | None] | Mapping[str, int] | None = None,
         pins: Mapping[int | tuple[str, int], int | str] | None = None, time_limit: float = 10.0,
         micro_batches: int = 2, cache_dir: str | os.PathLike | None | bool = None, objective: str | None = None,
         tie_layers: bool = True, mip_gap: float = 5e-3, dump_dir: str | os.PathLike | None = None,
         score: str = "simulate", pipeline: PipelineModel | None = None) -> Plan:
    """Plan where every kernel runs.

    Args:
        dag_or_workload: one program's DAG, or a :class:`Workload` of several (prefill and decode...).
        costs: seconds of each launch on each device; for a workload, a mapping program name -> table (or ``None``
            when the workload's programs carry their tables).
        topology: devices (same names as the cost tables), link bandwidth (bytes/s) and latency (seconds).
        policy: ``"throughput"``, ``"latency"`` or a baseline name (see module docstring).
        memory_budgets: bytes per device (sequence in topology order, or device name -> bytes; ``None`` entries are
            unlimited); defaults to ``topology.memory`` with ``topology.memory_pools`` (partitions of one GPU hold
            its memory together, a buffer they share once), else unlimited. Given budgets replace both.
        pins: launch index (or ``(program, launch index)``) -> device index or name.
        time_limit: seconds for the solver; the best placement found by then is returned, with its gap.
        micro_batches: micro-batches in flight in the throughput pipeline; each pays the per-hop latency.
        cache_dir: plan cache directory; ``None``: ``$TESSERA_CACHE_DIR/plans`` or ``~/.cache/torch_tessera/plans``;
            ``False``: no cache. Only the solved policies are cached.
        objective: for baselines, ``"cycle"`` (default) or ``"latency"``: what ``predicted_seconds`` reports.
        tie_layers: plan identical repeated layers as counts ("n of the L layers run kernel r on device g"; the
            counts MILP's bound stays valid for every placement) for throughput, and share one decision per layer
            position in the latency MILP. ``False`` solves the full MILP (exact when it finishes in ``time_limit``).
        mip_gap: the throughput MILP stops once its incumbent is proven within this relative gap (0.005 = 0.5 %).
            With tied layers the counts MILP stops at ``max(2 mip_gap, solve.COUNTS_GAP)``, and a plan realised from
            the counts LP within ``max(mip_gap, solve.LP_PLAN_GAP)`` of its bound is returned without it.
        dump_dir: when set, every MILP solved for this plan is written there as ``milp_<n>.mps`` (HiGHS' MPS writer)
            and the plan as ``plan_<policy>_<n>.json``, so a solve can be replayed with any MILP solver (the plan
            cache is bypassed then: a cached plan has no MILP to write).
        score: how throughput plans are scored (:data:`pipeline_plan.SCORES`): ``"simulate"`` (default: the search
            charges each cut edge one wait, :data:`modulo.WAIT_SECONDS`, instead of the topology's flat per-cut
            charge, and the solver's plan and every baseline placement are compared by the simulated step of their
            pipelined schedules, :func:`pipeline_plan.simulated_seconds`) or ``"cycle"`` (the cycle model with the
            topology's per-cut charge, :attr:`Topology.hop_overhead`, as before the simulator). Every plan records
            its simulated step in :attr:`Plan.simulated_seconds` with ``"simulate"``.
        pipeline: domains, bandwidths and wait cost for the simulator (default: domains from the device names,
            no bandwidth sharing: :meth:`PipelineModel.from_names`); :meth:`PipelineModel.from_specs` models the
            DRAM bandwidth that partitions of one GPU share.

    Returns:
        The :class:`Plan`; ``print(plan)`` shows its summary table.

    Raises:
        InfeasiblePlanError: no placement fits the memory budgets and pins (names the short device, or the GPU whose
            partitions lack memory together, and by how much).
        NotApplicableError: a baseline does not apply to this workload.
        ConfigError: bad arguments (unknown policy or score, cost tables that do not match the DAG or the devices).
    """
    if score not in SCORES:
        raise ConfigError(f"score must be one of {SCORES}, got {score!r}")
    if dump_dir is not None:
        from torch_tessera.scheduler.milp import DUMP_DIR

        token = DUMP_DIR.set(os.fspath(dump_dir))
        try:
            result = plan(dag_or_workload, costs, topology, policy=policy, memory_budgets=memory_budgets, pins=pins,
                          time_limit=time_limit, micro_batches=micro_batches, cache_dir=False,  # solve: dump
                          objective=objective, tie_layers=tie_layers, mip_gap=mip_gap, score=score,
                          pipeline=pipeline)
        finally:
            DUMP_DIR.reset(token)
        _dump_plan(result, policy, os.fspath(dump_dir))
        return result
    # Python's cyclic garbage collector is off while a plan is made (as it was before afterwards). Planning
    # allocates many short-lived containers (the problem's per-kernel lists and sets, the plan's cut edges), which
    # trigger collections that each walk the whole young heap; in the process that lowered the model that heap is the
    # lowering's (about 1.5 million tracked objects after lowering Mixtral-8x7B). It is turned off before anything
    # is allocated here (a context manager's own generator object could start a collection first). Reference cycles
    # made while planning, if any, are freed by the first collection after it.
    was = gc.isenabled()
    gc.disable()
    try:
        return _plan(dag_or_workload, costs, topology, policy, memory_budgets, pins, time_limit, micro_batches,
                     cache_dir, objective, tie_layers, mip_gap, score, pipeline)
    finally:
        if was:
            gc.enable()


def _plan(dag_or_workload, costs, topology, policy, memory_budgets, pins, time_limit, micro_batches, cache_dir,
          objective, tie_layers, mip_gap, score, pipeline) -> Plan:
    """:func:`plan` once the dump directory is handled (same arguments)."""
    t0 = time.perf_counter()
    wl = as_workload(dag_or_workload, costs)
    model = pipeline if pipeline is not None else PipelineModel.from_names(topology.devices)
    pb = compile_problem(wl, topology, memory_budgets=memory_budgets, pins=pins, micro_batches=micro_batches)
    sim = _Simulated(wl, topology, model, micro_batches) if score == "simulate" else None
    solved = policy in ("throughput", "latency")
    directory, key = None, None
    if solved and cache_dir is not False:
        directory = cache.default_dir() if cache_dir in (None, True) else cache.Path(cache_dir)
        key = cache.plan_key(pb, policy, {"time_limit": time_limit, "tie_layers": tie_layers,
                                                    "mip_gap": mip_gap, "transfer_tolerance": TRANSFER_TOLERANCE,
                                                    "lp_plan_gap": LP_PLAN_GAP, "score": score,
                                                    "pipeline": repr(model) if sim else None})
        hit = cache.load(directory, key)
        if hit is not None:
            log.info("plan cache hit %s (%s)", key, directory)
            s = hit.solver
            return replace(hit, solver=replace(s, method=f"cache:{s.method}",
                                               notes=s.notes + (f"cached plan {key}",)))
    if policy == "throughput":
        search = pb
        if sim is not None:  # the search charges a cut edge one wait, not the flat per-cut charge
            st = surrogate_topology(topology, model)
            search = replace(pb, hop=st.hop_overhead, expose=st.copy_exposure)
        sol = _best_of_baselines(search, _solve_or_fitting_baseline(search, time_limit, tie_layers, mip_gap), sim)
        pb.adopt_memos(search, _CHARGE_FREE_MEMOS)
        result = _from_solution(pb, sol, policy, "cycle", t0)  # cycle_seconds: the cycle model, comparable
    elif policy == "latency":
        sol = solve_latency(pb, time_limit, tie_layers)
        result = _from_solution(pb, sol, policy, "latency", t0)
    else:
        result = _baseline(pb, policy, objective or "cycle", t0)
    if sim is not None and not result.replicas:
        place = np.array([result.placements[pb.programs[p]][k] for p, k in zip(pb.prog.tolist(), pb.launch.tolist())])
        seconds, schedules = sim.exact(pb, place)
        result = replace(result, simulated_seconds=seconds, schedules=schedules)
        if policy == "throughput" and micro_batches == MICRO_BATCH_CHOICES[0]:
            result = _more_micro_batches(pb, place, result, sim)
    if key is not None:
        cache.store(directory, key, result)
    log.info("plan %s: %s", policy, f"{result.predicted_seconds:.6g} s, gap {100 * result.gap:.2f} %")
    return result


#: Problem memos that do not read the per-cut charges (``Problem.hop`` / ``expose``), which are all the search
#: problem of ``score="simulate"`` changes: the plan's problem takes them from the search's instead of computing
#: them again (``device_coef`` and ``lists`` read the charges).
_CHARGE_FREE_MEMOS = ("holder_entries", "link_coef", "preds", "state_edges", "layer_units", "heaviest")


def _dump_plan(result: Plan, policy: str, dump_dir: str) -> None:
    """Write ``result`` as ``plan_<policy>_<n>.json``: placements, predicted seconds, gap, solver notes."""

    os.makedirs(dump_dir, exist_ok=True)
    n = len([f for f in os.listdir(dump_dir) if f.startswith(f"plan_{policy}_")])
    s = result.solver
    data = {"policy": policy, "predicted_seconds": result.predicted_seconds, "gap": result.gap,
            "solver": {"method": s.method, "notes": list(s.notes)},
            "placements": {name: {str(k): int(v) for k, v in p.items()} for name, p in result.placements.items()}}
    path = os.path.join(dump_dir, f"plan_{policy}_{n}.json")
    with open(path, "w") as f:
        jsonout.dump(data, f, indent=1)
    log.info("wrote plan %s to %s", policy, path)


class _Simulated:
    """Simulated seconds per workload step of placements (``score="simulate"``), cached per placement and
    micro-batch count: the cheap surrogate while comparing candidates (:func:`pipeline_plan.simulated_seconds`),
    ``exact`` for the plan's own (:meth:`exact`, with the schedules it scored); and the lower bound no simulated
    step of a placement is below (:func:`pipeline_plan.step_lower_bound`), which skips candidates that cannot win."""

    def __init__(self, wl, topology, model, micro_batches):
        self.wl, self.topology, self.model, self.M = wl, topology, model, micro_batches
        self.seen: dict[tuple, Any] = {}  # seconds, or (seconds, schedules) for exact()
        self.cache: dict = {}  # DAG indexes and list-scheduler timelines (pipeline_plan.timeline_of)

    def __call__(self, pb, place, exact: bool = False, micro_batches: int | None = None) -> float:
        M = micro_batches or self.M
        key = (np.asarray(place, dtype=np.int64).tobytes(), exact, M)
        if key not in self.seen:
            self.seen[key] = simulated_seconds(pb, self.wl, place, self.topology, self.model, M, exact,
                                               cache=self.cache)
        return self.seen[key]

    def exact(self, pb, place, micro_batches: int | None = None) -> tuple[float, tuple]:
        """``(simulated seconds, the schedules scored)`` of ``place``: :func:`pipeline_plan.simulated_schedules`,
        the value :attr:`Plan.simulated_seconds` and :attr:`Plan.schedules` take."""
        M = micro_batches or self.M
        key = (np.asarray(place, dtype=np.int64).tobytes(), "schedules", M)
        if key not in self.seen:
            self.seen[key] = simulated_schedules(pb, self.wl, place, self.topology, self.model, M, cache=self.cache)
        return self.seen[key]

    def lower_bound(self, pb, place) -> float:
        """Seconds per workload step below every simulated step of ``place`` (any micro-batch count), slightly
        lowered so that rounding never makes it exceed one."""
        return step_lower_bound(pb, self.wl, place, self.topology, self.model, self.cache) * (1 - 1e-12)


#: Micro-batch counts a throughput plan may take with ``score="simulate"`` when planned at the default 2: a larger
#: count only where the simulator predicts a step at least :data:`MICRO_BATCH_GAIN` shorter per workload step (each
#: more micro-batch in flight holds one more set of activations and requests, and fine cuts need large micro-batches
#: to keep GEMM tiles full: the systems of issue 23 run exactly two).
MICRO_BATCH_CHOICES = (2, 3, 4)
MICRO_BATCH_GAIN = 0.02


def _more_micro_batches(pb, place: np.ndarray, result: Plan, sim: _Simulated) -> Plan:
    """``result`` with more micro-batches (:data:`MICRO_BATCH_CHOICES`) where the simulator says it helps."""
    best_m, best_s = result.micro_batches, result.simulated_seconds
    load = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=pb.D).max()
    if len(np.unique(place)) < 2 or best_s <= load * (1 + MICRO_BATCH_GAIN):
        return result  # no stall left for more micro-batches to fill
    cheap = sim(pb, place, micro_batches=best_m)  # the surrogate first
    bound = sim.lower_bound(pb, place)  # no count's surrogate is below it
    for m in MICRO_BATCH_CHOICES[1:]:
        if bound >= cheap * (1 - MICRO_BATCH_GAIN):
            break  # no count left can be MICRO_BATCH_GAIN shorter
        s = sim(pb, place, micro_batches=m)
        if s < cheap * (1 - MICRO_BATCH_GAIN):
            best_m, cheap = m, s
    if best_m == result.micro_batches:
        return result
    best_s, schedules = sim.exact(pb, place, best_m)
    if best_s >= result.simulated_seconds * (1 - MICRO_BATCH_GAIN):
        return result
    note = (f"{best_m} micro-batches: simulated {best_s * 1e3:.4g} ms per step vs {result.simulated_seconds * 1e3:.4g} "
            f"ms with {result.micro_batches}")
    log.info("throughput: %s", note)
    return replace(result, micro_batches=best_m, simulated_seconds=best_s, schedules=schedules,
                   solver=replace(result.solver, notes=result.solver.notes + (note,)))


def _simulate_candidates(pb, stack: np.ndarray, fits: np.ndarray, sim: _Simulated) -> np.ndarray:
    """Simulated seconds of the placements ``stack`` that fit (``inf`` for the others and for those not simulated):
    in order of their lower bound (:meth:`_Simulated.lower_bound`: busiest device's launches and pushed transfers),
    and only while that bound is below the best simulated step so far (a candidate skipped cannot be better)."""
    lower = np.array([sim.lower_bound(pb, place) if fits[i] else np.inf for i, place in enumerate(stack)])
    values = np.full(len(stack), np.inf)
    best = np.inf
    for i in [0] + sorted(range(1, len(stack)), key=lambda i: lower[i]):
        if fits[i] and lower[i] < best * (1 - 1e-9):
            values[i] = sim(pb, stack[i])
            best = min(best, values[i])
    return values


def _best_of_baselines(pb, sol, sim: "_Simulated | None" = None):
    """The solver's placement, or a baseline's single placement (layer, af, pd, homo-*; for a replicated workload
    also request-dist: stream r on device r) when that scores better.

    Every such baseline is a point of the same search space, so the throughput plan must never lose to one; on real
    model DAGs the counts relaxation's realisation can land above them (docs/BENCHMARKS.md, solver constants), and
    this makes them warm starts that bound the result. They are scored by the same model as the solver's plan
    (:func:`evaluate.cycle_many`: with each cut edge's per-hop charge on its devices), or with ``sim`` by the
    simulated step of their pipelined schedules, so a plan the model says is slower than a baseline is never
    returned. Candidates that break a memory budget or a pin are skipped. The
    solver's lower bound is kept.
    """
    from dataclasses import replace as dc_replace

    from torch_tessera.scheduler.evaluate import cycle_many

    names, stack, fits = _baseline_candidates(pb, np.asarray(sol.place, dtype=np.int64))
    fits[0] = True
    values = cycle_many(pb, stack) if sim is None else _simulate_candidates(pb, stack, fits, sim)
    best = 0
    for i in [names.index(nm) for nm in ["layer", "af", "pd", "request-dist"] + [f"homo-{g}" for g in range(pb.D)]
              if nm in names]:
        if fits[i] and values[i] < values[best] * (1 - 1e-9):
            best = i
    if best == 0:
        return sol
    log.info("throughput: the %s placement beats the solver's (%.6g s vs %.6g s%s); using it", names[best],
             values[best], values[0], ", simulated" if sim is not None else "")
    value = float(cycle_many(pb, stack[best:best + 1])[0])
    return dc_replace(sol, place=stack[best], value=value,
                      method=f"{sol.method}+{names[best]}-warm-start",
                      notes=list(sol.notes) + [f"the {names[best]} placement scored better than the solver's"
                                               + (" (simulated)" if sim is not None else "")])


def _baseline_candidates(pb, solver_place: np.ndarray | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The baselines' single placements as candidates of the throughput search: ``(names, [C, n] placements, [C]
    fits)``, ``solver_place`` first (named ``"solver"``) when given, then homo-*, layer, af, pd (those that apply and
    fit) and, for a replicated workload, request-dist (stream r wholly on device r). ``fits``: within every memory
    budget and pin (baselines ignore pins, so one that breaks a pin is not a candidate)."""
    from torch_tessera.scheduler.evaluate import fits_many

    names, places = [], []
    if solver_place is not None:
        names.append("solver")
        places.append(solver_place)
    for g in range(pb.D):
        names.append(f"homo-{g}")
        places.append(np.full(pb.n, g, dtype=np.int64))
    for name in ("layer", "af", "pd"):
        try:
            places.append(getattr(baselines, name)(pb, "cycle"))
            names.append(name)
        except (NotApplicableError, InfeasiblePlanError):
            continue
    if pb.streams and max(pb.streams) > 0:  # replicated workload: request stream r wholly on device r (request-dist)
        names.append("request-dist")
        places.append(np.asarray(pb.streams, dtype=np.int64)[pb.prog] % pb.D)
    stack = np.stack(places)
    fits = fits_many(pb, stack)
    pinned = pb.pinned[pb.group]
    fits &= ((pinned < 0)[None] | (stack == pinned[None])).all(1)
    return names, stack, fits


def _solve_or_fitting_baseline(pb, time_limit: float, tie_layers: bool, mip_gap: float):
    """:func:`solve_throughput`, or, when it finds no placement within ``time_limit`` although a baseline's placement
    fits, the best such placement (by the cycle model), with a warning: the throughput plan's space holds every
    baseline's placement, so a baseline that fits is never refused. Raises the solver's
    :class:`InfeasiblePlanError` when no baseline fits either."""
    from torch_tessera.scheduler.evaluate import cycle_many
    from torch_tessera.scheduler.solve import Solution

    try:
        return solve_throughput(pb, time_limit, tie_layers, mip_gap)
    except InfeasiblePlanError:
        names, stack, fits = _baseline_candidates(pb)
        if not fits.any():
            raise
    ok = np.flatnonzero(fits)
    values = cycle_many(pb, stack[ok])
    i = int(ok[int(np.argmin(values))])
    groups = aggregate(pb, pb.group)
    bound = zero_comm_bound(groups.cost, np.ones(groups.B, np.int64), groups.pinned, groups.forbidden)
    note = (f"the solver found no placement within time_limit={time_limit:.3g} s; the {names[i]} placement fits and "
            "is used (raise time_limit to search further)")
    log.warning("throughput: %s", note)
    value = float(values[int(np.argmin(values))])
    return Solution(stack[i], value, min(bound, value), f"{names[i]}-fallback", "time limit", 0, groups.B, [note])


def _from_solution(pb, sol, policy: str, objective: str, t0: float) -> Plan:
    info = SolverInfo(method=sol.method, status=sol.status, wall_seconds=time.perf_counter() - t0, nodes=sol.nodes,
                      kernels=pb.n, blocks=sol.blocks, notes=tuple(pb.notes + sol.notes))
    return make_plan(pb, sol.place, policy=policy, objective=objective, lower_bound=sol.bound, solver=info)


def _baseline(pb, policy: str, objective: str, t0: float) -> Plan:
    if objective not in ("cycle", "latency"):
        raise ConfigError(f"objective must be 'cycle' or 'latency', got {objective!r}")
    if objective == "cycle":
        groups = aggregate(pb, pb.group)
        bound = zero_comm_bound(groups.cost, np.ones(groups.B, np.int64), groups.pinned, groups.forbidden)
    else:
        bound = latency_bound(pb)
    extra: dict = {}
    g = baselines.homo_index(pb, policy)
    if g is not None:
        place = np.full(pb.n, g, dtype=np.int64)
        baselines.check_fits(pb, place, policy)
    elif policy == "request-dist" and pb.streams and max(pb.streams) > 0:
        # a replicated workload (one request stream per device, :func:`plan_streams`): stream r wholly on device r,
        # one placement that the runtime can execute as it is (each stream's programs on its own device)
        if max(pb.streams) >= pb.D:
            raise ConfigError(f"request-dist over request streams: {max(pb.streams) + 1} streams for {pb.D} devices "
                              "(stream r runs wholly on device r)")
        place = np.asarray(pb.streams, dtype=np.int64)[pb.prog]
        baselines.check_fits(pb, place, policy)
    elif policy == "request-dist":
        place, reps, cyc, lat, mem = baselines.request_dist(pb)
        extra = dict(replicas=reps, cycle=cyc, latency=lat, mem=mem)
    elif policy in ("pd", "af", "layer"):
        place = getattr(baselines, policy)(pb, objective)
    else:
        import difflib

        close = difflib.get_close_matches(policy, POLICIES, n=1)
        raise ConfigError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))
    info = SolverInfo(method="baseline", status="fixed", wall_seconds=time.perf_counter() - t0, kernels=pb.n,
                      blocks=int(pb.group.max()) + 1, notes=("pins not applied to baselines",) if (pb.pinned >= 0).any()
                      else ())
    p = make_plan(pb, place, policy=policy, objective=objective, lower_bound=bound, solver=info, **extra)
    if objective == "cycle" and "cycle" in extra:
        p = replace(p, predicted_seconds=extra["cycle"], lower_bound_seconds=min(bound, extra["cycle"]))
    elif "latency" in extra:
        p = replace(p, predicted_seconds=extra["latency"], lower_bound_seconds=min(bound, extra["latency"]))
    return p


def available_baselines(num_devices: int) -> list[str]:
    """Baseline policy names for ``num_devices`` devices, in the order reports show them."""
    return homo_names(num_devices) + ["request-dist", "pd", "af", "layer"]


def plan_streams(workload: Workload, topology: Topology, shares: Sequence[float] | None = None,
                 policy: str = "throughput", **kwargs: Any) -> Plan:
    """The throughput plan of ``workload`` served as one request stream per device (:meth:`Workload.replicated`).

    A single placement runs every request through the same kernels on the same devices; with one stream per device
    the placement can give each device its own share of the requests AND move single kernels of a stream to the
    device that suits them (decode attention of the fast GPU's stream onto a partition that runs attention as fast,
    say). ``request-dist`` (stream ``r`` wholly on device ``r``) is one point of this space, so the plan never scores
    below it; the plan names its programs ``"<name>"`` (stream 0) and ``"<name>@<r>"``.

    Args:
        workload: a workload of one stream (prefill and decode, or one forward).
        topology: devices and links.
        shares: fraction of the requests per stream (one per device); default: in proportion to each device's
            throughput when it runs the whole workload alone (its ``homo`` baseline's cycle time), as request-dist
            balances them.
        policy: ``"throughput"`` (the planner's placement of the streams) or ``"request-dist"`` (stream ``r``
            wholly on device ``r``: the request-dist baseline as one placement the runtime executes, each stream's
            programs running at the same time as the others').
        kwargs: passed to :func:`plan` (``time_limit``, ``memory_budgets``, ``micro_batches``...).

    Returns:
        The :class:`Plan` over ``workload.replicated(shares)``; its ``frequencies`` give each program's runs per
        workload step (one request's worth of work over all streams).

    Raises:
        InfeasiblePlanError: no placement of the streams fits memory (each stream holds its own state).
        ValueError: ``shares`` not one fraction per device summing to 1.
        ConfigError: ``policy`` neither ``"throughput"`` nor ``"request-dist"``.
    """
    if policy not in ("throughput", "request-dist"):
        raise ConfigError(f"plan_streams: policy must be 'throughput' or 'request-dist', got {policy!r}")
    n = len(topology.devices)
    if shares is None:
        kw = {k: v for k, v in kwargs.items() if k in ("memory_budgets", "micro_batches")}
        cycles = [plan(workload, None, topology, policy=name, cache_dir=False, **kw).cycle_seconds
                  for name in available_baselines(n)[:n]]
        rates = [1.0 / c for c in cycles]
        shares = [r / sum(rates) for r in rates]
    if len(shares) != n:
        raise ValueError(f"shares needs one fraction per device ({n}), got {list(shares)}")
    kwargs.setdefault("cache_dir", False)
    return plan(workload.replicated(shares), None, topology, policy=policy, **kwargs)
