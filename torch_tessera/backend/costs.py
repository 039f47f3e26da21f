"""Where the backend's plan takes its kernel costs from, as one call: :func:`choose_costs` (option ``costs``).

Measured costs time each distinct launch of the program on each device at compile time
(:func:`torch_tessera.runtime.profiling.profile_launches`), reading and writing the profile cache under
``$TESSERA_CACHE_DIR/profiles``; the cost model estimates them from the devices' specs. Either way the scheduler
caches the plan under ``$TESSERA_CACHE_DIR/plans``, keyed by the problem (the program's launches, edges and bytes,
the cost table's values), the devices, links and budgets, the policy and its options; :func:`plan_source` says
whether a plan was solved now or read back.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from torch_tessera.errors import TesseraFallbackWarning, warn_user
from torch_tessera.lowering.program import KernelProgram
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.target.devices import Device, DeviceSpec

log = logging.getLogger(__name__)

#: (warmup, repeats) per distinct launch: GPUs are timed with CUDA events; CPU devices run Triton's interpreter,
#: whose times only need to rank (tests and CPU planning).
GPU_REPEATS = (3, 20)
CPU_REPEATS = (1, 2)


@dataclass(frozen=True)
class CostChoice:
    """The costs a plan is made from, and where they came from.

    Attributes:
        costs: seconds per launch per device.
        topology: the links between the devices (modelled).
        kind: ``"measured"`` or ``"model"``.
        summary: one line naming the source, e.g. ``"measured on cuda:0@104sm, cuda:0@24sm: 143 launches (31
            distinct) per device, 0 timed now, 62 from the profile cache; links modelled"`` or ``"model: roofline
            model ..."`` (the counts are of distinct launches summed over the devices).
        launches_timed: (distinct launch, device) pairs timed now (0 for the model).
        from_cache: (distinct launch, device) pairs read from the profile cache.
    """

    costs: CostTable
    topology: Topology
    kind: str
    summary: str
    launches_timed: int = 0
    from_cache: int = 0


def resolve_costs(costs: str, devices_named: bool, specs: Sequence[DeviceSpec]) -> str:
    """``"measured"`` or ``"model"`` for option ``costs`` (``"auto"``: measured when option ``devices`` was given and
    every device is a real GPU or partition)."""
    if costs == "auto":
        return "measured" if devices_named and all(s.is_gpu for s in specs) else "model"
    return costs


def choose_costs(program: KernelProgram, devices: Sequence[Device], kind: str,
                 kernel_objects: Mapping[str, Any] | None = None) -> CostChoice:
    """Kernel costs and links for planning ``program`` on ``devices``.

    Args:
        program: the lowered program.
        devices: the open devices, in the order of option ``devices`` (the first holds the model).
        kind: ``"measured"`` (time every distinct launch on every device, through the profile cache) or ``"model"``.
        kernel_objects: the live kernel objects of the model's device (reused on devices that share it).

    Returns:
        A :class:`CostChoice`; its ``costs.source`` is its ``summary``. When a launch fails to run on a device
        (out of memory, say), the cost model's, after a :class:`~torch_tessera.errors.TesseraFallbackWarning`
        naming the error.
    """
    from torch_tessera.backend.pipeline import estimate
    from torch_tessera.errors import TesseraError

    specs = [d.spec for d in devices]
    why = ""
    if kind == "measured":
        try:
            return _measured(program, devices, kernel_objects)
        except (RuntimeError, TesseraError) as e:  # running the launches failed: plan from the model, say so
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            message = (f"tessera could not measure kernel costs on {', '.join(d.name for d in devices)} ({why}); it "
                       "plans with the cost model instead. Pass options={'costs': 'model'} to skip measuring.")
            log.warning("%s", message)
            warn_user(message, TesseraFallbackWarning)
    costs, topology = estimate(program, specs)
    summary = f"model{f' (measuring failed: {why})' if why else ''}: {costs.source}"
    if all(d.torch_device.type == "cpu" for d in devices):
        summary += "; on CPU virtual devices the model is never calibrated (option costs='measured' times them)"
    return CostChoice(dataclasses.replace(costs, source=summary), topology, "model", summary)


def _measured(program: KernelProgram, devices: Sequence[Device], kernel_objects: Mapping[str, Any] | None) -> CostChoice:
    from torch_tessera.runtime.executor import KernelLauncher
    from torch_tessera.runtime.profiling import profile_launches
    from torch_tessera.target.links import build_topology
    from torch_tessera.target.profiler import ProfileCache, launch_key, to_cost_table, uncached_launches

    cache = ProfileCache()
    home = devices[0].torch_device
    columns = []
    for device in devices:
        warmup, repeats = GPU_REPEATS if device.spec.is_gpu else CPU_REPEATS
        todo = len(uncached_launches(program, device.spec, cache))
        distinct = len({launch_key(program, launch, device.spec) for launch in program.launches})
        log.info("costs: %s: %d of %d distinct launches to time, %d from the profile cache %s", device.name, todo,
                 distinct, distinct - todo, cache.root)
        launcher = KernelLauncher(program, kernel_objects if device.torch_device == home else None,
                                  device.torch_device)
        columns.append(profile_launches(program, device, launcher, cache=cache, warmup=warmup, repeats=repeats,
                                        progress=_terminal(), name="program"))
    timed = sum(c.measured for c in columns)
    hits = sum(c.cache_hits for c in columns)
    names = ", ".join(d.name for d in devices)
    distinct = columns[0].measured + columns[0].cache_hits
    summary = (f"measured on {names}: {len(program.launches)} launches ({distinct} distinct) per device, "
               f"{timed} timed now, {hits} from the profile cache{_shared_times(devices)}; links modelled")
    log.info("costs: %s", summary)
    costs = dataclasses.replace(to_cost_table(columns), source=summary)
    return CostChoice(costs, build_topology([d.spec for d in devices]), "measured", summary, timed, hits)


def _shared_times(devices: Sequence[Device]) -> str:
    """``" (cpu:1 shares cpu:0's times)"`` for devices whose profile identity an earlier one has (their launches
    read the earlier device's times from the cache: one time serves both), else ``""``."""
    first: dict[Any, str] = {}
    shared = []
    for d in devices:
        owner = first.setdefault(d.spec.cache_identity, d.name)
        if owner != d.name:
            shared.append(f"{d.name} shares {owner}'s times")
    return f" ({', '.join(shared)})" if shared else ""


def _terminal() -> bool:
    """Whether a person watches stderr (a tqdm bar is shown then)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def plan_source(plan: Any) -> str:
    """How ``plan`` (a :class:`torch_tessera.scheduler.Plan`) was found: read from the plan cache or made now."""
    solver = plan.solver
    if solver.method.startswith("cache:"):
        return f"reused from the plan cache ({solver.method[len('cache:'):]}, no solve)"
    return f"solved now by {solver.method} ({solver.status}, {solver.wall_seconds:.2f} s)"


def with_costs_note(plan: Any, summary: str) -> Any:
    """``plan`` whose summary table names the costs it was made from (a note on its solver line)."""
    note = f"costs: {summary}"
    return dataclasses.replace(plan, solver=dataclasses.replace(plan.solver, notes=plan.solver.notes + (note,)))
