"""What the backend installs in place of Inductor's ``call()``: a program, its DAG, devices and a placement."""

from __future__ import annotations

import logging
import random
from typing import Any, Mapping, Sequence

from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import KernelProgram
from torch_tessera.runtime.placed import PlacedExecutor

log = logging.getLogger(__name__)


class TesseraRunner:
    """Callable with Inductor's calling convention (a list of inputs -> list of outputs) running a placed program.

    Attributes:
        program / dag / devices: what it runs, and where.
        executor: the current :class:`PlacedExecutor`.
        plan: the scheduler's plan, when the placement came from one.
        timeout_s / cuda_graphs / graph_copies / priority_class / static_inputs / weight_cache: passed to each
            :class:`PlacedExecutor` it makes (read again by :meth:`set_placement`).
    """

    def __init__(
        self,
        program: KernelProgram,
        dag: DependencyGraph,
        devices: Sequence[Any],
        placement: Mapping[int, int],
        kernel_objects: Mapping[str, Any] | None = None,
        plan: Any = None,
        timeout_s: float = 60.0,
        cuda_graphs: bool | str = False,
        graph_copies: str = "link",
        priority_class: str = "normal",
        static_inputs: str = "place",
    ) -> None:
        self.program = program
        self.dag = dag
        self.devices = list(devices)
        self.plan = plan
        self._kernel_objects = dict(kernel_objects or {})
        self.timeout_s = timeout_s
        self.cuda_graphs = cuda_graphs
        self.graph_copies = graph_copies
        self.static_inputs = static_inputs  # see PlacedExecutor; read again by every set_placement
        self.priority_class = priority_class  # see PlacedExecutor; read again by every set_placement
        self.weight_cache: dict | None = None  # see PlacedExecutor; set by a serving process whose weights are frozen
        self.executor = self._make(placement)

    def _make(self, placement: Mapping[int, int]) -> PlacedExecutor:
        estimate = getattr(self.plan, "memory_bytes", None)
        return PlacedExecutor(self.program, self.dag, placement, self.devices, self._kernel_objects,
                              timeout_s=self.timeout_s, memory_estimate=estimate, cuda_graphs=self.cuda_graphs,
                              graph_copies=self.graph_copies, priority_class=self.priority_class,
                              weight_cache=self.weight_cache, static_inputs=self.static_inputs)

    def set_placement(self, placement: Mapping[int, int], plan: Any = None) -> None:
        """Run with another placement from the next call on (weights are re-placed)."""
        self.plan = plan
        self.executor = self._make(placement)

    def __call__(self, args: list) -> list:
        return self.executor(args)

    def schedule_for(self, micro_batches: int) -> Any:
        """The pipelined schedule a group of ``micro_batches`` replays (``executor.run_pipelined(batches,
        schedule=...)``): the plan's own (:meth:`~torch_tessera.scheduler.Plan.schedule_of`, the schedule its
        simulator scored) when the plan carries one over that many micro-batches for this placement and the
        executor's memory domains, else one built
        from the placement with every launch costing the same (logged), as the distributed executor does.

        Raises:
            ConfigError: ``micro_batches < 1``.
        """
        from torch_tessera.scheduler.modulo import build_pipelined_schedule

        own = None
        if self.plan is not None and getattr(self.plan, "schedules", ()) and len(self.plan.placements) == 1:
            own = self.plan.schedule_of()
        ex = self.executor
        if (own is not None and own.micro_batches == micro_batches and dict(own.placement) == dict(self.placement)
                and tuple(own.domains) == tuple(ex.domains)):
            return own
        log.info("no plan schedule over %d micro-batches for this placement and its memory domains (the plan's: %s); "
                 "replaying a unit-cost schedule of the placement", micro_batches,
                 f"{own.micro_batches} micro-batches, domains {own.domains}" if own is not None else "none")
        return build_pipelined_schedule(self.dag, self.placement, micro_batches, domains=ex.domains,
                                        devices=len(ex.devices))

    @property
    def kernel_objects(self) -> Mapping[str, Any]:
        """The live kernel objects from lowering (usable on the home device)."""
        return self._kernel_objects

    @property
    def placement(self) -> Mapping[int, int]:
        return self.executor.schedule.placement

    @property
    def calls(self) -> int:
        """Calls of the current executor (reset by :meth:`set_placement`)."""
        return self.executor.calls

    @property
    def launches_executed(self) -> int:
        """Launches run by the current executor (reset by :meth:`set_placement`)."""
        return self.executor.launches_executed


def pinned_groups(dag: DependencyGraph) -> dict[int, int]:
    """Launches the access analysis is unsure of, each mapped to the neighbour whose device it must share."""
    out: dict[int, int] = {}
    for n in sorted(dag.graph.nodes):
        if dag.node(n).unsure:
            preds = sorted(dag.graph.predecessors(n))
            out[n] = out.get(preds[-1], preds[-1]) if preds else -1
    return out


def random_placement(dag: DependencyGraph, n_devices: int, seed: int, home: int = 0) -> dict[int, int]:
    """A uniformly random device per launch, except that unsure launches follow their pinned neighbour (or home)."""
    rng = random.Random(seed)
    placement = {n: rng.randrange(n_devices) for n in sorted(dag.graph.nodes)}
    for n, anchor in pinned_groups(dag).items():
        placement[n] = home if anchor < 0 else placement[anchor]
    return placement
