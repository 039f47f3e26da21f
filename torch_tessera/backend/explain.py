"""What tessera did with each graph it was given: :func:`explain`, and the records the backend keeps for it.

The backend opens one :class:`GraphRecord` per graph Dynamo hands it, fills it as the stages run (tessera or the
Inductor fallback and why, the executor, where the costs came from), and warns once
(:class:`~torch_tessera.errors.TesseraRecompileWarning`) when Dynamo compiles one function more than
:data:`RECOMPILE_WARN_AFTER` times (Dynamo's own count per frame, reset by ``torch._dynamo.reset()``).
"""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, Callable, Iterator, Mapping

from torch_tessera.errors import TesseraRecompileWarning, warn_user

#: Compiles of one function after which :class:`TesseraRecompileWarning` is issued (once per function).
RECOMPILE_WARN_AFTER = 4

#: explain's costs for a graph that runs on one device (option ``devices`` not set): nothing is placed or measured.
NO_PLAN_ONE_DEVICE = "no plan: one device"

_lock = threading.Lock()
_records: list["GraphRecord"] = []


@dataclass
class GraphRecord:
    """The backend's notes on one graph while and after it compiles (mutable; :func:`explain` freezes a view).

    Attributes:
        index: order of arrival in this process (0, 1, ...).
        compile_id: Dynamo's id (``"0/1"``), or ``None``.
        codes: code objects Dynamo traced for the graph (to find the graphs of one compiled object).
        tensors: id -> weak reference of the tensors the graph was given (inputs, and the graph module's own
            parameters and buffers), to tell apart two compiled modules of one class.
        backend: ``"tessera"`` or ``"fallback"`` (plain Inductor).
        reason: why it fell back (``None`` for tessera).
        executors: weak references to what the backend installed, one per inner graph (program, placement, plan);
            the compiled function holds them, so a graph Dynamo dropped frees them.
        costs: where the plan's kernel costs came from (``"model: ..."``, ``"measured on ..."``), or ``None``
            when nothing was planned (policy ``home`` or ``random``).
        launches_timed: (distinct launch, device) pairs timed at compile time for measured costs (0 when all came
            from the profile cache or from the model), ``None`` without costs.
        plan_source: how the plan was found (``"reused from the plan cache ..."`` or the solver's method now).
        compiled: weak reference to the callable the backend returned for the graph (``None`` until it returns):
            once Dynamo drops it (``torch._dynamo.reset()``, a recompile that replaces it), :func:`explain` leaves
            the graph out.
        attempt: Dynamo's attempt of the compile (0; 1, 2, ... after it restarted its analysis of the frame).
        superseded: a later attempt of the same compile arrived, or this one raised (a restart aborts the backend
            call with an exception), so no graph of it runs: :func:`explain` leaves it out.
        warned: the fallback warning was issued for this compile id (by this attempt or an earlier one).
        from_cache: inner graphs whose program came from the warm path (the AOTAutograd cache and the saved codegen
            record: no tracing, no Inductor compile).
    """

    index: int
    compile_id: str | None
    codes: tuple[CodeType, ...]
    tensors: dict = field(default_factory=dict)
    backend: str = "tessera"
    reason: str | None = None
    executors: list = field(default_factory=list)
    costs: str | None = None
    launches_timed: int | None = None
    plan_source: str | None = None
    compiled: Any = None
    attempt: int = 0
    superseded: bool = False
    warned: bool = False
    from_cache: int = 0

    def dropped(self) -> bool:
        """Whether no graph of this record runs: superseded, or Dynamo no longer holds what the backend returned."""
        return self.superseded or (self.compiled is not None and self.compiled() is None)


