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

from torch_tessera.scheduler.modulo import (WAIT_SECONDS, DagIndex, Timeline, build_pipelined_schedule, dag_index,
                                           list_timeline, serial_schedule)
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
        share_weights: each device's weight in its domain's DRAM under contention (its SM count;
            :class:`~.simulate.MemoryShare`); ``()``: equal weights.
        corun_rate: in (0, 1]: the most a launch progresses while a launch of another device of its memory domain
            runs (:attr:`~.simulate.MemoryShare.corun_rate`); the constructors set
            :data:`~torch_tessera.target.devices.PARTITION_CORUN_RATE` where a domain holds two or more devices.
    """

    domains: tuple[int, ...] = ()
    device_bandwidth: tuple[float, ...] = ()
    domain_bandwidth: Mapping[int, float] = field(default_factory=dict)
    wait_seconds: float = WAIT_SECONDS
    source: str = "defaults"
    share_weights: tuple[float, ...] = ()
    corun_rate: float = 1.0

    @staticmethod
    def from_names(names: Sequence[str], wait_seconds: float = WAIT_SECONDS) -> "PipelineModel":
        """Domains from device names alone (``cuda:N@...`` partitions of one ``N`` share one); no bandwidths."""
        keys = [("gpu", int(m.group(1))) if (m := _GPU.match(n)) else ("own", i) for i, n in enumerate(names)]
        uniq = list(dict.fromkeys(keys))
        domains = tuple(uniq.index(k) for k in keys)
        return PipelineModel(domains, (), {}, wait_seconds, "device names", (), _corun_rate(domains))

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
        weights = tuple(float(getattr(s, "sm_count", None) or 1) for s in specs)
        return PipelineModel(domains, tuple(float(s.mem_bandwidth) for s in specs), whole, wait_seconds,
                             "device specs (target.devices, datasheet bandwidth per GPU, DRAM shared by SM count)",
                             weights, _corun_rate(domains))

    @property
    def shares(self) -> bool:
        """Whether devices share anything the simulator models: DRAM bandwidth figures or a co-run rate below 1."""
        return bool(self.device_bandwidth) or self.corun_rate < 1.0

    def memory_share(self, dag) -> "MemoryShare | None":
        """The simulator's :class:`~.simulate.MemoryShare` for ``dag``'s launches; None when nothing is shared."""
        if not self.shares:
            return None
        return MemoryShare(launch_bytes(dag), self.device_bandwidth, dict(self.domain_bandwidth), self.share_weights,
                           self.corun_rate)

    def domain_of(self, device: int) -> int:
        return self.domains[device] if self.domains else device


def _corun_rate(domains: Sequence[int]) -> float:
    """:data:`~torch_tessera.target.devices.PARTITION_CORUN_RATE` when some memory domain holds two or more devices
    (partitions of one GPU), else 1."""
    from torch_tessera.target.devices import PARTITION_CORUN_RATE

    return PARTITION_CORUN_RATE if len(set(domains)) < len(domains) else 1.0


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
                        micro_batches: int, programs: Sequence[int] | None = None,
                        cache: dict | None = None) -> list[ProgramSim]:
    """Build and simulate every program's schedule under the global placement ``place`` (``[pb.n]``).

    ``programs``: the problem's index of each program of ``wl`` (default: ``wl`` is the problem's workload).
    ``cache``: a dict the caller keeps for one workload, ``topology`` and ``model`` (:func:`timeline_of`): each
    program's list-scheduler timeline is reused for the issue order."""
    out = []
    for p, prog in zip(programs if programs is not None else range(len(wl.programs)), wl.programs):
        placement, cost = _program_inputs(pb, p, place, cache)
        tl = timeline_of(pb, p, prog.dag, place, topology, model, micro_batches, cache)
        s = build_pipelined_schedule(prog.dag, placement, micro_batches, costs=cost, topology=topology,
                                     domains=_domains(pb, model), wait_seconds=model.wait_seconds, devices=pb.D,
                                     index=program_index(pb, p, prog.dag, cache), timeline=tl)
        out.append(simulate_program(pb, p, prog, s, topology, model, cache))
    return out


