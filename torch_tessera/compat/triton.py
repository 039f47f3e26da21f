"""Everything torch_tessera does to Triton's internals, in one place.

Checked on triton 3.7.0 (with torch 2.13.0, CPU) and written against triton 3.6.0 (the GPU machine's version).

Two things live here:

* :func:`cpu_interpreter` makes Triton usable on a machine without a GPU, for its duration: ``TRITON_INTERPRET=1`` (kernels
  run in Triton's numpy interpreter) and installs a driver object that reports a CUDA sm_90 target, so that Inductor's
  ``cpu_backend="triton"`` generates the same Triton kernels for CPU tensors that it generates for an H100/H200.
  Triton has no public switch for this: ``triton.runtime.driver.set_active`` with a ``DriverBase`` subclass is the
  supported extension point for new backends, and is what we use.
* :func:`interpreter_libdevice` (used around every interpreted launch) supplies numpy implementations of the ``libdevice`` functions Inductor's kernels call
  (``rsqrt``, ``erf``, ``tanh``, ``pow``...). In the interpreter those names are stubs that return ``None``, because
  Triton swaps in the real NVIDIA libdevice only when compiling. We patch the stub module only for the duration of an
  interpreted launch, so that compiling PTX (``torch_tessera.ptx``) still sees the real stubs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from typing import Any, Callable, Iterator

import numpy as np

log = logging.getLogger(__name__)

#: The target the CPU interpreter driver reports. sm_90 is the H100/H200 architecture our GPUs have.
INTERPRETER_TARGET_ARCH = 90


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the numpy interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_env_lock = threading.RLock()
_env_depth = 0
_env_saved: list[tuple[str | None, Any]] = []
_cpu_driver: list[Any] = []
_interpreter_entered: list[bool] = []  # non-empty once cpu_interpreter was entered in this process


def interpreter_was_used() -> bool:
    """Whether this process has entered :func:`cpu_interpreter`: ``@triton.jit`` helpers that Triton or Inductor
    imported inside it stay interpreter functions after it closes, so a kernel calling them cannot be compiled in
    this process any more (compile it in a fresh one)."""
    return bool(_interpreter_entered)


@contextlib.contextmanager
def cpu_interpreter() -> Iterator[None]:
    """Within this context Triton kernels run on CPU tensors through Triton's interpreter, with a CUDA sm_90 target
    reported: ``TRITON_INTERPRET=1`` is set and our CPU driver is Triton's active driver. On leaving the outermost
    context both are restored as they were (``TRITON_INTERPRET`` unset again if it was unset), so the caller's own
    Triton kernels are not turned into interpreted ones.

    Re-entrant and thread-safe (a count of the contexts open). Lowering enters it while Inductor loads kernel modules
    (``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is decorated); every interpreted launch enters it through
    :func:`interpreter_libdevice`.
    """
    global _env_depth
    from triton.runtime import driver

    with _env_lock:
        if _env_depth == 0:
            _interpreter_entered[:] = [True]
            _env_saved.append((os.environ.get("TRITON_INTERPRET"), getattr(driver, "_active", None)))
            os.environ["TRITON_INTERPRET"] = "1"
            if not _cpu_driver:
                _cpu_driver.append(_make_cpu_driver()())
            driver.set_active(_cpu_driver[0])
            # Inductor's CPU kernel modules call triton_helpers.set_driver_to_cpu(), which warns when no triton-cpu
            # backend is installed; our driver is that backend as far as Inductor is concerned.
            warnings.filterwarnings("ignore", message="Could not find an active CPU backend")
        _env_depth += 1
    try:
        yield
    finally:
        with _env_lock:
            _env_depth -= 1
            if _env_depth == 0:
                env, active = _env_saved.pop()
                if env is None:
                    os.environ.pop("TRITON_INTERPRET", None)
                else:
                    os.environ["TRITON_INTERPRET"] = env
                driver._active = active  # None: Triton picks its default driver again when next asked


def _make_cpu_driver() -> type:
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CPUInterpreterDriver(DriverBase):
        """A Triton driver for CPU tensors: kernels run in the interpreter, compilation targets CUDA sm_90."""

        @classmethod
        def is_active(cls) -> bool:
            return False  # never auto-selected; installed explicitly by cpu_interpreter()

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", INTERPRETER_TARGET_ARCH, 32)

        def get_active_torch_device(self) -> Any:
            return torch.device("cpu")

        def get_benchmarker(self) -> Callable:
            from triton.testing import do_bench

            return do_bench

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    return CPUInterpreterDriver


# ----------------------------------------------------------------------------------------------------------------------
# libdevice for the interpreter


def _np_unary(fn: Callable[[np.ndarray], np.ndarray], out: str | None = None) -> Callable:
    return lambda *a: _apply(fn, a, out)


def _np_binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], out: str | None = None) -> Callable:
    return lambda *a: _apply(fn, a, out)


def _apply(fn: Callable, args: tuple, out: str | None) -> Any:
    """Apply a numpy function to interpreter tensors; ``out`` is None (same dtype), "bool" or an int dtype name."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    tensors = [a for a in args if isinstance(a, tl.core.tensor)]
    if not tensors:
        raise TypeError("libdevice stand-in called without a tensor argument")
    ref = max(tensors, key=lambda t: t.handle.data.size)
    ref_np = ref.handle.data.dtype
    arrays = []
    for a in args:
        if isinstance(a, tl.core.tensor):
            arrays.append(a.handle.data)
        else:
            value = getattr(a, "value", a)  # tl.constexpr
            arrays.append(np.asarray(value, dtype=ref_np))
    with np.errstate(all="ignore"):
        result = np.asarray(fn(*arrays))
    if out is None:
        scalar = ref.dtype
        result = result.astype(ref_np, copy=False)
    elif out == "bool":
        scalar = tl.int1
        result = result.astype(np.bool_)
    else:
        scalar = getattr(tl, out)
        result = result.astype(getattr(np, out))
    shape = list(result.shape)
    ttype = tl.block_type(scalar, shape) if ref.type.is_block() else scalar
    return tl.core.tensor(TensorHandle(result, scalar), ttype)