@dataclass(frozen=True)
class GraphReport:
    """One compiled graph, as :func:`explain` reports it.

    Attributes:
        graph: Dynamo's compile id (``"0/0"``) or the arrival index.
        backend: ``"tessera"`` or ``"fallback"``.
        reason: why it fell back to Inductor (``None`` for tessera).
        programs: kernel programs tessera runs for the graph (0 for a fallback).
        launches: device name -> kernel launches placed there, over the graph's programs.
        cut_edges: dependencies that cross devices (each a copy per call).
        predicted_step_s: the plan's predicted seconds per step (its objective), ``None`` without a plan.
        costs: where the plan's kernel costs came from, ``None`` without a plan.
        cuda_graphs: how the program replays (``False``, ``"whole"``, ``"segments"``).
        plan: the plan's summary table (:meth:`torch_tessera.scheduler.Plan.summary`), ``None`` without a plan.
        launches_timed: (distinct launch, device) pairs timed while compiling, ``None`` without costs.
        plan_source: how the plan was found: ``"reused from the plan cache ..."`` or solved now, ``None`` without one.
        from_cache: of ``programs``, how many came from the compile cache (AOTAutograd cache + saved codegen record:
            not traced, not compiled by Inductor in this process).
    """

    graph: str
    backend: str
    reason: str | None
    programs: int
    launches: Mapping[str, int]
    cut_edges: int
    predicted_step_s: float | None
    costs: str | None
    cuda_graphs: Any
    plan: str | None = None
    launches_timed: int | None = None
    plan_source: str | None = None
    from_cache: int = 0

    def to_jsonable(self) -> dict:
        """The report as plain JSON types (for ``benchmark.extra_info`` and dumps)."""
        return {"graph": self.graph, "backend": self.backend, "reason": self.reason, "programs": self.programs,
                "launches": dict(self.launches), "cut_edges": self.cut_edges,
                "predicted_step_s": self.predicted_step_s, "costs": self.costs, "cuda_graphs": self.cuda_graphs,
                "plan": self.plan, "launches_timed": self.launches_timed, "plan_source": self.plan_source,
                "from_cache": self.from_cache}

    def line(self) -> str:
        """One readable line."""
        if self.backend != "tessera":
            return f"graph {self.graph}: fallback to Inductor ({self.reason})"
        where = ", ".join(f"{d} {n}" for d, n in self.launches.items()) or "no launches"
        step = "-" if self.predicted_step_s is None else f"{self.predicted_step_s * 1e3:.3f} ms"
        cached = f" ({self.from_cache} from the compile cache, not traced)" if self.from_cache else ""
        return (f"graph {self.graph}: tessera, {self.programs} program(s){cached}, launches {where}, "
                f"{self.cut_edges} cut edge(s), predicted step {step}, costs {self._costs_text()}, "
                f"plan {self.plan_source or '-'}, cuda_graphs {self.cuda_graphs}")

    def _costs_text(self) -> str:
        """``costs`` for :meth:`line`: ``"from the model (roofline model ...)"``, ``"measured on ..."``, or why
        there is no plan."""
        if self.costs is None:
            return NO_PLAN_ONE_DEVICE if len(self.launches) <= 1 and self.predicted_step_s is None else "- (no plan)"
        if self.costs.startswith("model: "):
            return f"from the model ({self.costs[len('model: '):]})"
        end = self.costs.rfind("): ")
        if self.costs.startswith("model (") and end > 0:  # "model (measuring failed: E): X"
            return f"from the model ({self.costs[len('model ('):end]}; {self.costs[end + 3:]})"
        return self.costs


@dataclass(frozen=True)
class Explanation:
    """:func:`explain`'s answer: one :class:`GraphReport` per graph, in compile order; prints one line each."""

    graphs: tuple[GraphReport, ...]

    def __iter__(self) -> Iterator[GraphReport]:
        return iter(self.graphs)

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, i: int) -> GraphReport:
        return self.graphs[i]

    def __str__(self) -> str:
        return "\n".join(g.line() for g in self.graphs) if self.graphs else "no graph compiled by tessera"


def open_record(gm: Any, example_inputs: Any) -> GraphRecord:
    """Start the record of a graph the backend was handed; warns when its function recompiles too often."""
    from torch_tessera.compat.dynamo import (compile_attempt, compile_id, compiled_subject, frame_compiles,
                                             recompile_reason, traced_code)

    codes = traced_code()
    tensors = {id(t): weakref.ref(t) for t in [*example_inputs, *gm.parameters(), *gm.buffers()]
               if hasattr(t, "data_ptr")}
    with _lock:
        record = GraphRecord(len(_records), compile_id(gm), codes, tensors, attempt=compile_attempt())
        earlier = [r for r in _records if r.compile_id is not None and r.compile_id == record.compile_id
                   and r.codes == codes and r.attempt < record.attempt and not _released(r)]
        for r in earlier:  # Dynamo restarted its analysis: this attempt replaces theirs
            r.superseded = True
        record.warned = any(r.warned for r in earlier)
        _records.append(record)
    _, n = frame_compiles(gm) or (None, 0)
    # once per function: its compile count passes the threshold once (not again for a restarted attempt)
    if n == RECOMPILE_WARN_AFTER + 1 and record.attempt == 0:
        warn_user(recompile_message(compiled_subject(codes), n, recompile_reason()), TesseraRecompileWarning)
    return record


