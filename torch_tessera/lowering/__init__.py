"""``lowering/``: FX graph -> TorchInductor -> :class:`~torch_tessera.lowering.program.KernelProgram`.

Entry function: :func:`lower`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Callable, Sequence

import torch

from torch_tessera.compat import torch_inductor as compat
from torch_tessera.errors import LoweringError, TesseraError
from torch_tessera.lowering.cache import (CodegenRecord, input_signature, load_codegen_record, load_warm_program,
                                         save_codegen_record, save_warm_program)
from torch_tessera.lowering.capture import CapturedGraph, capture_program, launch_writes
from torch_tessera.lowering.program import (  # noqa: F401
    Buffer,
    BufferKind,
    ExternLaunch,
    KernelProgram,
    KernelSource,
    ScalarArg,
    TensorArg,
    TritonLaunch,
)
from torch_tessera.lowering.serialize import ProgramFileError, dump_program, load_program, program_to_json

log = logging.getLogger(__name__)

__all__ = ["lower", "CapturedGraph", "KernelProgram", "ProgramFileError", "dump_program", "launch_writes",
           "load_program", "program_to_json"]


def _cpu_scalar(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dim() == 0


def graph_device_type(example_inputs: Sequence[Any]) -> str:
    """Device type (``"cpu"``/``"cuda"``) of a graph's tensor inputs (0-dim CPU tensors, which Inductor reads as
    scalars, do not count); raises if they mix device types."""
    types = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor) and not _cpu_scalar(x)}
    if not types:
        types = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if len(types) > 1:
        raise LoweringError(f"graph inputs live on several device types {sorted(types)}; tessera lowers one at a time")
    return types.pop() if types else "cpu"


def lower(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    on_captured: Callable[[CapturedGraph], Callable[[list], Any] | None],
    parameter_flags: Sequence[bool] | None = None,
) -> Callable:
    """Compile ``gm`` with Inductor and capture every inner graph as a kernel program.

    For each graph Inductor compiles (one for inference), ``on_captured(captured)`` is called; if it returns a callable,
    that callable (taking the list of graph inputs, returning the outputs) replaces Inductor's generated ``call()``.
    On CPU inputs, kernels are generated as Triton and run through Triton's interpreter.

    Args:
        gm: the FX graph from Dynamo (or ``torch.export``).
        example_inputs: its example inputs (real tensors, FakeTensors or ints).
        on_captured: called with each captured graph.
        parameter_flags: per input, whether it holds weights; default: inputs that are ``nn.Parameter``.

    Returns:
        A callable with the graph's calling convention (Inductor's AOTAutograd wrapper around our callables).

    Raises:
        LoweringError: Inductor could not lower the graph, or its output could not be captured.
    """
    device_type = graph_device_type(example_inputs)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    flags = list(parameter_flags) if parameter_flags is not None else [
        isinstance(x, torch.nn.Parameter) for x in example_inputs
    ]
    graphs = _InnerGraphs(on_captured, names, flags)
    try:
        with _interpreter_scope(device_type), compat.compile_context(device_type):
            return compat.compile_graph(gm, example_inputs, graphs.on_compiled, graphs.needs_codegen,
                                        graphs.on_cache_hit, graphs.events)
    except TesseraError:
        raise
    except Exception as e:  # noqa: BLE001 - the border with Inductor: any failure there is a lowering failure
        raise LoweringError(f"Inductor could not lower the graph: {type(e).__name__}: {e}") from e


class _InnerGraphs:
    """The callbacks :func:`compat.compile_graph <torch_tessera.compat.torch_inductor.compile_graph>` calls per inner
    graph of one :func:`lower`: capture it (with the codegen record of its generated module: recorded now, or saved
    earlier), save that record, and hand the captured graph to ``on_captured``.

    Three paths: codegen ran now (events recorded during codegen; the record is saved); an FX graph cache hit
    (``needs_codegen``: the saved record is reused, or codegen runs again); an AOTAutograd cache hit
    (``on_cache_hit``: no tracing and no ``inner_compile``). On the first two the captured program is saved too,
    keyed by the generated module, the inputs' signature, names, kinds and static inputs; a hit reuses that
    program (no recording run), else captures again from the saved codegen record when it was saved for the same
    inputs and static inputs, else declines (AOTAutograd traces, and the first path runs).
    """

    def __init__(self, on_captured: Callable[[CapturedGraph], Any], names: Sequence[str],
                 flags: Sequence[bool]) -> None:
        self.on_captured, self.names, self.flags = on_captured, list(names), list(flags)
        self.events: list[compat.CodegenEvent] = []  # filled by compat.record_codegen while codegen runs
        self.key: str | None = None  # codegen key of the current inner graph

    def needs_codegen(self, compiled: Any) -> bool:
        self.key = compat.codegen_key(compiled)
        if self.events or self.key is None:  # codegen ran now (events recorded), or nothing was generated
            return False
        record = self._matching_record(compiled, self.key)
        if isinstance(record, str):  # generated again; its record is then saved under this key
            return True
        self.events.extend(record.events)
        log.debug("FX graph cache hit: codegen record %s reused (%d kernel calls)", self.key[:16], len(record.events))
        return False

    def on_compiled(self, compiled: Any, fake_inputs: Sequence[Any], static_idxs: Sequence[int] = ()) -> None:
        if not hasattr(compiled, "current_callable"):
            # Inductor returns a plain function for a graph with nothing to launch (e.g. a no-op dtype cast): there
            # is no kernel program to capture, and nothing to place.
            log.info("graph has no kernels to capture; Inductor's callable runs it")
            self.events.clear()
            return
        key, inputs = self.key or compat.codegen_key(compiled), None
        if key is not None:  # saved with this graph's inputs, so that a later AOTAutograd cache hit can reuse it
            try:
                inputs = input_signature(fake_inputs)
            except TypeError:
                inputs = None
            save_codegen_record(key, CodegenRecord(tuple(self.events), inputs, tuple(static_idxs)))
        captured = self._capture(compiled, fake_inputs, static_idxs)
        if key is not None and inputs is not None:
            save_warm_program(self._warm_key(key, inputs, static_idxs), captured.program)
        self._install(compiled, captured)

    def on_cache_hit(self, compiled: Any, fake_inputs: Sequence[Any], key: str,
                     static_idxs: Sequence[int]) -> str | None:
        """An AOTAutograd cache hit: the program captured for it earlier, else captured now from the saved codegen
        record; or the reason neither can be had (AOTAutograd then traces)."""
        try:
            inputs = input_signature(fake_inputs)
        except TypeError:
            return "inputs without a static signature"
        program = load_warm_program(self._warm_key(key, inputs, static_idxs))
        kernels = compat.generated_kernel_objects(compiled) if program is not None else None
        if program is not None and kernels is not None and set(program.kernels) <= set(kernels):
            log.debug("AOTAutograd cache hit: captured program %s reused (%d launches)", key[:16],
                      len(program.launches))
            self._install(compiled, CapturedGraph(program, {k: kernels[k] for k in program.kernels}, from_cache=True))
            return None
        if program is not None:
            log.info("the captured program %s names kernels its cached graph lacks; capturing it again", key[:16])
        record = self._matching_record(compiled, key)
        if isinstance(record, str):
            return record
        if record.inputs != inputs or tuple(static_idxs) != record.static_input_idxs:
            log.info("the codegen record %s was saved for other inputs of the graph; tracing it again", key[:16])
            return "codegen record saved for other inputs"
        self.events[:] = record.events
        log.debug("AOTAutograd cache hit: codegen record %s reused (%d kernel calls)", key[:16], len(record.events))
        try:
            captured = self._capture(compiled, fake_inputs, static_idxs)
        except LoweringError as e:
            return f"capture failed: {e}"
        save_warm_program(self._warm_key(key, inputs, static_idxs), captured.program)
        captured.from_cache = True
        self._install(compiled, captured)
        return None

    def _matching_record(self, compiled: Any, key: str) -> CodegenRecord | str:
        """The record saved under ``key`` if it names the kernels of ``compiled``, else why not."""
        record = load_codegen_record(key)
        if record is None:
            return "no codegen record saved"
        names = compat.generated_kernel_names(compiled)
        if names is None or {e.name for e in record.events if e.kind == "triton"} != names:
            log.info("the codegen record %s does not name the kernels of the cached graph; generating it again",
                     key[:16])
            return "codegen record names other kernels"
        return record

    def _warm_key(self, key: str, inputs: tuple, static_idxs: Sequence[int]) -> str:
        """What a captured program depends on: the generated module, its inputs, their names and kinds."""
        return json.dumps([key, inputs, self.names, self.flags, sorted(static_idxs)])

    def _capture(self, compiled: Any, fake_inputs: Sequence[Any], static_idxs: Sequence[int]) -> CapturedGraph:
        """Record the program by running the generated code on FakeTensors (with the current codegen events)."""
        captured = capture_program(compiled, fake_inputs, list(self.events), self.names, self.flags, static_idxs)
        self.events.clear()
        self.key = None
        return captured

    def _install(self, compiled: Any, captured: CapturedGraph) -> None:
        """Hand ``captured`` to ``on_captured``; its runner, if any, replaces the generated ``call()``."""
        runner = self.on_captured(captured)
        if runner is not None:
            compiled.current_callable = runner


def _interpreter_scope(device_type: str) -> contextlib.AbstractContextManager:
    """On CPU, Triton's interpreter for the duration of lowering (restored after: no process state leaks)."""
    if device_type != "cpu":
        return contextlib.nullcontext()
    from torch_tessera.compat.triton import cpu_interpreter

    return cpu_interpreter()