def _libdevice_table() -> dict[str, Callable]:
    from scipy import special

    def nextafter(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.nextafter(x, y.astype(x.dtype))

    def ilogb(x: np.ndarray) -> np.ndarray:
        return np.where(x == 0, np.iinfo(np.int32).min, np.floor(np.log2(np.abs(x))))

    table = {
        "rsqrt": _np_unary(lambda x: 1.0 / np.sqrt(x)),
        "sqrt": _np_unary(np.sqrt),
        "erf": _np_unary(special.erf),
        "erfc": _np_unary(special.erfc),
        "erfinv": _np_unary(special.erfinv),
        "lgamma": _np_unary(special.gammaln),
        "tanh": _np_unary(np.tanh),
        "fast_tanhf": _np_unary(np.tanh),
        "tan": _np_unary(np.tan),
        "sinh": _np_unary(np.sinh),
        "cosh": _np_unary(np.cosh),
        "sin": _np_unary(np.sin),
        "cos": _np_unary(np.cos),
        "asin": _np_unary(np.arcsin),
        "acos": _np_unary(np.arccos),
        "atan": _np_unary(np.arctan),
        "asinh": _np_unary(np.arcsinh),
        "acosh": _np_unary(np.arccosh),
        "atanh": _np_unary(np.arctanh),
        "exp": _np_unary(np.exp),
        "exp2": _np_unary(np.exp2),
        "expm1": _np_unary(np.expm1),
        "log": _np_unary(np.log),
        "log2": _np_unary(np.log2),
        "log10": _np_unary(np.log10),
        "log1p": _np_unary(np.log1p),
        "floor": _np_unary(np.floor),
        "ceil": _np_unary(np.ceil),
        "trunc": _np_unary(np.trunc),
        "nearbyint": _np_unary(np.rint),
        "rint": _np_unary(np.rint),
        "round": _np_unary(lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5)),
        "abs": _np_unary(np.abs),
        "isnan": _np_unary(np.isnan, "bool"),
        "isinf": _np_unary(np.isinf, "bool"),
        "isfinited": _np_unary(np.isfinite, "bool"),
        "finitef": _np_unary(np.isfinite, "bool"),
        "signbit": _np_unary(np.signbit, "bool"),
        "llrint": _np_unary(np.rint, "int64"),
        "ilogb": _np_unary(ilogb, "int32"),
        "pow": _np_binary(np.power),
        "atan2": _np_binary(np.arctan2),
        "hypot": _np_binary(np.hypot),
        "fmod": _np_binary(np.fmod),
        "copysign": _np_binary(np.copysign),
        "nextafter": _np_binary(nextafter),
        "ldexp": _np_binary(lambda x, e: np.ldexp(x, e.astype(np.int32))),
        "fmax": _np_binary(np.fmax),
        "fmin": _np_binary(np.fmin),
        "div_rn": _np_binary(np.divide),
        "mul_rn": _np_binary(np.multiply),
        "add_rn": _np_binary(np.add),
    }
    return table


_patch_lock = threading.RLock()
_patch_depth = 0
_saved: dict[str, Any] = {}
_saved_jit_call: list[Callable] = []
_saved_options: list[Any] = []  # interpreter options overflow_checks_off replaced, restored at the outermost exit
_interpreted: dict[int, Any] = {}
_lang_scopes: list[Any] = []
_env_scopes: list[Any] = []


def _patch_languages() -> Any:
    """Patch ``triton.language`` *and* ``triton.language.core`` for the interpreter, once for a whole launch.

    The interpreter patches the modules a kernel's globals name, and patches again (never restoring) on every
    device-function call, which dominates interpreted run time. Patching both modules here, in a scope that encloses
    the interpreter's own, lets device functions (Inductor's ``triton_helpers``, ``triton.language.standard``) run
    without re-patching; the scope is restored when the launch ends.
    """
    import triton.language as tl
    from triton.language import core as tl_core
    from triton.runtime.interpreter import _patch_lang

    namespace = {"tl": tl, "tl_core": tl_core}
    exec("def _probe():\n    pass", namespace)  # noqa: S102 - a function whose globals name both modules
    return _patch_lang(namespace["_probe"])


