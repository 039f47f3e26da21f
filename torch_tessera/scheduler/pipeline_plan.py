"""Score placements of a workload by simulating their pipelined schedules (what replaced the flat per-cut charge).

For each program, the placement's schedule over ``M`` micro-batches (:func:`~.modulo.build_pipelined_schedule`) is
simulated (:func:`~.simulate.simulate`); a workload step then takes, on each device ``d``,

    ``T_d = sum_p frequency_p x (occupied_(p,d) + lost_p x [p runs on d]) / M``

where ``occupied_(p,d)`` is the time program ``p``'s schedule keeps ``d``'s stream busy (launches, transfers, wait
costs) and ``lost_p`` the time its step exceeds its busiest stream (dependency stalls no other work of ``p`` fills).
The workload step is ``max_d T_d``: for one program, its simulated step per micro-batch; for programs each wholly on
their own device (request-dist), the cycle model's busiest-device load. With bandwidth figures it is at least each
shared memory domain's bytes over its bandwidth (:func:`domain_bound`): programs running side by side on two
partitions of one GPU share its DRAM too. STATE hand-overs between programs are not
simulated (they are outside every program's run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from torch_tessera.scheduler.modulo import WAIT_SECONDS, build_pipelined_schedule, predicted_step
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule
from torch_tessera.scheduler.problem import Problem
from torch_tessera.scheduler.simulate import MemoryShare, SimResult, simulate
from torch_tessera.scheduler.types import Workload
from torch_tessera.target.costs import Topology

#: how the throughput policy scores placements: ``"simulate"`` (the pipelined schedule's simulated step; cut edges
#: cost a wait each in the search, :data:`~.modulo.WAIT_SECONDS`) or ``"cycle"`` (the cycle model with the
#: topology's flat per-cut charge, :attr:`Topology.hop_overhead`)
SCORES = ("simulate", "cycle")

_GPU = re.compile(r"^(?:cuda|sim):(\d+)")


@dataclass(frozen=True)
class PipelineModel:
    """What the simulator needs besides costs and links.

    Attributes:
        domains: memory domain of each device (SM partitions of one GPU share one); ``()``: each its own.
        device_bandwidth: bytes/s of DRAM each device reaches alone; ``()``: bandwidth sharing not modelled.
        domain_bandwidth: memory domain -> bytes/s the whole GPU has.
        wait_seconds: cost of one cross-device wait (:data:`~.modulo.WAIT_SECONDS`).
        source: where the figures come from.
    """

    domains: tuple[int, ...] = ()
    device_bandwidth: tuple[float, ...] = ()
    domain_bandwidth: Mapping[int, float] = field(default_factory=dict)
    wait_seconds: float = WAIT_SECONDS
    source: str = "defaults"

    @staticmethod
    def from_names(names: Sequence[str], wait_seconds: float = WAIT_SECONDS) -> "PipelineModel":
        """Domains from device names alone (``cuda:N@...`` partitions of one ``N`` share one); no bandwidths."""
        keys = [("gpu", int(m.group(1))) if (m := _GPU.match(n)) else ("own", i) for i, n in enumerate(names)]
        uniq = list(dict.fromkeys(keys))
        return PipelineModel(tuple(uniq.index(k) for k in keys), (), {}, wait_seconds, "device names")

    @staticmethod
    def from_specs(specs: Sequence, wait_seconds: float = WAIT_SECONDS) -> "PipelineModel":
        """Domains and bandwidths from :class:`~torch_tessera.target.devices.DeviceSpec` s: each device's own
        ``mem_bandwidth`` (a partition's measured or modelled share), and per GPU the catalog's (datasheet) DRAM
        bandwidth, on the same basis as the partitions' shares."""
        from torch_tessera.target import catalog

        keys = [("gpu", s.index) if s.is_gpu and s.index is not None else ("own", i) for i, s in enumerate(specs)]
        uniq = list(dict.fromkeys(keys))
        domains = tuple(uniq.index(k) for k in keys)
        whole: dict[int, float] = {}
        for dm, s in zip(domains, specs):
            e = catalog.CATALOG.get(getattr(s, "catalog_key", None) or "")
            bw = float(e.mem_bandwidth.value) if e is not None else float(s.mem_bandwidth)
            whole[dm] = max(whole.get(dm, 0.0), bw)
        return PipelineModel(domains, tuple(float(s.mem_bandwidth) for s in specs), whole, wait_seconds,
                             "device specs (target.devices, datasheet bandwidth per GPU)")

    def domain_of(self, device: int) -> int:
        return self.domains[device] if self.domains else device


def surrogate_topology(topology: Topology, model: PipelineModel) -> Topology:
    """The topology the placement search uses with ``score="simulate"``: each cut edge costs both devices one wait
    (``model.wait_seconds``) instead of the flat per-cut charge; copy exposure kept across memory domains, none
    within one (no bytes move)."""
    from dataclasses import replace

    D = len(topology.devices)
    same = np.array([[model.domain_of(a) == model.domain_of(b) for b in range(D)] for a in range(D)])
    expose = np.where(same, 0.0, np.asarray(topology.copy_exposure))
    return replace(topology, hop_overhead=np.full((D, D), model.wait_seconds), copy_exposure=expose,
                   overhead_source=f"one wait per cut edge ({model.wait_seconds * 1e6:g} us, scheduler.modulo."
                                   f"WAIT_SECONDS); copy exposure: {topology.overhead_source}")


def launch_bytes(dag) -> dict[int, float]:
    """DRAM bytes of each launch: the bytes its read and write ranges span (``moved_bytes`` on synthetic DAGs)."""
    out = {}
    for n, d in dag.graph.nodes(data=True):
        if "read_ranges" in d:
            out[n] = float(sum(e - s for _, s, e in d["read_ranges"]) + sum(e - s for _, s, e in d["write_ranges"]))
        else:
            out[n] = float(d.get("moved_bytes", 0.0))
    return out


@dataclass(frozen=True)
class ProgramSim:
    """One program's schedule and its simulation."""

    name: str
    schedule: PipelinedSchedule
    result: SimResult


def program_simulations(pb: Problem, wl: Workload, place: np.ndarray, topology: Topology, model: PipelineModel,
                        micro_batches: int, programs: Sequence[int] | None = None) -> list[ProgramSim]:
    """Build and simulate every program's schedule under the global placement ``place`` (``[pb.n]``).

    ``programs``: the problem's index of each program of ``wl`` (default: ``wl`` is the problem's workload)."""
    out = []
    D = pb.D
    for p, prog in zip(programs if programs is not None else range(len(wl.programs)), wl.programs):
        ks = pb.program_slice(p)
        launch = pb.launch[ks]
        placement = dict(zip(launch.tolist(), np.asarray(place)[ks].tolist()))
        cost = np.zeros((int(launch.max()) + 1, D))
        cost[launch] = pb.cost[ks]
        table = _Costs(cost)
        s = build_pipelined_schedule(prog.dag, placement, micro_batches, costs=table, topology=topology,
                                     domains=[model.domain_of(d) for d in range(D)], wait_seconds=model.wait_seconds,
                                     devices=D)
        mem = None
        if model.device_bandwidth:
            mem = MemoryShare(launch_bytes(prog.dag), model.device_bandwidth, dict(model.domain_bandwidth))
        out.append(ProgramSim(prog.name, s, simulate(s, cost, topology, wait_seconds=model.wait_seconds, memory=mem)))
    return out


class _Costs:
    """A dense ``[launch, device]`` array with the :class:`CostTable` ``row`` interface (internal)."""

    def __init__(self, seconds: np.ndarray):
        self.seconds = seconds

    def row(self, launch: int) -> np.ndarray:
        return self.seconds[launch]


def device_share(sim: ProgramSim) -> np.ndarray:
    """``[D]`` seconds per run this program takes of each device: ``(occupied_d + lost x [runs on d]) / M``."""
    r = sim.result
    occupied = r.busy + r.transfer + r.waiting
    lost = max(0.0, r.step_seconds - float(occupied.max()))
    runs_on = np.array([len(st) > 0 for st in sim.schedule.streams], dtype=np.float64)
    return (occupied + lost * runs_on) / r.micro_batches


def _predicted_share(pb, prog, p, place, topology, model, M) -> np.ndarray:
    """:func:`device_share` from the list scheduler's timeline (:func:`~.modulo.predicted_step`)."""
    ks = pb.program_slice(p)
    launch = pb.launch[ks]
    cost = np.zeros((int(launch.max()) + 1, pb.D))
    cost[launch] = pb.cost[ks]
    step, occ = predicted_step(prog.dag, dict(zip(launch.tolist(), place[ks].tolist())), M, costs=_Costs(cost),
                               topology=topology, domains=[model.domain_of(d) for d in range(pb.D)],
                               wait_seconds=model.wait_seconds, devices=pb.D)
    occupied = np.asarray(occ)
    runs_on = np.bincount(place[ks], minlength=pb.D) > 0
    return (occupied + max(0.0, step - float(occupied.max())) * runs_on) / M


def simulated_seconds(pb: Problem, wl: Workload, place: np.ndarray, topology: Topology, model: PipelineModel,
                      micro_batches: int, exact: bool = False) -> float:
    """Simulated seconds per workload step of placement ``place`` (``[pb.n]``). A program wholly on one device is
    not simulated: its schedule is its launches back to back, ``occupied = M x its load`` and nothing lost. Without
    bandwidth figures (``model.device_bandwidth`` empty: nothing shared to model) a split program is scored by the
    list scheduler's own timeline (:func:`~.modulo.predicted_step`, a cheap surrogate 0-14 % below the simulated
    step on the test DAGs) unless ``exact``; with them, or ``exact``, by :func:`~.simulate.simulate` of its
    schedule."""
    place = np.asarray(place)
    T = np.zeros(pb.D)
    split = []
    for p in range(len(wl.programs)):
        ks = pb.program_slice(p)
        devs = np.unique(place[ks])
        if len(devs) == 1:
            T[devs[0]] += pb.freq[p] * float(pb.cost[ks, devs[0]].sum())
        else:
            split.append(p)
    if split and not model.device_bandwidth and not exact:  # nothing shared to model: the list scheduler's timeline
        for p in split:
            T += pb.freq[p] * _predicted_share(pb, wl.programs[p], p, place, topology, model, micro_batches)
    elif split:
        sub = Workload(tuple(wl.programs[p] for p in split), tie_state=wl.tie_state)
        sims = program_simulations(pb, sub, place, topology, model, micro_batches, programs=split)
        for p, sim in zip(split, sims):
            T += pb.freq[p] * device_share(sim)
    return max(float(T.max()), domain_bound(pb, wl, place, model))


def domain_bound(pb: Problem, wl: Workload, place: np.ndarray, model: PipelineModel) -> float:
    """Seconds per workload step the DRAM of each shared memory domain needs at least: the bytes every launch placed
    there moves (:func:`launch_bytes`, times its program's frequency) over the domain's bandwidth. Programs run
    side by side (one request stream per partition) share it too, which the per-program simulations do not see.
    0 without bandwidth figures."""
    if not model.device_bandwidth or not model.domain_bandwidth:
        return 0.0
    need: dict[int, float] = {}
    for p, prog in enumerate(wl.programs):
        ks = pb.program_slice(p)
        nbytes = launch_bytes(prog.dag)
        for k, d in zip(pb.launch[ks].tolist(), np.asarray(place)[ks].tolist()):
            dm = model.domain_of(d)
            need[dm] = need.get(dm, 0.0) + pb.freq[p] * nbytes.get(k, 0.0)
    return max((b / model.domain_bandwidth[dm] for dm, b in need.items() if dm in model.domain_bandwidth),
               default=0.0)
