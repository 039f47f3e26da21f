"""The stages after lowering, as plain calls: analyse PTX -> DAG, cost, topology, plan.

The backend and the command line (``tessera plan``, ``tessera bench``) both run these, in this order.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from torch_tessera.graph import DependencyGraph, build_dependency_graph
from torch_tessera.lowering.program import KernelProgram
from torch_tessera.ptx import analyze_program
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.target.devices import DeviceSpec

log = logging.getLogger(__name__)

from torch_tessera.options import BACKEND_POLICIES  # noqa: E402,F401  (re-exported; the home is options)


def analyze(program: KernelProgram) -> DependencyGraph:
    """PTX access summaries of every Triton kernel, then the dependency DAG."""
    return build_dependency_graph(program, analyze_program(program))


def estimate(program: KernelProgram, specs: Sequence[DeviceSpec],
             hosts: Sequence[str] | None = None) -> tuple[CostTable, Topology]:
    """Kernel times on each device (roofline cost model) and the links between the devices (modelled; pairs on
    different ``hosts``, one name per device, are linked by the network)."""
    from torch_tessera.target.costmodel import estimate_costs
    from torch_tessera.target.links import build_topology

    return estimate_costs(program, list(specs)), build_topology(list(specs), hosts=hosts)


def place(
    program: KernelProgram,
    dag: DependencyGraph,
    specs: Sequence[DeviceSpec],
    policy: str,
    costs: CostTable | None = None,
    topology: Topology | None = None,
    **plan_options: Any,
) -> tuple[Mapping[int, int], Any]:
    """Placement of every launch on ``specs`` by ``policy``; returns ``(placement, plan)`` (plan None for ours).

    ``home`` puts everything on device 0; ``random`` is a seeded random placement (``seed`` in ``plan_options``);
    the others are solved or built by :func:`torch_tessera.scheduler.plan`.
    """
    from torch_tessera.runtime.runner import random_placement

    if policy == "home":
        return {launch.index: 0 for launch in program.launches}, None
    if policy == "random":
        return random_placement(dag, len(specs), int(plan_options.get("seed", 0))), None
    from torch_tessera.scheduler import plan

    if costs is None or topology is None:
        costs, topology = estimate(program, specs)
    options = {k: v for k, v in plan_options.items() if k != "seed"}
    result = plan(dag, costs, topology, policy=policy, **options)
    placement = next(iter(result.placements.values()))
    log.info("placed %d launches by %s:\n%s", len(placement), policy, result.summary())
    return placement, result
