"""The scheduler's border types: what goes in (:class:`Workload`) and what comes out (:class:`Plan`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from torch_tessera.errors import NotApplicableError  # noqa: F401  (re-exported)
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, schedule_from_data, schedule_to_data
from torch_tessera.target.costs import CostTable

#: Objective names: ``cycle`` is the steady-state pipeline cycle time per workload step (throughput policies),
#: ``latency`` the time one request takes (sum over programs of frequency x makespan).
OBJECTIVES = ("cycle", "latency")




@dataclass(frozen=True)
class WorkloadProgram:
    """One program of a workload.

    Attributes:
        name: program name, e.g. ``"prefill"`` or ``"decode"``; unique within the workload.
        dag: its dependency DAG.
        costs: time of each launch on each device (seconds); may be ``None`` when passed to :func:`plan` separately.
        frequency: runs per workload step, e.g. 1 for prefill and the mean output length for decode.
        role: ``"prefill"``, ``"decode"`` or ``""``; the ``pd`` baseline needs one prefill and one decode program.
        stream: request stream (replica) the program serves (:meth:`Workload.replicated`): programs of different
            streams serve different requests, so their STATE buffers (each stream's own KV cache) are distinct even
            where the names agree; weights stay shared by name.
    """

    name: str
    dag: DependencyGraph
    costs: CostTable | None = None
    frequency: float = 1.0
    role: str = ""
    stream: int = 0


@dataclass(frozen=True)
class Workload:
    """One or several programs planned together (their weights share memory, their STATE buffers are shared).

    A STATE buffer with the same name in several programs (the KV cache written by prefill and by decode) is shared:
    when its owners differ between two consecutive programs, its bytes are handed over once per workload step on the
    link between them; with ``tie_state`` the owners are forced equal instead.

    Attributes:
        programs: the programs, in the order a request runs them.
        tie_state: force shared STATE buffers to have one owner across programs.
    """

    programs: tuple[WorkloadProgram, ...]
    tie_state: bool = False

    def __post_init__(self) -> None:
        names = [p.name for p in self.programs]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Workload needs at least one program and unique names, got {names}")

    @staticmethod
    def single(dag: DependencyGraph, costs: CostTable | None = None, name: str = "main") -> "Workload":
        return Workload((WorkloadProgram(name, dag, costs),))

    @property
    def streams(self) -> int:
        """Request streams the workload holds (1 unless :meth:`replicated`)."""
        return 1 + max(p.stream for p in self.programs)

    def replicated(self, shares: "tuple[float, ...] | list[float]") -> "Workload":
        """The same programs once per request stream, stream ``r`` taking ``shares[r]`` of the requests.

        A workload step still serves one request's worth of work: program ``p`` of stream ``r`` runs ``shares[r] x
        frequency_p`` times per step. Stream 0 keeps the program names, stream ``r >= 1`` is named ``"<name>@r"``.
        Each stream has its own STATE (its own KV cache), while the weights are shared by name, so one placement of
        this workload can put the streams on different devices (the ``request-dist`` baseline: stream ``r`` wholly on
        device ``r``) and move single kernels of a stream to the device that suits them.

        Raises:
            ValueError: fewer than two shares, a negative share, or shares not summing to 1; an already replicated
                workload.
        """
        shares = [float(x) for x in shares]
        if len(shares) < 2 or min(shares) < 0 or abs(sum(shares) - 1.0) > 1e-6:
            raise ValueError(f"shares must be >= 2 non-negative fractions summing to 1, got {shares}")
        if self.streams > 1:
            raise ValueError("the workload is already replicated")
        progs = tuple(WorkloadProgram(p.name if r == 0 else f"{p.name}@{r}", p.dag, p.costs, p.frequency * share,
                                      p.role, r)
                      for r, share in enumerate(shares) for p in self.programs)
        return Workload(progs, tie_state=self.tie_state)

    @staticmethod
    def llm(prefill: DependencyGraph, prefill_costs: CostTable, decode: DependencyGraph, decode_costs: CostTable,
            mean_output_tokens: float, tie_state: bool = False) -> "Workload":
        """A serving workload: one prefill then ``mean_output_tokens`` decode steps per request."""
        return Workload((WorkloadProgram("prefill", prefill, prefill_costs, 1.0, "prefill"),
                         WorkloadProgram("decode", decode, decode_costs, float(mean_output_tokens), "decode")),
                        tie_state=tie_state)


@dataclass(frozen=True)
class CutEdge:
    """A dependency whose producer and consumer run on different devices: one transfer per program run.

    Attributes:
        program: program name.
        src / dst: launch indices of producer and consumer (for a STATE hand-over: the owners' launch indices, the
            destination in program ``dst_program``).
        src_device / dst_device: device indices.
        nbytes: bytes moved per run of the program.
        ranges: byte ranges ``(buffer, start, end)`` moved.
        kind: ``"RAW"`` or ``"STATE"`` (hand-over of a shared state between programs).
        dst_program: program of ``dst`` (differs from ``program`` only for a STATE hand-over).
    """

    program: str
    src: int
    dst: int
    src_device: int
    dst_device: int
    nbytes: int
    ranges: tuple[tuple[str, int, int], ...] = ()
    kind: str = "RAW"
    dst_program: str = ""


@dataclass(frozen=True)
class SolverInfo:
    """How a plan was found.

    Attributes:
        method: e.g. ``"milp"``, ``"milp(tied)+local"``, ``"dp"``, ``"heft+local"``, ``"baseline"``, ``"cache"``.
        status: ``"optimal"``, ``"time limit"``, ``"heuristic"``, ``"fixed"`` (baselines).
        wall_seconds: solve time (seconds), excluding cache I/O.
        nodes: branch-and-bound nodes explored (0 when no MILP ran).
        kernels: launches planned (all programs).
        blocks: decision blocks after co-location groups and layer tying.
        notes: anything a reader should know (fallbacks, relaxations).
    """

    method: str
    status: str
    wall_seconds: float = 0.0
    nodes: int = 0
    kernels: int = 0
    blocks: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Where each kernel runs, what crosses devices, and what that is predicted to cost.

    Attributes:
        policy: ``"throughput"``, ``"latency"`` or a baseline name (``"homo-L"``, ``"af"``...).
        devices: device names; indices below refer to this tuple.
        placements: program name -> launch index -> device index.
        cut_edges: every transfer of a workload step's programs.
        orders: program name -> per-device tuple of launch indices in launch order.
        micro_batches: micro-batches in flight in the throughput pipeline (1 for latency plans).
        objective: ``"cycle"`` or ``"latency"``: what ``predicted_seconds`` measures.
        predicted_seconds: cycle time per workload step (max over devices' compute and links' transfer load) for
            ``cycle``; frequency-weighted makespan of one request for ``latency``.
        lower_bound_seconds: a proven lower bound on the same objective over all placements satisfying the
            constraints (0 when none is known).
        cycle_seconds / latency_seconds: both metrics, whatever the objective.
        device_seconds: load per device per workload step (seconds): its kernels plus ``hop_seconds``.
        link_seconds: ``((src, dst), seconds)`` transfer load per workload step on each used link.
        memory_bytes: per-device estimate: weights placed + STATE held + activation peak (bytes).
        weight_bytes / state_bytes / activation_bytes: its parts per device (bytes).
        memory_budgets: per-device budgets the plan respects (bytes), ``None`` where unlimited.
        memory_pools: ``(GPU name, member device indices, bytes held, budget bytes)`` per GPU whose partitions share
            its memory: what the members hold together (resident buffers once, as they share one buffer pool at run
            time, plus each used member's activation reserve) and the budget it must fit (empty: no shared memory).
        weights: per device, names of the PARAMETER buffers placed there.
        replicas: devices that each run a full replica (``request-dist``); empty otherwise.
        hop_seconds: per device, the part of ``device_seconds`` its cut edges charge it (per-hop overhead and
            exposed copy time, :attr:`~torch_tessera.target.costs.Topology.hop_overhead`); empty when none.
        solver: how it was found.
        simulated_seconds: seconds per workload step the simulator predicts for the plan's pipelined schedules
            (:func:`torch_tessera.scheduler.pipeline_plan.simulated_seconds`, over ``micro_batches``); ``None`` when
            not simulated (``score="cycle"``, or request-dist's replicas).
        schedules: ``((program name, schedule), ...)`` in the workload's program order: the explicit pipelined
            schedule over ``micro_batches`` that ``simulated_seconds`` scored for each program
            (:func:`torch_tessera.scheduler.pipeline_plan.simulated_schedules`): per device, the issue order of
            (micro-batch, launch), each transfer, record and wait. A program split over devices has the schedule the
            simulator ran; a program wholly on one device its launches back to back, micro-batch after micro-batch.
            Empty exactly when ``simulated_seconds`` is ``None`` (``score="cycle"``, request-dist's replicas), and
            for plans read from a dump or cache file written before plans carried schedules.
    """

    policy: str
    devices: tuple[str, ...]
    placements: Mapping[str, Mapping[int, int]]
    cut_edges: tuple[CutEdge, ...]
    orders: Mapping[str, tuple[tuple[int, ...], ...]]
    micro_batches: int
    objective: str
    predicted_seconds: float
    lower_bound_seconds: float
    cycle_seconds: float
    latency_seconds: float
    device_seconds: tuple[float, ...]
    link_seconds: tuple[tuple[tuple[int, int], float], ...]
    memory_bytes: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    state_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    memory_budgets: tuple[int | None, ...]
    weights: tuple[tuple[str, ...], ...]
    solver: SolverInfo
    replicas: tuple[int, ...] = ()
    frequencies: Mapping[str, float] = field(default_factory=dict)
    hop_seconds: tuple[float, ...] = ()
    simulated_seconds: float | None = None
    memory_pools: tuple[tuple[str, tuple[int, ...], int, int], ...] = ()
    schedules: tuple[tuple[str, PipelinedSchedule], ...] = ()

    def schedule_of(self, program: str | None = None) -> PipelinedSchedule | None:
        """The schedule :attr:`schedules` holds for ``program`` (default: the only program), ``None`` when it holds
        none.

        Raises:
            ValueError: ``program`` is not one of the plan's programs, or is ``None`` for a plan of several.
        """
        if program is None:
            if len(self.placements) != 1:
                raise ValueError(f"plan covers programs {list(self.placements)}; use plan.schedule_of(name)")
            program = next(iter(self.placements))
        if program not in self.placements:
            raise ValueError(f"program {program!r} is not one of the plan's programs {list(self.placements)}")
        return next((s for name, s in self.schedules if name == program), None)

    @property
    def gap(self) -> float:
        """Relative gap ``(predicted - bound) / predicted`` (0 = proven optimal; 1 when no bound is known)."""
        if self.predicted_seconds <= 0:
            return 0.0
        return max(0.0, (self.predicted_seconds - self.lower_bound_seconds) / self.predicted_seconds)

    @property
    def placement(self) -> Mapping[int, int]:
        """Launch index -> device index of the only program (raises for multi-program workloads)."""
        if len(self.placements) != 1:
            raise ValueError(f"plan covers programs {list(self.placements)}; use plan.placements[name]")
        return next(iter(self.placements.values()))

    @property
    def bytes_per_step(self) -> float:
        """Bytes moved across devices per workload step (each program's transfers times its frequency)."""
        return float(sum(e.nbytes * (1.0 if e.kind == "STATE" else self.frequencies.get(e.program, 1.0))
                         for e in self.cut_edges))

    @property
    def throughput_per_s(self) -> float:
        """Workload steps per second at the predicted cycle time."""
        return 1.0 / self.cycle_seconds if self.cycle_seconds > 0 else float("inf")

    def kernels_on(self, device: int) -> int:
        return sum(1 for pl in self.placements.values() for d in pl.values() if d == device)

    def summary(self) -> str:
        """A readable table: kernels per device, memory, cut edges, bytes per step, predicted time, gap."""
        from torch_tessera.scheduler.report import plan_summary

        return plan_summary(self)

    def __str__(self) -> str:
        return self.summary()

    # -- JSON round trip (plan cache, dumps) -------------------------------------------------------------------

    def to_json(self) -> str:
        """The plan as JSON text (:meth:`from_json` reads it back equal)."""
        # fields one level deep (json writes tuples as lists): dataclasses.asdict's deep copy of every tuple was most
        # of the time, and gives the same text
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["cut_edges"] = [{f.name: getattr(e, f.name) for f in fields(CutEdge)} for e in self.cut_edges]
        d["solver"] = {f.name: getattr(self.solver, f.name) for f in fields(SolverInfo)}
        d["schedules"] = [[name, schedule_to_data(s)] for name, s in self.schedules]
        d["placements"] = {p: {str(k): v for k, v in pl.items()} for p, pl in self.placements.items()}
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> "Plan":
        """The plan :meth:`to_json` wrote; text of a plan written before plans carried schedules reads with
        :attr:`schedules` empty.

        Raises:
            ValueError / KeyError / TypeError: text that is not a written plan.
        """
        d: dict[str, Any] = json.loads(text)
        d["schedules"] = tuple((name, schedule_from_data(s)) for name, s in d.get("schedules", ()))
        d["placements"] = {p: {int(k): v for k, v in pl.items()} for p, pl in d["placements"].items()}
        d["cut_edges"] = tuple(CutEdge(**{**e, "ranges": tuple(tuple(r) for r in e["ranges"])})
                               for e in d["cut_edges"])
        d["orders"] = {p: tuple(tuple(o) for o in per) for p, per in d["orders"].items()}
        d["link_seconds"] = tuple((tuple(k), v) for k, v in d["link_seconds"])
        d["weights"] = tuple(tuple(w) for w in d["weights"])
        d["solver"] = SolverInfo(**{**d["solver"], "notes": tuple(d["solver"]["notes"])})
        for key in ("devices", "device_seconds", "memory_bytes", "weight_bytes", "state_bytes", "activation_bytes",
                    "memory_budgets", "replicas", "hop_seconds"):
            if key in d:
                d[key] = tuple(d[key])
        d["memory_pools"] = tuple((n, tuple(m), h, c) for n, m, h, c in d.get("memory_pools", ()))
        return Plan(**d)
