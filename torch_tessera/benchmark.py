"""The main job behind ``tessera bench``: every baseline and tessera's plans on the same model, in one process.

Two parts:

* **check** (:func:`check_plans`): the tiny model compiled once with the tessera backend on CPU virtual devices; every
  plan's placement (computed by the scheduler from the costs of the simulated pair) is run and compared with eager
  PyTorch, and its cut edges are counted. This proves each plan computes the right thing.
* **simulate** (:func:`simulate_plans`): the full-size model lowered without weights; each plan's predicted throughput
  on the device pair (roofline costs, modelled links), throughput per dollar from the dated price table, and the
  zero-communication bound (the best cycle any placement reaches when transfers are free). Predictions, not
  measurements: the output says so.

Every bench, predicted or measured, chooses ``tessera`` by one rule (:func:`choose_tessera`): the best-scoring plan of
a space holding the planner's single placement, one request stream per device and every baseline's placement.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import torch

from torch_tessera.target.costs import Topology
from torch_tessera.target.devices import DeviceSpec

log = logging.getLogger(__name__)

from torch_tessera.options import BENCH_PLANS as PLAN_NAMES  # noqa: E402  (the home is options)


#: name of the planner's own single placement when another plan of tessera's space scores better and becomes
#: ``tessera``
SINGLE = "tessera-single"
#: candidate name of :func:`~torch_tessera.scheduler.plan_streams` (one request stream per device) in tessera's space
STREAMS = "streams"


@dataclass(frozen=True)
class SpaceChoice:
    """Which plan of tessera's space became ``tessera`` (:func:`choose_tessera`), and why.

    Attributes:
        plans: the plans given, ``tessera`` replaced by the chosen plan and, when that is not the planner's own single
            placement, the planner's placement kept as :data:`SINGLE`; baselines unchanged.
        chosen: ``"tessera"`` (the planner's single placement), :data:`STREAMS` (one request stream per device) or
            the name of the baseline whose placement tessera took.
        scores: every candidate considered -> its score, seconds per workload step (lower is better).
        note: one line for the report naming the chosen plan, the score and every candidate's value.
    """

    plans: dict
    chosen: str
    scores: dict
    note: str


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.4g}"


def _label(name: str) -> str:
    return {"tessera": "the planner's single placement", STREAMS: "one request stream per device"}.get(
        name, f"{name}'s placement")


def choose_tessera(plans: dict[str, Any], workload: Any = None, topology: Any = None, streams: bool = True,
                   score: Any = None, scored: str = "predicted cycle", takeover: Any = None,
                   **stream_options: Any) -> SpaceChoice:
    """``tessera`` = the best-scoring plan of a space that contains every baseline's placement.

    The candidates: the planner's single placement (``plans["tessera"]``); with ``streams`` (and a ``workload`` on
    two or more devices) one request stream per device (:func:`~torch_tessera.scheduler.plan_streams`, each stream
    its own state, kernels of a stream movable: its space holds request-dist); and each baseline plan of ``plans``
    that ``takeover(name, plan)`` accepts (default: every one: homo-*, request-dist, pd, af, layer). Ties go to the
    planner's placement, then to the streams plan. So no baseline the space holds scores better than tessera.

    Args:
        plans: plan name -> :class:`~torch_tessera.scheduler.Plan`, or the error that stopped it (not a candidate).
        workload / topology: what the plans were made for (the streams plan is planned on them).
        streams: whether one request stream per device is a candidate.
        score: ``score(plan)`` -> seconds per workload step; default the plan's predicted cycle.
        scored: what ``score`` is, for the note.
        takeover: ``takeover(name, plan)`` -> whether tessera may take that baseline's placement.
        stream_options: passed to :func:`~torch_tessera.scheduler.plan_streams` (``micro_batches``...).

    Returns:
        The :class:`SpaceChoice`; ``plans`` unchanged (chosen ``"tessera"``, empty note) when ``plans["tessera"]`` is
        not a plan.
    """
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import Plan, plan_streams

    mine = plans.get("tessera")
    if not isinstance(mine, Plan):
        return SpaceChoice(dict(plans), "tessera", {}, "")
    score = score or (lambda p: p.cycle_seconds)
    cands = {"tessera": mine}
    missing = ""
    if not streams:
        missing = f"; {_label(STREAMS)}: not a candidate"
    elif workload is not None and topology is not None and len(topology.devices) > 1:
        try:
            cands[STREAMS] = plan_streams(workload, topology, **stream_options)
        except InfeasiblePlanError as e:  # each stream holds its own state: may not fit where one placement does
            missing = f"; {_label(STREAMS)} does not fit: " + (", and ".join(shortfall_lines(e, ()))
                                                                 or " ".join(str(e).split(". Fix")[0].split()))
    cands.update((n, p) for n, p in plans.items() if n not in ("tessera", SINGLE) and isinstance(p, Plan)
                 and (takeover is None or takeover(n, p)))
    scores = {n: float(score(p)) for n, p in cands.items()}
    rank = {n: i for i, n in enumerate(cands)}  # the planner's first, then the streams plan, then the baselines
    best = min(scores, key=lambda n: (scores[n] * (1 - 1e-9 * (n in ("tessera", STREAMS))), rank[n]))
    others = ", ".join(f"{_label(n)} {_ms(scores[n])}" for n in scores if n != best)
    others = f"{others} ms/step" if others else "no other candidate"
    note = (f"tessera = {_label(best)}: the best {scored} of tessera's space, {_ms(scores[best])} ms/step "
            f"({others}{missing})")
    if best == "tessera":
        return SpaceChoice(dict(plans), best, scores, note)
    note += f"; the planner's single placement is {SINGLE}"
    taken = cands[best]
    if best != STREAMS:  # the baseline's placement as tessera's plan; the baseline's own row stays as it was
        taken = dataclasses.replace(taken, policy="throughput",
                                    solver=dataclasses.replace(taken.solver, notes=tuple(taken.solver.notes) + (note,)))
    return SpaceChoice({**plans, "tessera": taken, SINGLE: mine}, best, scores, note)


def checkable(num_devices: int) -> tuple[str, ...]:
    """Placements :func:`check_plans` runs on ``num_devices`` CPU devices (:data:`CHECKABLE` on a pair)."""
    from torch_tessera.scheduler import available_baselines

    homos = [b for b in available_baselines(num_devices) if b.startswith("homo-")]
    return tuple(homos) + CHECKABLE[2:]


def plan_names(num_devices: int) -> tuple[str, ...]:
    """Plans the bench compares on ``num_devices`` devices: :data:`PLAN_NAMES` on a pair; with more devices one
    ``homo-<i>`` per device (``homo-L``/``homo-R`` name a pair's two) and the same others."""
    from torch_tessera.scheduler import available_baselines

    return tuple(available_baselines(num_devices)) + ("tessera",)
#: Per-program placements that can be run on the tiny model (request-dist and pd are homo-L/homo-R per program).
CHECKABLE = ("homo-L", "homo-R", "af", "layer", "throughput", "latency")


@dataclass(frozen=True)
class CheckRow:
    """One plan run on CPU virtual devices against eager."""

    plan: str
    launches_per_device: tuple[int, ...]
    cut_edges: int
    transfers: int
    max_abs_error: float
    equal: bool
    #: (graphs the plan was placed on, graphs compiled): a model Dynamo splits into several graphs (the VLM) runs
    #: each plan on every graph it applies to, the others on the first device (0 graphs: the plan applies to none).
    graphs: tuple[int, int] = (1, 1)


def check_plans(model: str, devices: Sequence[str], plan_specs: Sequence[DeviceSpec],
                progress: Any = None) -> list[CheckRow]:
    """Run every checkable plan of the tiny ``model`` on CPU virtual ``devices``; compare each with eager.

    Raises:
        ConfigError: ``devices`` and ``plan_specs`` differ in number (a plan for 4 devices runs on 4 CPU devices).
    """
    from torch_tessera.errors import ConfigError, NotApplicableError

    if len(devices) != len(plan_specs):
        raise ConfigError(f"{len(plan_specs)} planned devices but {len(devices)} CPU check devices {list(devices)}; "
                          f"pass --check-devices with {len(plan_specs)} devices (cpu:0,...)")
    from torch_tessera.backend import tessera_backend
    from torch_tessera.backend.pipeline import place
    from torch_tessera.models import build_model
    from torch_tessera.runtime.schedule import cut_edge_count

    module, inputs = build_model(model, "tiny")
    eager = copy.deepcopy(module)
    holder: list = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        fn = tessera_backend(gm, example_inputs, options={"devices": tuple(devices), "policy": "home",
                                                           "fallback": "raise"})
        holder.append(fn)
        return fn

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, dynamic=False)
    rows = []
    with torch.no_grad():
        want = eager(*inputs)
        compiled(*inputs)
        runners = [runner for fn in holder for runner in fn.tessera_executors if runner.program.launches]
        for name in checkable(len(devices)):
            counts, cuts, placed = [0] * len(devices), 0, 0
            for runner in runners:
                try:
                    placement, _ = place(runner.program, runner.dag, plan_specs, name)
                    placed += 1
                except NotApplicableError:  # e.g. af on a graph without attention: that graph stays on device 0
                    placement, _ = place(runner.program, runner.dag, plan_specs, checkable(len(devices))[0])
                runner.set_placement(placement)
                cuts += cut_edge_count(runner.dag, placement)
                for d in placement.values():
                    counts[d] += 1
            got = compiled(*inputs)
            err = float((got.float() - want.float()).abs().max())
            try:
                torch.testing.assert_close(got, want)
                ok = True
            except AssertionError:
                ok = False
            transfers = sum(runner.executor.cut_edges_transferred for runner in runners)
            rows.append(CheckRow(name if name != "throughput" else "tessera", tuple(counts), cuts, transfers, err,
                                 ok, (placed, len(runners))))
            if progress is not None:
                progress.update(1)
    return rows