def simulate_program(pb: Problem, p: int, prog, schedule: PipelinedSchedule, topology: Topology,
                     model: PipelineModel, cache: dict | None = None) -> ProgramSim:
    """Simulate ``schedule``, a schedule of program ``p`` (``prog``, the problem's ``p``-th program), as
    :func:`program_simulations` does: the problem's costs, ``topology``'s links, ``model``'s wait cost and memory
    sharing. ``cache`` as for :func:`timeline_of`."""
    ks = pb.program_slice(p)
    cost = _once(pb, cache, ("dense_cost", p), lambda: _dense_cost(pb, ks))
    result = simulate(schedule, cost, topology, wait_seconds=model.wait_seconds, memory=model.memory_share(prog.dag))
    return ProgramSim(prog.name, schedule, result)


def timeline_of(pb: Problem, p: int, dag, place: np.ndarray, topology: Topology, model: PipelineModel,
                micro_batches: int, cache: dict | None = None) -> Timeline:
    """Program ``p``'s :func:`~.modulo.list_timeline` under the global placement ``place``.

    ``cache``: a dict the caller keeps across calls for one workload, ``topology`` and ``model`` (problems that
    differ only in their cut charges may share it): it holds each program's DAG index, dense costs and list-scheduler
    timelines by placement and micro-batch count, so each is computed once."""
    ks = pb.program_slice(p)
    key = ("timeline", p, np.asarray(place, dtype=np.int64)[ks].tobytes(), micro_batches)
    if cache is not None and key in cache:
        return cache[key]
    placement, cost = _program_inputs(pb, p, place, cache)
    tl = list_timeline(dag, placement, micro_batches, costs=cost, topology=topology, domains=_domains(pb, model),
                       wait_seconds=model.wait_seconds, devices=pb.D, index=program_index(pb, p, dag, cache))
    if cache is not None:
        cache[key] = tl
    return tl


def _program_inputs(pb: Problem, p: int, place: np.ndarray, cache: dict | None) -> tuple:
    """Program ``p``'s placement (its devices in sorted launch order, as the problem lists a program's launches:
    what :func:`~.modulo.placement_map` takes; launch -> device should they not be sorted) and its
    ``[launches, D]`` costs indexed by launch."""
    ks = pb.program_slice(p)
    where = np.asarray(place, dtype=np.int64)[ks]
    if not _once(pb, cache, ("launches_sorted", p), lambda: bool((np.diff(pb.launch[ks]) > 0).all())):
        where = dict(zip(pb.launch[ks].tolist(), where.tolist()))  # (compile_problem lists them sorted)
    return where, _once(pb, cache, ("dense_cost", p), lambda: _dense_cost(pb, ks))


def _dense_cost(pb: Problem, ks: np.ndarray) -> np.ndarray:
    """``[launches, D]`` seconds of the problem's kernels ``ks`` (one program's), indexed by launch."""
    launch = pb.launch[ks]
    cost = np.zeros((int(launch.max()) + 1, pb.D))
    cost[launch] = pb.cost[ks]
    return cost


def _domains(pb: Problem, model: PipelineModel) -> list[int]:
    return [model.domain_of(d) for d in range(pb.D)]


def program_index(pb: Problem, p: int, dag, cache: dict | None = None) -> DagIndex:
    """:func:`~.modulo.dag_index` of program ``p``'s DAG, computed once per ``cache`` (:func:`timeline_of`), or
    per problem without one."""
    return _once(pb, cache, ("dag_index", p), lambda: dag_index(dag))


