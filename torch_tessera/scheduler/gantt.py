"""A plan's pipelined timeline and its Gantt chart (PNG; matplotlib with the Agg backend, no display needed).

With a simulated plan (``Plan.simulated_seconds``, the default ``score="simulate"``) the chart draws the plan's
explicit pipelined schedule as the simulator runs it (:func:`schedule_intervals`): one row per device stream with
its launches, transfers and waits, coloured by micro-batch. Otherwise (``score="cycle"``) it draws the older
approximate timeline below.

The approximate timeline runs one step of one program split into ``micro_batches`` equal micro-batches (each kernel
takes ``seconds / micro_batches``, each cut edge moves ``bytes / micro_batches`` plus the per-hop latency), list-scheduled
micro-batch by micro-batch: a task starts in the earliest idle gap of its lane (a device, or a directed link) after
its inputs are ready and after the previous task of its micro-batch on that device, so micro-batch 1 fills the gaps
micro-batch 0 leaves, as separate CUDA streams per micro-batch do.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from torch_tessera.graph.types import DependencyGraph
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.types import Plan, Workload

if TYPE_CHECKING:
    from torch_tessera.scheduler.pipeline_plan import PipelineModel, ProgramSim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Interval:
    """One task on one lane (seconds from the step's start)."""

    lane: str
    start: float
    end: float
    label: str
    micro_batch: int
    program: str = ""  # the workload program this step belongs to


class _Lane:
    """Idle gaps of one lane, sorted by start; the last gap is open-ended."""

    def __init__(self) -> None:
        self.starts = [0.0]
        self.ends = [float("inf")]

    def place(self, ready: float, dur: float) -> float:
        i = max(0, bisect.bisect_right(self.starts, ready) - 1)
        while True:
            s = max(self.starts[i], ready)
            if self.ends[i] - s >= dur - 1e-15:
                break
            i += 1
        gs, ge = self.starts[i], self.ends[i]
        new = [(a, b) for a, b in ((gs, s), (s + dur, ge)) if b - a > 1e-15]
        self.starts[i:i + 1] = [a for a, _ in new]
        self.ends[i:i + 1] = [b for _, b in new]
        return s


def timeline(plan: Plan, dag_or_workload: DependencyGraph | Workload,
             costs: CostTable | Mapping[str, CostTable] | None, topology: Topology, *, program: str | None = None,
             micro_batches: int | None = None) -> list[Interval]:
    """Intervals of one step of ``program`` (default: the plan's program with the most time per workload step)."""
    wl = as_workload(dag_or_workload, costs)
    m = int(micro_batches or plan.micro_batches or 1)
    pb = compile_problem(wl, topology, micro_batches=m)
    place = np.array([plan.placements[pb.programs[pb.prog[k]]][int(pb.launch[k])] for k in range(pb.n)])
    if program is None:
        per = [(pb.freq[p] * pb.cost[pb.program_slice(p), place[pb.program_slice(p)]].sum(), p)
               for p in range(len(pb.programs))]
        p = max(per)[1]
    else:
        p = pb.programs.index(program)
    ks = pb.program_slice(p).tolist()
    preds: dict[int, list[int]] = {}
    for e in range(len(pb.esrc)):
        if pb.ekind[e] != "STATE" and pb.prog[pb.esrc[e]] == p:
            preds.setdefault(int(pb.edst[e]), []).append(e)
    dev_lanes = [_Lane() for _ in range(pb.D)]
    link_lanes: dict[tuple[int, int], _Lane] = {}
    out: list[Interval] = []
    finish = np.zeros((m, pb.n))
    for mb in range(m):
        last = [0.0] * pb.D
        for k in ks:
            d = int(place[k])
            ready = last[d]
            for e in preds.get(k, ()):
                s = int(pb.esrc[e])
                t = finish[mb, s]
                if place[s] != d and pb.ebytes[e] > 0:
                    a = int(place[s])
                    dur = pb.alpha[a, d] + pb.ebytes[e] / m / pb.bw[a, d]
                    lane = link_lanes.setdefault((a, d), _Lane())
                    st = lane.place(t, dur)
                    out.append(Interval(f"{pb.devices[a]} -> {pb.devices[d]}", st, st + dur,
                                        f"{pb.launch[s]}->{pb.launch[k]}", mb, pb.programs[p]))
                    t = st + dur
                ready = max(ready, t)
            dur = pb.cost[k, d] / m
            st = dev_lanes[d].place(ready, dur)
            finish[mb, k] = st + dur
            last[d] = st + dur
            out.append(Interval(pb.devices[d], st, st + dur, pb.names[k], mb, pb.programs[p]))
    return out


def render(intervals: list[Interval], path: str | Path, title: str = "") -> Path:
    """Draw ``intervals`` as a Gantt chart PNG: one row per lane (devices first, then links), colour = micro-batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = sorted({iv.lane for iv in intervals}, key=lambda s: ("->" in s, s.removesuffix(" waits"), s))
    row = {lane: i for i, lane in enumerate(lanes)}
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.6 * len(lanes)))
    for mb in sorted({iv.micro_batch for iv in intervals}):
        for lane in lanes:
            bars = [(iv.start * 1e3, (iv.end - iv.start) * 1e3) for iv in intervals
                    if iv.micro_batch == mb and iv.lane == lane]
            if bars:
                ax.broken_barh(bars, (row[lane] - 0.4, 0.8), facecolors=colors(mb % 10), edgecolor="black",
                               linewidth=0.2, label=f"micro-batch {mb}" if lane == lanes[0] else None)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("time from the step's start (ms)")
    ax.set_ylabel("device stream / link")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def schedule_intervals(sim: "ProgramSim", devices: tuple[str, ...]) -> list[Interval]:
    """Intervals of a simulated schedule: each launch on its device's row; transfers on a ``src -> dst`` row; waits
    (their cost, not the time blocked) on the waiting device's row."""
    from torch_tessera.scheduler.pipeline_schedule import RunStep, TransferStep, WaitStep

    out: list[Interval] = []
    for d, st in enumerate(sim.schedule.streams):
        for i, step in enumerate(st):
            a, b = float(sim.result.start[d][i]), float(sim.result.end[d][i])
            if isinstance(step, RunStep):
                out.append(Interval(devices[d], a, b, str(step.launch), step.micro_batch, sim.name))
            elif isinstance(step, TransferStep) and b > a:
                out.append(Interval(f"{devices[step.src]} -> {devices[step.dst]}", a, b, f"{step.edge}",
                                    step.micro_batch, sim.name))
            elif isinstance(step, WaitStep) and b > a:
                out.append(Interval(f"{devices[d]} waits", a, b, f"event {step.event_id}", step.micro_batch,
                                    sim.name))
    return out


def simulated_schedule(plan: Plan, dag_or_workload: DependencyGraph | Workload,
                       costs: CostTable | Mapping[str, CostTable] | None, topology: Topology, *,
                       program: str | None = None, pipeline: "PipelineModel | None" = None) -> "ProgramSim":
    """The pipelined schedule of one program of ``plan`` (default: the one with the most time per workload step)
    and its simulation: the plan's own schedule (:meth:`Plan.schedule_of`), simulated on ``costs`` and
    ``topology``; for a plan that carries none for the program (``score="cycle"``, a plan file written before plans
    carried schedules) or one over other memory domains than ``pipeline``'s, one built again from the placement
    (logged)."""
    from torch_tessera.scheduler.pipeline_plan import PipelineModel, program_simulations, simulate_program

    wl = as_workload(dag_or_workload, costs)
    pb = compile_problem(wl, topology, micro_batches=plan.micro_batches)
    place = np.array([plan.placements[pb.programs[pb.prog[k]]][int(pb.launch[k])] for k in range(pb.n)])
    if program is None:
        per = [(pb.freq[p] * pb.cost[pb.program_slice(p), place[pb.program_slice(p)]].sum(), p)
               for p in range(len(pb.programs))]
        p = max(per)[1]
    else:
        p = pb.programs.index(program)
    model = pipeline if pipeline is not None else PipelineModel.from_names(topology.devices)
    own = plan.schedule_of(pb.programs[p])
    domains = tuple(model.domain_of(d) for d in range(pb.D))
    if own is not None and own.micro_batches == plan.micro_batches and tuple(own.domains) == domains:
        return simulate_program(pb, p, wl.programs[p], own, topology, model)
    log.info("plan %s carries no schedule of program %s over %d micro-batches and memory domains %s: building one "
             "from its placement", plan.policy, pb.programs[p], plan.micro_batches, domains)
    sub = Workload((wl.programs[p],))
    return program_simulations(pb, sub, place, topology, model, plan.micro_batches, programs=[p])[0]


def write_gantt(plan: Plan, dag_or_workload: DependencyGraph | Workload,
                costs: CostTable | Mapping[str, CostTable] | None, topology: Topology, path: str | Path, *,
                program: str | None = None, micro_batches: int | None = None,
                pipeline: "PipelineModel | None" = None) -> Path:
    """Timeline of ``plan`` drawn to ``path`` (PNG): the plan's own pipelined schedule as the simulator runs it
    (:func:`simulated_schedule`) when the plan was simulated (``plan.simulated_seconds`` set), else the approximate
    timeline. Returns the path."""
    if plan.simulated_seconds is not None and micro_batches is None:
        sim = simulated_schedule(plan, dag_or_workload, costs, topology, program=program, pipeline=pipeline)
        ivs = schedule_intervals(sim, plan.devices)
        title = (f"{plan.policy} ({sim.name} program): pipelined schedule of {plan.micro_batches} micro-batches on "
                 f"{len(plan.devices)} devices, this program's simulated step {sim.result.step_seconds * 1e3:.3f} ms "
                 f"({sim.schedule.num_waits} waits, {sim.schedule.transfer_bytes / 1e6:.2f} MB moved)")
        return render(ivs, path, title)
    ivs = timeline(plan, dag_or_workload, costs, topology, program=program, micro_batches=micro_batches)
    span = max((iv.end for iv in ivs), default=0.0)
    what = f" ({ivs[0].program} program, one call)" if ivs and ivs[0].program else ""
    title = (f"{plan.policy}{what}: {len(plan.devices)} devices, {plan.micro_batches} micro-batches, predicted "
             f"{plan.objective} {plan.predicted_seconds * 1e3:.3f} ms; this step {span * 1e3:.3f} ms")
    return render(ivs, path, title)
