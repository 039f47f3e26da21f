"""What the backend reads of Dynamo's and AOTAutograd's state, in one place.

Checked on torch 2.13.0 (CPU) and written against torch 2.11 (the GPU machine's version): ``TracingContext.traced_code``
(the code objects Dynamo traced for the graph being compiled, the root frame first), ``gm.meta["dynamo_compile_id"]``,
``CompileContext.attempt`` (the attempt of a compile whose analysis Dynamo restarted), ``OptimizedModule._orig_mod``
and ``_torchdynamo_orig_callable`` on what ``torch.compile`` returns, and the free unbacked symbols of FX node values.
"""

from __future__ import annotations

from types import CodeType
from typing import Any, Sequence

import torch


def traced_code() -> tuple[CodeType, ...]:
    """Code objects Dynamo traced for the graph being compiled now (root frame first; empty outside Dynamo)."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    return tuple(getattr(ctx, "traced_code", None) or ()) if ctx is not None else ()


def compile_id(gm: torch.fx.GraphModule) -> str | None:
    """Dynamo's id of the graph (``"0/1"``: frame 0, its second compile), or ``None`` for a graph not from Dynamo."""
    cid = getattr(gm, "meta", {}).get("dynamo_compile_id")
    return None if cid is None else str(cid)


def compile_attempt() -> int:
    """Which attempt of the current compile this is: 0, then 1, 2, ... when Dynamo restarts its analysis of the frame
    ("[0/0_1]" in its logs; the backend is called again for the same compile id); 0 outside Dynamo."""
    from torch._guards import CompileContext

    ctx = CompileContext.try_get()
    return int(getattr(ctx, "attempt", 0) or 0) if ctx is not None else 0


def frame_compiles(gm: torch.fx.GraphModule) -> tuple[int, int] | None:
    """``(frame id, compiles of that frame so far)`` from Dynamo's compile id: ``"0/5"`` is frame 0's sixth compile,
    so 5 recompiles (Dynamo resets the counts on ``torch._dynamo.reset()``); ``None`` for a graph not from Dynamo."""
    cid = getattr(gm, "meta", {}).get("dynamo_compile_id")
    frame, count = getattr(cid, "frame_id", None), getattr(cid, "frame_compile_id", None)
    return None if frame is None or count is None else (int(frame), int(count) + 1)


def user_code(codes: Sequence[CodeType]) -> CodeType | None:
    """The first of ``codes`` that is not in torch's own files (the user's function Dynamo traced)."""
    import os

    root = os.path.dirname(torch.__file__)
    return next((c for c in codes if not c.co_filename.startswith(root)), codes[0] if codes else None)


def compiled_codes(compiled: Any) -> set[CodeType]:
    """Code objects of the functions behind what ``torch.compile`` returned: a compiled module's ``forward`` and
    those of its submodules, or a compiled function's code (empty for anything else)."""
    codes: set[CodeType] = set()
    mod = getattr(compiled, "_orig_mod", None)
    if isinstance(compiled, torch.nn.Module) and mod is None:
        mod = compiled
    if isinstance(mod, torch.nn.Module):
        for m in mod.modules():
            fn = getattr(type(m).forward, "__code__", None)
            if fn is not None:
                codes.add(fn)
    fn = getattr(compiled, "_torchdynamo_orig_callable", None)
    for f in (fn, compiled):
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


def compiled_tensors(compiled: Any) -> list[torch.Tensor]:
    """The parameters and buffers of a compiled module (empty for a compiled function)."""
    mod = getattr(compiled, "_orig_mod", compiled)
    if not isinstance(mod, torch.nn.Module):
        return []
    return [*mod.parameters(), *mod.buffers()]


def needs_autograd(example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will build a backward for this graph: grad mode on and a tensor input that requires grad
    (the rule ``aot_module_simplified`` applies)."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def dynamic_shape_reason(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why the graph's shapes are not static, or ``None`` when every shape is a plain int.

    Symbolic input sizes come from ``dynamic=None``/``True`` (Dynamo's automatic dynamic shapes from the second shape
    on); unbacked symbols from data-dependent ops (``torch.nonzero`` with
    ``torch._dynamo.config.capture_dynamic_output_shape_ops``).
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return "an input is a symbolic int (dynamic shapes); pass dynamic=False to torch.compile"
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in tuple(x.shape) + tuple(x.stride())):
            return f"an input has symbolic sizes {tuple(x.shape)} (dynamic shapes); pass dynamic=False to torch.compile"
    for node in gm.graph.nodes:
        val = node.meta.get("val", node.meta.get("example_value"))  # Dynamo's graphs carry "example_value"
        if node.meta.get("unbacked_bindings") or (val is not None and free_unbacked_symbols(val)):
            op = getattr(node.target, "__name__", node.target)
            return (f"{op} (node {node.name}) has a data-dependent output shape; keep such ops out of the compiled "
                    "region or leave torch._dynamo.config.capture_dynamic_output_shape_ops off")
    return None