def _once(pb: Problem, cache: dict | None, key: tuple, compute):
    """``compute()`` once per ``cache``, or per problem (:meth:`Problem.memo`) without one."""
    if cache is None:
        return pb.memo(":".join(map(str, key)), compute)
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def device_share(sim: ProgramSim) -> np.ndarray:
    """``[D]`` seconds per run this program takes of each device: ``(occupied_d + lost x [runs on d]) / M``."""
    r = sim.result
    occupied = r.busy + r.transfer + r.waiting
    lost = max(0.0, r.step_seconds - float(occupied.max()))
    runs_on = np.array([len(st) > 0 for st in sim.schedule.streams], dtype=np.float64)
    return (occupied + lost * runs_on) / r.micro_batches


def _predicted_share(pb, prog, p, place, topology, model, M, cache=None) -> np.ndarray:
    """:func:`device_share` from the list scheduler's timeline (:func:`timeline_of`)."""
    tl = timeline_of(pb, p, prog.dag, place, topology, model, M, cache)
    occupied = np.asarray(tl.occupied)
    runs_on = np.bincount(place[pb.program_slice(p)], minlength=pb.D) > 0
    return (occupied + max(0.0, tl.step_seconds - float(occupied.max())) * runs_on) / M


def simulated_seconds(pb: Problem, wl: Workload, place: np.ndarray, topology: Topology, model: PipelineModel,
                      micro_batches: int, exact: bool = False, cache: dict | None = None,
                      sims: dict | None = None) -> float:
    """Simulated seconds per workload step of placement ``place`` (``[pb.n]``). A program wholly on one device is
    not simulated: its schedule is its launches back to back, ``occupied = M x its load`` and nothing lost. Without
    bandwidth figures (``model.device_bandwidth`` empty: nothing shared to model) a split program is scored by the
    list scheduler's own timeline (:func:`~.modulo.predicted_step`, a cheap surrogate 0-14 % below the simulated
    step on the test DAGs) unless ``exact``; with them, or ``exact``, by :func:`~.simulate.simulate` of its
    schedule. Programs wholly on devices of one memory domain run side by side at ``model.corun_rate``
    (:func:`corun_bound`). ``cache``: a dict the caller keeps across calls for one workload, ``topology`` and
    ``model``, so the list scheduler runs once per program, placement and micro-batch count (:func:`timeline_of`).
    ``sims``: a dict that receives ``program index -> ProgramSim`` of every program simulated (split programs, with
    ``exact`` or bandwidth figures)."""
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
    whole = corun_bound(T, model)
    if split and not model.shares and not exact:  # nothing shared to model: the list scheduler's timeline
        for p in split:
            T += pb.freq[p] * _predicted_share(pb, wl.programs[p], p, place, topology, model, micro_batches,
                                               cache)
    elif split:
        sub = Workload(tuple(wl.programs[p] for p in split), tie_state=wl.tie_state)
        done = program_simulations(pb, sub, place, topology, model, micro_batches, programs=split,
                                   cache=cache)
        for p, sim in zip(split, done):
            T += pb.freq[p] * device_share(sim)
            if sims is not None:
                sims[p] = sim
    return max(float(T.max()), whole, domain_bound(pb, wl, place, model))


def simulated_schedules(pb: Problem, wl: Workload, place: np.ndarray, topology: Topology, model: PipelineModel,
                        micro_batches: int, cache: dict | None = None
                        ) -> tuple[float, tuple[tuple[str, PipelinedSchedule], ...]]:
    """:func:`simulated_seconds` with ``exact`` and the schedules it scored, one per program of ``wl`` in order:
    a split program's is the schedule simulated (:func:`program_simulations`), a program wholly on one device's its
    launches back to back (:func:`~.modulo.serial_schedule`, the schedule the simulated step assumes for it).

    Returns:
        ``(seconds per workload step, ((program name, schedule over micro_batches), ...))``.
    """
    sims: dict = {}
    seconds = simulated_seconds(pb, wl, place, topology, model, micro_batches, True, cache, sims)
    place = np.asarray(place)
    out = []
    for p, prog in enumerate(wl.programs):
        if p in sims:
            out.append((prog.name, sims[p].schedule))
            continue
        ks = pb.program_slice(p)
        out.append((prog.name, serial_schedule(pb.launch[ks].tolist(), int(place[ks[0]]), micro_batches, pb.D,
                                               _domains(pb, model))))
    return seconds, tuple(out)