def recompile_message(subject: str | None, compiles: int, guard: str | None) -> str:
    """The text of :class:`TesseraRecompileWarning`.

    Args:
        subject: what the user compiled (``"MyNet (torch.nn.Module, forward at f.py:12)"``), ``None`` if unknown.
        compiles: how many times Dynamo has compiled it.
        guard: the guard whose failure caused the last compile (Dynamo's text), ``None`` if unknown.
    """
    why = f" Last failed guard: {guard}." if guard else ""
    return (f"tessera has compiled {subject or 'a function'} {compiles} times.{why} Each new input shape is a new "
            "program and costs a compile, and Dynamo runs the function eagerly once its recompile limit is reached. "
            "Pad inputs to a few shapes (torch_tessera.hf.compile_for_generate pads prompts to length buckets) and "
            "use a static KV cache for decode loops; TORCH_LOGS=recompiles lists every failed guard.")


def _released(record: GraphRecord) -> bool:
    """Whether Dynamo dropped what the backend returned for the record (a compile from before a reset)."""
    return record.compiled is not None and record.compiled() is None


def close_record(record: GraphRecord, compiled: Callable) -> Callable:
    """Note the callable the backend returns for the record's graph (held weakly), and return it."""
    try:
        record.compiled = weakref.ref(compiled)
    except TypeError:  # not weak-referenceable: the record stays listed
        pass
    return compiled


def abandon_record(record: GraphRecord) -> None:
    """Mark the record of a backend call that raised (a Dynamo restart, or an error the user sees): no graph of it
    runs, so :func:`explain` leaves it out; a later attempt of the same compile still sees whether it warned."""
    record.superseded = True


def add_executor(record: GraphRecord, executor: Any) -> None:
    """Note an executor the backend installed for one of the record's inner graphs (held weakly)."""
    record.executors.append(weakref.ref(executor))


def _report(r: GraphRecord) -> GraphReport:
    launches: dict[str, int] = {}
    cuts, predicted, graphs, summaries = 0, None, False, []
    for ref in r.executors:
        ex = ref()
        if ex is None:
            continue
        program = ex.program
        placement = getattr(ex, "placement", None)
        devices = [getattr(d, "name", str(d)) for d in getattr(ex, "devices", ())] or [program.device]
        if placement is None:
            launches[devices[0]] = launches.get(devices[0], 0) + len(program.launches)
        else:
            for dev in placement.values():
                launches[devices[dev]] = launches.get(devices[dev], 0) + 1
        plan = getattr(ex, "plan", None)
        if plan is not None:
            summaries.append(plan.summary())
            cuts += len(plan.cut_edges)
            predicted = (predicted or 0.0) + plan.predicted_seconds
        elif placement is not None:
            dag = ex.dag.graph
            cuts += sum(1 for a, b in dag.edges if placement[a] != placement[b])
        graphs = getattr(ex, "cuda_graphs", False) and getattr(getattr(ex, "executor", None), "graph_mode", "whole")
    alive = sum(1 for ref in r.executors if ref() is not None)
    return GraphReport(r.compile_id or str(r.index), r.backend, r.reason, alive, launches, cuts,
                       predicted, r.costs, graphs or False, "\n\n".join(summaries) or None, r.launches_timed,
                       r.plan_source, min(r.from_cache, alive))


def _holds(record: GraphRecord, tensors: Any) -> bool:
    """Whether the graph was given one of ``tensors`` (the very object: ids of dead tensors are reused)."""
    for t in tensors:
        ref = record.tensors.get(id(t))
        if ref is not None and ref() is t:
            return True
    return False


def explain(compiled: Any = None) -> Explanation:
    """What tessera did with the graphs of ``compiled`` (what ``torch.compile(..., backend="tessera")`` returned),
    after it has run at least once: per graph, tessera or the Inductor fallback (with the reason), launches per
    device, cut edges, predicted step and where the costs came from.

    Args:
        compiled: a compiled module or function, or an object naming one as its ``tessera_compiled`` attribute (the
            generator of :func:`torch_tessera.hf.compile_for_generate`); ``None``: every graph tessera was given in
            this process.

    Returns:
        An :class:`Explanation` (iterable of :class:`GraphReport`; ``print`` shows one line per graph). Empty when
        nothing of ``compiled`` was compiled yet (graphs compile at the first call). Graphs Dynamo has dropped
        (after ``torch._dynamo.reset()``) are left out.
    """
    gc.collect()  # graphs Dynamo dropped are freed (reference cycles included) before we look
    with _lock:
        records = [r for r in _records if not r.dropped()]
    if compiled is not None:
        from torch_tessera.compat.dynamo import compiled_codes, compiled_tensors

        compiled = getattr(compiled, "tessera_compiled", compiled)

        mine, own = compiled_codes(compiled), compiled_tensors(compiled)
        records = [r for r in records if mine.intersection(r.codes) and (not own or _holds(r, own))]
    return Explanation(tuple(_report(r) for r in records))
