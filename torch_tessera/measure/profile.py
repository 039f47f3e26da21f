"""Profile every launch of each compiled program on each device: the MEASURED cost tables, and the scheduler's
workload and topology built from them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import logging

from torch_tessera.measure.programs import Compiled
from torch_tessera.measure.settings import MeasureSettings
from torch_tessera.runtime.profiling import (  # noqa: F401  (re-exported; the home is runtime.profiling)
    SMALL_STATE_BYTES, DeviceLaunches, graph_total,
)

log = logging.getLogger(__name__)


def prepare_launches(prog: Compiled, g: int) -> DeviceLaunches:
    """``prog``'s launches ready to run one by one on device ``g`` of its runner, in a private pool with copies of
    the program's inputs (the caller's KV cache is not touched), after one run of the whole program in order (see
    :func:`torch_tessera.runtime.profiling.prepare_launches`)."""
    from torch_tessera.runtime.profiling import prepare_launches as prepare

    runner = prog.runner
    prog.reset()
    return prepare(runner.program, runner.devices[g], runner.executor.launchers[g], prog.args)


def profile_on_device(prog: Compiled, g: int, s: MeasureSettings) -> Any:
    """Time every launch of ``prog`` on device ``g`` of its runner: one column of the measured cost table.

    The launches run in a private pool on that device with copies of the program's inputs, each distinct launch
    timed one by one; on a GPU the column is calibrated to the whole program replayed as one CUDA graph (see
    :func:`torch_tessera.runtime.profiling.profile_launches`).

    Returns:
        a :class:`~torch_tessera.target.profiler.ProfileColumn` (seconds per launch, program order).
    """
    from torch_tessera.runtime.profiling import profile_launches
    from torch_tessera.target.profiler import ProfileCache

    runner = prog.runner
    prog.reset()
    return profile_launches(runner.program, runner.devices[g], runner.executor.launchers[g], inputs=prog.args,
                            cache=ProfileCache(s.profile_cache), warmup=s.profile_warmup,
                            repeats=s.profile_repeats, name=prog.name)


def measured_workload(progs: Sequence[Compiled], s: MeasureSettings, progress: Any = None,
                      frequencies: Mapping[str, float] | None = None) -> tuple[Any, Any, dict]:
    """Profile every program on every device and build the scheduler's workload and topology from the measurements.

    Args:
        progs: the compiled programs, in the order a workload step runs them.
        s: the settings (profile repeats, links; the composition when ``frequencies`` is not given).
        progress: a tqdm-like bar, advanced once per (program, device).
        frequencies: program name -> runs per workload step (default: ``s.composition.frequencies``).

    Returns:
        ``(workload, topology, cost_tables)`` where ``cost_tables`` maps program name -> measured ``CostTable``.
    """
    from torch_tessera.target.links import build_topology, measure_links
    from torch_tessera.target.profiler import to_cost_table
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.types import WorkloadProgram

    tables = {}
    for prog in progs:
        cols = []
        for g in range(len(prog.runner.devices)):
            cols.append(profile_on_device(prog, g, s))
            if progress is not None:
                progress.set_description(f"profiled {prog.name} on {prog.runner.devices[g].name}")
                progress.update(1)
        tables[prog.name] = to_cost_table(cols)
    devices = progs[0].runner.devices
    measured = measure_links(devices, progress=False) if s.links == "measured" else ()
    topo = build_topology([d.spec for d in devices], measured)
    freq = s.composition.frequencies if frequencies is None else frequencies
    wl = Workload(tuple(WorkloadProgram(p.name, p.runner.dag, tables[p.name], float(freq[p.name]),
                                        p.name if p.name in ("prefill", "decode") else "") for p in progs))
    return wl, topo, tables