@dataclass(frozen=True)
class SimRow:
    """One plan's predicted performance on the simulated pair.

    ``memory_gb`` is per device (GB, 1e9 bytes): ``weights_gb`` (PARAMETER buffers read there) + ``state_gb`` (STATE
    held there: KV caches, owner and replicas) + ``activation_gb`` (inputs and the activation peak of the kernels
    placed there); empty tuples where the plan does not apply.
    """

    plan: str
    applies: bool
    reason: str
    cycle_s: float
    output_per_s: float
    price_per_hour: float
    output_per_s_per_price: float
    vs_bound: float
    speedup_vs_best_baseline: float
    memory_gb: tuple[float, ...]
    weights_gb: tuple[float, ...] = ()
    state_gb: tuple[float, ...] = ()
    activation_gb: tuple[float, ...] = ()


def _price(spec: DeviceSpec) -> float:
    return float(spec.price_per_hour)


def gpu_names(specs: Sequence[DeviceSpec]) -> dict[str, str]:
    """Device name -> how the CLI names it to a person: ``"GPU 1 (NVIDIA L4)"``, in ``specs`` order."""
    return {s.name: f"GPU {i + 1} ({s.model})" for i, s in enumerate(specs)}


def shortfall_lines(error: Exception, specs: Sequence[DeviceSpec], min_share: float = 1e-3) -> list[str]:
    """Each device an :class:`~torch_tessera.errors.InfeasiblePlanError` names as short of memory, as
    ``"GPU 2 (NVIDIA L4) needs 83.38 GB and has 24.00 GB (short by 59.38 GB)"`` ("needs at least" when the error
    knows only a lower bound); devices short by at most ``min_share`` of what they have are left out."""
    from torch_tessera.target.devices import format_bytes

    gpu = gpu_names(specs)
    least = " at least" if getattr(error, "lower_bound", False) else ""
    return [f"{gpu.get(d, d)} needs{least} {format_bytes(need)} and has {format_bytes(have)} (short by "
            f"{format_bytes(need - have)})" for d, need, have in getattr(error, "shortfalls", ())
            if need - have > min_share * have]