def corun_bound(busy: np.ndarray, model: PipelineModel) -> float:
    """Seconds the devices of each memory domain need to run ``busy`` (``[D]`` seconds of launches each, run alone)
    side by side when a launch progresses at ``model.corun_rate`` while another device of its domain runs: with a
    domain's loads sorted ``t_1 <= ... <= t_n``, all but the largest finish by ``t_(n-1) / rate``, the largest then
    runs alone: ``t_(n-1) / rate + t_n - t_(n-1)``. The largest over domains; ``busy.max()`` when the rate is 1."""
    busy = np.asarray(busy, dtype=np.float64)
    if model.corun_rate >= 1.0 or len(busy) < 2:
        return float(busy.max(initial=0.0))
    out = 0.0
    for dm in set(model.domain_of(d) for d in range(len(busy))):
        t = np.sort(busy[[d for d in range(len(busy)) if model.domain_of(d) == dm]])
        out = max(out, float(t[-1]) if len(t) < 2 else float(t[-2] / model.corun_rate + t[-1] - t[-2]))
    return out


def step_lower_bound(pb: Problem, wl: Workload, place: np.ndarray, topology: Topology, model: PipelineModel,
                     cache: dict | None = None) -> float:
    """Seconds per workload step that :func:`simulated_seconds` of ``place`` (``[pb.n]``) is never below, for any
    micro-batch count, with or without ``exact``: the larger of :func:`domain_bound` and the busiest device's
    launches plus the transfers its stream pushes (each cross-domain RAW edge's ``latency + bytes / bandwidth``, on
    the producer's device), times each program's frequency. A stream is occupied at least that long per micro-batch
    (waits and stretched launches only add), and a device's share is at least its occupied time
    (:func:`device_share`). Costs a few numpy operations per program, no schedule. ``cache`` as for
    :func:`timeline_of`."""
    place = np.asarray(place, dtype=np.int64)
    T = np.bincount(place, weights=pb.wcost[np.arange(pb.n), place], minlength=pb.D)
    dom = np.array([model.domain_of(d) for d in range(pb.D)])
    for p, prog in enumerate(wl.programs):
        ks = pb.program_slice(p)
        if len(ks) == 0 or (place[ks] == place[ks[0]]).all():
            continue
        src, dst, nbytes, nodes = _edge_arrays(pb, p, prog.dag, cache)
        where = np.zeros(int(max(pb.launch[ks].max(), nodes.max(initial=0))) + 1, dtype=np.int64)
        where[pb.launch[ks]] = place[ks]
        at = where[nodes]
        s, d = at[src], at[dst]
        moved = (nbytes > 0) & (dom[s] != dom[d])
        s, d = s[moved], d[moved]
        secs = topology.latency[s, d] + nbytes[moved] / topology.bandwidth[s, d]
        T += pb.freq[p] * np.bincount(s, weights=secs, minlength=pb.D)
    return max(float(T.max()), domain_bound(pb, wl, place, model))


def _edge_arrays(pb: Problem, p: int, dag, cache: dict | None) -> tuple[np.ndarray, ...]:
    """Program ``p``'s edges as arrays by launch position (source, destination, RAW bytes) and its sorted launches."""
    def compute():
        ix = program_index(pb, p, dag, cache)
        e = np.array([(i, j, nb) for i, j, _, nb in ix.edges], dtype=np.int64).reshape(-1, 3)
        return e[:, 0], e[:, 1], e[:, 2].astype(np.float64), np.array(ix.nodes, dtype=np.int64)
    return _once(pb, cache, ("edge_arrays", p), compute)


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