def _run_rewritten(fn: Any, args: tuple, kwargs: dict) -> Any:
    """Call an interpreter-rewritten device function, wrapping errors as ``InterpretedFunction.__call__`` does."""
    from triton.runtime.interpreter import InterpreterError

    try:
        return fn(*args, **kwargs)
    except InterpreterError:
        raise
    except Exception as e:  # noqa: BLE001 - same wrapping as InterpretedFunction.__call__
        raise InterpreterError(repr(e)) from e


def _fast_interpreted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``InterpretedFunction.__call__`` (a device-function call) without re-patching the language each call."""
    return _run_rewritten(self.rewrite(), args, kwargs)


def _interpreted_device_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``JITFunction.__call__`` inside an interpreted kernel: run the device function in the interpreter.

    The enclosing launch has already patched ``triton.language`` for the interpreter (the device function's globals
    hold the same module), so we call the rewritten function directly; ``InterpretedFunction.__call__`` would patch
    the language again on every call (most of the interpreter's time) and never restore it.
    """
    from triton.runtime.interpreter import InterpretedFunction

    fn = _interpreted.get(id(self))
    if fn is None:
        fn = _interpreted[id(self)] = InterpretedFunction(self.fn).rewrite()
    return _run_rewritten(fn, args, kwargs)


def overflow_checks_off() -> Any:
    """Turn off the Triton interpreter's integer-overflow sanitizer where its checks can never fire; return the
    options to restore (:func:`restore_overflow_checks`), or None when nothing was changed.

    With ``sanitize_overflow`` on, every int32 add/sub/mul an interpreted kernel does is redone in int64, compared with
    the int32 range and handed to ``device_assert``, which returns at once unless ``debug`` is set (triton 3.7
    ``language/semantic.py``: ``binary_op_sanitize_overflow_impl``, ``device_assert``). The interpreter's ``debug``
    is False unless a user sets it, so that work is discarded: about 45 % of the interpreter's time on a CPU bench run
    (docs/results/2026-12-02-s14-citime/NOTES.md). Nothing is changed when ``debug`` is on (then the check can fire)
    or when the interpreter's options are not where triton 3.7 keeps them.
    """
    import dataclasses

    try:
        from triton.runtime import interpreter
    except ImportError:
        return None
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or getattr(options, "debug", True) or \
            not getattr(options, "sanitize_overflow", False):
        return None
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return options


def restore_overflow_checks(saved: Any) -> None:
    """Put back the interpreter options :func:`overflow_checks_off` replaced (``saved``; None: nothing)."""
    if saved is not None:
        from triton.runtime import interpreter

        interpreter.interpreter_builder.options = saved


@contextlib.contextmanager
def interpreter_libdevice() -> Iterator[None]:
    """Within this context, ``triton.language.extra.libdevice`` functions compute with numpy (interpreter only), and
    :func:`cpu_interpreter` holds (``TRITON_INTERPRET=1``, our CPU driver).

    Re-entrant. Outside it the module is untouched, so PTX compilation still resolves the real libdevice. Within it the
    interpreter's overflow sanitizer, whose checks cannot fire while ``debug`` is off, is off too
    (:func:`overflow_checks_off`), and restored after.
    """
    global _patch_depth
    import triton.language.extra.libdevice as libdevice_module

    from triton.runtime.jit import JITFunction

    with _patch_lock:
        if _patch_depth == 0:
            _env_scopes.append(cpu_interpreter())
            _env_scopes[-1].__enter__()
            for name, fn in _libdevice_table().items():
                _saved[name] = getattr(libdevice_module, name, None)
                setattr(libdevice_module, name, fn)
            from triton.runtime.interpreter import InterpretedFunction

            _lang_scopes.append(_patch_languages())
            _saved_jit_call.append(JITFunction.__call__)
            _saved_jit_call.append(InterpretedFunction.__call__)
            JITFunction.__call__ = _interpreted_device_call
            InterpretedFunction.__call__ = _fast_interpreted_call
            _saved_options.append(overflow_checks_off())
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                for name, fn in _saved.items():
                    if fn is None:
                        delattr(libdevice_module, name)
                    else:
                        setattr(libdevice_module, name, fn)
                _saved.clear()
                from triton.runtime.interpreter import InterpretedFunction

                InterpretedFunction.__call__ = _saved_jit_call.pop()
                JITFunction.__call__ = _saved_jit_call.pop()
                restore_overflow_checks(_saved_options.pop())
                _lang_scopes.pop().restore()
                _env_scopes.pop().__exit__(None, None, None)


__all__ = ["cpu_interpreter", "interpreter_libdevice", "interpreter_enabled", "INTERPRETER_TARGET_ARCH"]
