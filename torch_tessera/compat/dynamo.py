"""What the backend reads of Dynamo's and AOTAutograd's state, in one place.

Checked on torch 2.13.0 (CPU) and written against torch 2.11 (the GPU machine's version): ``TracingContext.traced_code``
(the code objects Dynamo traced for the graph being compiled, the root frame first), ``gm.meta["dynamo_compile_id"]``,
``CompileContext.attempt`` (the attempt of a compile whose analysis Dynamo restarted), ``OptimizedModule._orig_mod``
and ``_torchdynamo_orig_callable`` on what ``torch.compile`` returns, and the free unbacked symbols of FX node values.

:func:`as_user_error` relies on Dynamo re-raising a backend's exception that subclasses
``torch._dynamo.exc.ShortenTraceback`` instead of wrapping it in ``BackendCompilerFailed`` (the ``except (...,
ShortenTraceback)`` around the compiler call in ``output_graph.py``, ``ShortenTraceback`` in the re-raised tuple of
``convert_frame.py``, and ``raise e.remove_dynamo_frames() from None`` in ``eval_frame.py``). Checked on torch 2.13.0
(installed, run) and read in several pytorch/pytorch snapshots of those files from before and after 2.11 (not a
tagged 2.11 checkout), which all carry the three clauses; never calls ``ShortenTraceback.__init__``. Where the class is missing or cannot be combined, the error stays as it is (Dynamo wraps
it, as before).
"""

from __future__ import annotations

import functools
from types import CodeType, FrameType
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


def compiled_subject(codes: Sequence[CodeType]) -> str | None:
    """What the user compiled, as a person names it, for the graph Dynamo is compiling now: ``"MyNet (torch.nn.Module,
    forward at f.py:12)"`` for a module, ``"Outer.step (f.py:30)"`` for a function (its qualified name); ``None`` when
    neither the frame nor ``codes`` tell (outside Dynamo).

    Reads the root frame Dynamo is translating (``InstructionTranslator.current_tx()``, its ``f_code`` and
    ``f_locals``; checked on torch 2.13.0): a bound ``self`` that is a module names the module's class; a wrapper's
    frame (``contextlib``'s ``inner``, ``functools.wraps`` decorators, ``transformers``' ``wrapped_func``, Dynamo's
    ``wrap_inline``) is followed to the function it holds whose code Dynamo also traced. Without the frame, the first
    of ``codes`` outside torch's files.

    Args:
        codes: the code objects Dynamo traced for the graph (:func:`traced_code`).
    """
    frame = _root_frame()
    if frame is not None:
        code, local = frame
        found = _unwrap(code, local, set(codes), depth=0)
        if found is not None:
            return found
    root = user_code(codes)
    return None if root is None else f"{_qualname(root)} ({_where(root)})"


def recompile_reason() -> str | None:
    """The first guard that failed for the compile Dynamo is running now (``"tensor 'x' size mismatch at index 0.
    expected 4, actual 5"``, without Dynamo's ``"0/3: "`` prefix), or ``None`` for a first compile, outside Dynamo,
    or where this torch keeps no reason (read from the compile's metrics context, ``"recompile_reason"``, which
    ``convert_frame._compile`` sets on torch 2.13.0 and in the pytorch snapshots read from before 2.11)."""
    try:
        from torch._dynamo.utils import get_metrics_context

        metrics = get_metrics_context()
        reason = getattr(metrics, "_metrics", {}).get("recompile_reason") if metrics.in_progress() else None
    except Exception:  # another torch's layout: the warning goes without the guard
        return None
    if not isinstance(reason, str) or not reason or reason.startswith("Unable to find"):
        return None
    head, sep, rest = reason.partition(": ")
    return rest.strip() if sep and head.replace("/", "").replace("_", "").isdigit() else reason.strip()


