"""The main job behind ``tessera bench``: every baseline and tessera's plans on the same model, in one process.

Two parts:

* **check** (:func:`check_plans`): the tiny model compiled once with the tessera backend on CPU virtual devices; every
  plan's placement (computed by the scheduler from the costs of the simulated pair) is run and compared with eager
  PyTorch, and its cut edges are counted. This proves each plan computes the right thing.
* **simulate** (:func:`simulate_plans`): the full-size model lowered without weights; each plan's predicted throughput
  on the device pair (roofline costs, modelled links), throughput per dollar from the dated price table, and the
  zero-communication bound (the best cycle any placement reaches when transfers are free). Predictions, not
  measurements: the output says so.
"""

from __future__ import annotations

import copy
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


#: name of the single-placement throughput plan when the streams plan scores better and becomes ``tessera``
SINGLE = "tessera-single"


def with_streams(plans: dict[str, Any], wl: Any, topo: Any, score: Any = None,
                 **kwargs: Any) -> tuple[dict[str, Any], str]:
    """``plans`` with ``tessera`` the better (lower modelled seconds per step: ``score(plan)``, default its cycle) of
    the single-placement throughput plan and :func:`~torch_tessera.scheduler.plan_streams` (one request stream per
    device, kernels of a stream movable); when the streams plan wins, the single placement stays as :data:`SINGLE` so
    both are measured. ``kwargs`` go to :func:`~torch_tessera.scheduler.plan_streams` (``micro_batches``: as the
    single plan was made).

    Returns:
        ``(plans, note)``: the note says which plan was kept and both predicted cycle times, for the report.
    """
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import Plan, plan_streams

    single = plans.get("tessera")
    if not isinstance(single, Plan) or len(topo.devices) < 2:
        return plans, "streams plan not made (no single throughput plan or one device)"
    try:
        streams = plan_streams(wl, topo, **kwargs)
    except InfeasiblePlanError as e:  # each stream holds its own state: may not fit where one placement does
        return plans, f"streams plan does not fit: {str(e).splitlines()[0]}"
    score = score or (lambda p: p.cycle_seconds)
    versus = (f"one request stream per device {score(streams) * 1e3:.4g} ms/step vs single placement "
              f"{score(single) * 1e3:.4g} ms/step (predicted)")
    if score(streams) >= score(single) * (1 - 1e-9):
        return plans, f"--streams: {versus}: the single placement stays tessera"
    out = dict(plans)
    out["tessera"] = streams
    out[SINGLE] = single
    return out, f"--streams: {versus}: the streams plan is tessera, the single placement {SINGLE}"


def best_of_space(plans: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``plans`` with ``tessera`` the highest-throughput plan of its space, which contains every baseline's placement
    (homo-*, request-dist's request streams, pd, af, layer): when a baseline's predicted throughput beats the
    planner's, tessera is that baseline's plan (the planner's kept as :data:`SINGLE` when it is not one already), so
    no prediction of tessera is below a baseline.

    Returns:
        ``(plans, note)``; the note is empty when the planner's plan stays.
    """
    from torch_tessera.scheduler import Plan

    mine = plans.get("tessera")
    if not isinstance(mine, Plan):
        return plans, ""
    best = max(((n, p) for n, p in plans.items() if n not in ("tessera", SINGLE) and isinstance(p, Plan)),
               key=lambda np_: np_[1].throughput_per_s, default=None)
    if best is None or best[1].throughput_per_s <= mine.throughput_per_s * (1 + 1e-9):
        return plans, ""
    out = dict(plans)
    out["tessera"] = best[1]
    out.setdefault(SINGLE, mine)
    return out, (f"tessera is {best[0]}'s placement: it is in tessera's space and predicted faster "
                 f"({best[1].throughput_per_s:.4g} vs {mine.throughput_per_s:.4g} steps/s)")


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


def check_plans(model: str, devices: Sequence[str], plan_specs: Sequence[DeviceSpec],
                progress: Any = None) -> list[CheckRow]:
    """Run every checkable plan of the tiny ``model`` on CPU virtual ``devices``; compare each with eager.

    Raises:
        ConfigError: ``devices`` and ``plan_specs`` differ in number (a plan for 4 devices runs on 4 CPU devices).
    """
    from torch_tessera.errors import ConfigError

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
        runner = holder[0].tessera_executors[0]
        for name in checkable(len(devices)):
            placement, _ = place(runner.program, runner.dag, plan_specs, name)
            runner.set_placement(placement)
            got = compiled(*inputs)
            err = float((got.float() - want.float()).abs().max())
            try:
                torch.testing.assert_close(got, want)
                ok = True
            except AssertionError:
                ok = False
            counts = tuple(sum(1 for d in placement.values() if d == i) for i in range(len(devices)))
            rows.append(CheckRow(name if name != "throughput" else "tessera", counts,
                                 cut_edge_count(runner.dag, placement), runner.executor.cut_edges_transferred, err, ok))
            if progress is not None:
                progress.update(1)
    return rows


@dataclass(frozen=True)
class SimRow:
    """One plan's predicted performance on the simulated pair."""

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


def _price(spec: DeviceSpec) -> float:
    return float(spec.price_per_hour)


def simulate_plans(model: str, specs: Sequence[DeviceSpec], output_tokens: float = 129.0,
                   progress: Any = None, size: str = "full", streams: bool = False) -> tuple[list[SimRow], dict]:
    """Predicted throughput of every plan of ``model`` (``size``, default full) on ``specs`` (see module docstring);
    with ``streams``, ``tessera`` as :func:`with_streams` picks it.

    ``output_per_s_per_price`` is throughput per unit of the price table (output/s per relative $/h).
    """
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, Plan, plan, plan_streams

    mw = model_workload(model, specs, size=size, mean_output_tokens=output_tokens)
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
    streams_note = ""
    if streams:
        plans, streams_note = with_streams(plans, mw.workload, mw.topology)
    plans, space_note = best_of_space(plans)
    streams_note = "; ".join(n for n in (streams_note, space_note) if n)
    rows = []
    best_baseline = max((p.throughput_per_s for n, p in plans.items() if n not in ("tessera", SINGLE)
                         and isinstance(p, Plan)), default=float("nan"))
    for name, p in plans.items():
        if not isinstance(p, Plan):
            rows.append(SimRow(name, False, str(p).split("\n")[0][:120], math.nan, math.nan, math.nan, math.nan,
                               math.nan, math.nan, ()))
            continue
        used = [g for g in range(len(specs)) if p.kernels_on(g) or g in p.replicas]
        price = sum(_price(specs[g]) for g in used)
        out_s = mw.output_per_step * p.throughput_per_s
        rows.append(SimRow(name, True, "", p.cycle_seconds, out_s, price, out_s / price if price else math.nan,
                           bound_cycle / p.cycle_seconds if p.cycle_seconds else math.nan,
                           p.throughput_per_s / best_baseline if best_baseline == best_baseline else math.nan,
                           tuple(round(m / 1e9, 2) for m in p.memory_bytes)))
    meta = {"model": model, "size": size, "devices": [s.name for s in specs], "unit": mw.unit, "output_tokens": output_tokens,
            "zero_communication_bound_cycle_s": bound_cycle,
            "zero_communication_bound_output_per_s": mw.output_per_step / bound_cycle if bound_cycle else math.nan,
            "lower_and_cost_seconds": mw.seconds, "streams": streams_note,
            "prices": {s.name: (s.price_per_hour, s.price_source) for s in specs}}
    return rows, meta


def rows_as_dicts(rows: Sequence[Any]) -> list[dict]:
    return [asdict(r) for r in rows]