def error_reason(error: Exception, specs: Sequence[DeviceSpec]) -> str:
    """Why a plan has no number, whole and in the CLI's terms: for a plan that does not fit memory, each short GPU
    with the GB it needs and has, and the fix; else the error's own message on one line."""
    lines = shortfall_lines(error, specs)
    if not lines:
        return " ".join(str(error).split())
    return ("does not fit: " + ", and ".join(lines) + ". Fix: GPUs with more memory, or a plan that spreads the "
            "weights over both GPUs (layer, tessera)")


def simulate_plans(model: str, specs: Sequence[DeviceSpec], output_tokens: float = 129.0,
                   progress: Any = None, size: str = "full", streams: bool = True,
                   prefill_tokens: int = 1024) -> tuple[list[SimRow], dict]:
    """Predicted throughput of every plan of ``model`` (``size``, default full; a prompt of ``prefill_tokens``) on
    ``specs`` (see module docstring);
    ``tessera`` the best predicted plan of a space holding every baseline's placement and, with ``streams``, one
    request stream per device (:func:`choose_tessera`), so no baseline's prediction is above tessera's.

    ``output_per_s_per_price`` is throughput per unit of the price table (output/s per relative $/h). ``meta`` says
    which candidate became tessera and why (``tessera_choice``, ``tessera_from``) and each candidate's predicted
    cycle (``tessera_space``, seconds per workload step).
    """
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, Plan, plan, plan_streams

    mw = model_workload(model, specs, size=size, mean_output_tokens=output_tokens, prefill_tokens=prefill_tokens)
    if progress is not None:
        progress.update(1)
    free = Topology(mw.topology.devices, np.full_like(mw.topology.bandwidth, 1e30),
                    np.zeros_like(mw.topology.latency), mw.topology.memory, "free transfers")
    bound_plan = plan(mw.workload, None, free, policy="throughput", cache_dir=False, memory_budgets=[None] * len(specs))
    bound_cycle = bound_plan.cycle_seconds
    if len(specs) > 1:  # the bound covers request-dist and the streams plans (one request stream per device)
        bound_cycle = min(bound_cycle,
                          plan_streams(mw.workload, free, memory_budgets=[None] * len(specs)).cycle_seconds)
    plans: dict[str, Any] = {}
    for name in plan_names(len(specs)):
        policy = "throughput" if name == "tessera" else name
        try:
            plans[name] = plan(mw.workload, None, mw.topology, policy=policy, cache_dir=False)
        except (NotApplicableError, InfeasiblePlanError) as e:
            plans[name] = e
        if progress is not None:
            progress.update(1)
    choice = choose_tessera(plans, mw.workload, mw.topology, streams=streams)
    plans = choice.plans
    rows = []
    best_baseline = max((p.throughput_per_s for n, p in plans.items() if n not in ("tessera", SINGLE)
                         and isinstance(p, Plan)), default=float("nan"))
    for name, p in plans.items():
        if not isinstance(p, Plan):
            rows.append(SimRow(name, False, error_reason(p, specs), math.nan, math.nan, math.nan, math.nan,
                               math.nan, math.nan, ()))
            continue
        used = [g for g in range(len(specs)) if p.kernels_on(g) or g in p.replicas]
        price = sum(_price(specs[g]) for g in used)
        out_s = mw.output_per_step * p.throughput_per_s
        rows.append(SimRow(name, True, "", p.cycle_seconds, out_s, price, out_s / price if price else math.nan,
                           bound_cycle / p.cycle_seconds if p.cycle_seconds else math.nan,
                           p.throughput_per_s / best_baseline if best_baseline == best_baseline else math.nan,
                           *(tuple(round(m / 1e9, 2) for m in part) for part in (
                               p.memory_bytes, p.weight_bytes, p.state_bytes, p.activation_bytes))))
    meta = {"model": model, "size": size, "devices": [s.name for s in specs], "unit": mw.unit, "output_tokens": output_tokens,
            "zero_communication_bound_cycle_s": bound_cycle,
            "zero_communication_bound_output_per_s": mw.output_per_step / bound_cycle if bound_cycle else math.nan,
            "lower_and_cost_seconds": mw.seconds, "tessera_choice": choice.note, "tessera_from": choice.chosen,
            "tessera_space": choice.scores,
            "prices": {s.name: (s.price_per_hour, s.price_source) for s in specs}}
    return rows, meta


def rows_as_dicts(rows: Sequence[Any]) -> list[dict]:
    return [asdict(r) for r in rows]