def _root_frame() -> tuple[CodeType, dict] | None:
    """``(code, locals)`` of the frame Dynamo is translating now, or ``None`` outside Dynamo."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
    except Exception:  # not translating, or another torch's layout
        return None
    while getattr(tx, "parent", None) is not None:
        tx = tx.parent
    code, local = getattr(tx, "f_code", None), getattr(tx, "f_locals", None)
    return (code, local) if isinstance(code, CodeType) and isinstance(local, dict) else None


def _unwrap(code: CodeType, local: dict, traced: set[CodeType], depth: int) -> str | None:
    """The subject of a frame of ``code`` with locals ``local``: the function a wrapper holds (a local whose code
    Dynamo also traced, followed through ``__wrapped__``), else ``code`` itself; named by the module bound as ``self``
    (or as a wrapper's first positional argument) when there is one."""
    args = local.get("args")
    bound = [local.get("self"), *(args[:1] if isinstance(args, tuple) else ())]
    module = next((m for m in bound if isinstance(m, torch.nn.Module)), None)
    if depth < 4:
        for value in list(local.values()):
            fn = _attr(value, "__func__") or value
            inner = _attr(fn, "__code__")
            if not isinstance(inner, CodeType) or inner is code or inner not in traced:
                continue
            owner = _attr(value, "__self__")
            owner = owner if isinstance(owner, torch.nn.Module) else module
            target = _unwrapped(fn)
            target_code = _attr(target, "__code__")
            target_code = target_code if isinstance(target_code, CodeType) else inner
            if owner is not None:
                return _module_subject(owner, target_code)
            return f"{_attr(target, '__qualname__') or _qualname(target_code)} ({_where(target_code)})"
    if module is not None:
        return _module_subject(module, code)
    return f"{_qualname(code)} ({_where(code)})"


def _module_subject(module: torch.nn.Module, code: CodeType) -> str:
    return f"{type(module).__qualname__} (torch.nn.Module, {code.co_name} at {_where(code)})"


def _attr(value: Any, name: str) -> Any:
    """``getattr(value, name, None)`` that survives objects whose attribute lookup raises something else."""
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _unwrapped(fn: Any) -> Any:
    """``fn`` with its ``functools.wraps`` wrappers removed (``inspect.unwrap``), or ``fn`` when that fails."""
    import inspect

    try:
        return inspect.unwrap(fn)
    except (ValueError, TypeError):
        return fn


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", None) or code.co_name  # co_qualname: Python 3.11+


def _where(code: CodeType) -> str:
    return f"{code.co_filename}:{code.co_firstlineno}"


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


def as_user_error(error: Exception, border: FrameType | None) -> Exception:
    """``error`` as an exception Dynamo lets reach the user as it is, rather than wrapped in ``BackendCompilerFailed``.

    The result is an instance of a subclass of ``type(error)`` (same name, module, message, attributes, cause and
    traceback) that also derives from Dynamo's ``ShortenTraceback``, so ``except type(error)`` catches it. When Dynamo
    re-raises it, its traceback starts at ``border`` (the frame of the backend's entry function) and its message is
    the one raised, without the notes Dynamo appends (unless ``TORCHDYNAMO_VERBOSE=1``).

    Args:
        error: an error the user caused (a bad option, a model that does not fit).
        border: the frame that raises the result; Dynamo's frames above it are dropped from the traceback.

    Returns:
        The twin of ``error``, or ``error`` itself when this torch has no usable ``ShortenTraceback``.
    """
    cls = _passthrough_class(type(error), _shorten_traceback())
    if cls is None:
        return error
    try:
        twin = cls.__new__(cls, *error.args)
    except TypeError:  # a ShortenTraceback with another instance layout
        return error
    twin.__dict__.update(error.__dict__)
    twin._tessera_args = error.args
    twin.first_useful_frame = border
    twin.__cause__, twin.__suppress_context__ = error.__cause__, error.__suppress_context__
    return twin.with_traceback(error.__traceback__)


def _shorten_traceback() -> type | None:
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:
        return None
    return ShortenTraceback if isinstance(ShortenTraceback, type) and issubclass(ShortenTraceback, Exception) else None


@functools.lru_cache(maxsize=None)
def _passthrough_class(cls: type, shorten: type | None) -> type | None:
    """A subclass of ``cls`` and ``shorten`` named like ``cls``; ``None`` when there is no ``shorten`` or the two
    cannot be combined (a layout or MRO conflict)."""
    if shorten is None or issubclass(cls, shorten):
        return None
    body = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            # what ShortenTraceback's and TorchDynamoException's __init__ would set, which is never called
            "first_useful_frame": None, "_torch_dynamo_tracer_output": None, "frame_exec_strategy": None,
            "remove_dynamo_frames": _remove_dynamo_frames, "__reduce__": _reduce}
    try:
        return type(cls.__name__, (cls, shorten), body)
    except TypeError:
        return None


def _remove_dynamo_frames(self: Exception) -> Exception:
    """Dynamo's hook before it re-raises: the message as raised, the traceback from the border frame on (the whole
    traceback when the frame is not in it, or with ``TORCHDYNAMO_VERBOSE=1``)."""
    from torch._dynamo import config

    if getattr(config, "verbose", False):
        return self
    self.args = getattr(self, "_tessera_args", self.args)
    tb = self.__traceback__
    while tb is not None and tb.tb_frame is not getattr(self, "first_useful_frame", None):
        tb = tb.tb_next
    return self if tb is None else self.with_traceback(tb)


def _reduce(self: Exception) -> tuple:
    """Pickle as the plain class (the twin's class is made at run time and cannot be found by name)."""
    base = type(self).__mro__[1]
    state = {k: v for k, v in self.__dict__.items()
             if k not in ("first_useful_frame", "_torch_dynamo_tracer_output", "frame_exec_strategy")}
    return (_plain_error, (base, getattr(self, "_tessera_args", self.args), state))


def _plain_error(cls: type, args: tuple, state: dict) -> Exception:
    error = cls.__new__(cls, *args)
    error.__dict__.update({k: v for k, v in state.items() if k != "_tessera_args"})
    return error
