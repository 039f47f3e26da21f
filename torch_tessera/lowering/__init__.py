"""``lowering/``: FX graph -> TorchInductor -> :class:`~torch_tessera.lowering.program.KernelProgram`.

Entry function: :func:`lower`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Sequence

import torch

from torch_tessera.compat import torch_inductor as compat
from torch_tessera.errors import LoweringError, TesseraError
from torch_tessera.lowering.cache import load_codegen_record, save_codegen_record
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
    events: list[compat.CodegenEvent] = []
    # the current inner graph: the key of its generated code, and whether its events came from a saved record
    current: dict[str, Any] = {"key": None, "loaded": False}

    def needs_codegen(compiled: Any) -> bool:
        current["key"], current["loaded"] = compat.codegen_key(compiled), False
        if events or current["key"] is None:  # codegen ran now (events recorded), or nothing was generated
            return False
        record = load_codegen_record(current["key"])
        if record is None:  # generated again; its record is then saved under this key
            return True
        names = compat.generated_kernel_names(compiled)
        if names is None or {e.name for e in record if e.kind == "triton"} != names:
            log.info("the codegen record %s does not name the kernels of the cached graph; generating it again",
                     current["key"][:16])
            return True
        events.extend(record)
        current["loaded"] = True
        log.debug("FX graph cache hit: codegen record %s reused (%d kernel calls)", current["key"][:16], len(record))
        return False

    def on_compiled(compiled: Any, fake_inputs: Sequence[Any], static_idxs: Sequence[int] = ()) -> None:
        if not hasattr(compiled, "current_callable"):
            # Inductor returns a plain function for a graph with nothing to launch (e.g. a no-op dtype cast): there
            # is no kernel program to capture, and nothing to place.
            log.info("graph has no kernels to capture; Inductor's callable runs it")
            events.clear()
            return
        if not current["loaded"]:
            key = current["key"] or compat.codegen_key(compiled)
            if key is not None:
                save_codegen_record(key, events)
        captured = capture_program(compiled, fake_inputs, list(events), names, flags, static_idxs)
        events.clear()
        runner = on_captured(captured)
        if runner is not None:
            compiled.current_callable = runner

    try:
        with _interpreter_scope(device_type), compat.compile_context(device_type), compat.record_codegen(events):
            return compat.compile_graph(gm, example_inputs, on_compiled, needs_codegen)
    except TesseraError:
        raise
    except Exception as e:  # noqa: BLE001 - the border with Inductor: any failure there is a lowering failure
        raise LoweringError(f"Inductor could not lower the graph: {type(e).__name__}: {e}") from e


def _interpreter_scope(device_type: str) -> contextlib.AbstractContextManager:
    """On CPU, Triton's interpreter for the duration of lowering (restored after: no process state leaks)."""
    if device_type != "cpu":
        return contextlib.nullcontext()
    from torch_tessera.compat.triton import cpu_interpreter

    return cpu_interpreter()
