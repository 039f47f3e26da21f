"""Everything in ``ptx/`` that touches Triton or Inductor internals.

Checked on triton 3.7.0 with torch 2.13.0 (this machine) and written against triton 3.6.0 with torch 2.11.0 (the GPU
machines): ``triton.compiler.ASTSource(fn, signature, constexprs, attrs)`` with constexprs keyed by parameter name,
``triton.backends.compiler.GPUTarget``, ``triton.runtime.jit.JITFunction``, the ``TRITON_DISABLE_LINE_INFO`` and
``TRITON_INTERPRET`` environment variables. In both versions the PTX ``.entry`` takes the kernel's non-constexpr,
non-constant parameters in order, followed by Triton's scratch pointers (global scratch, profile scratch).
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
from typing import Any, Iterator, Mapping

#: Options of ``triton.compile`` that a config may carry; every other config key is a constexpr.
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def interpreting() -> bool:
    """Whether ``@triton.jit`` currently yields interpreter functions (``TRITON_INTERPRET=1``): such functions cannot
    be compiled, so compilation must happen in a subprocess without the variable."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _strip_module(source: str, kernel: str) -> str:
    """The module Inductor wrote, minus what needs a driver: the autotuner decorator and ``set_driver_to_cpu()``."""
    tree = ast.parse(source)
    body = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and "set_driver_to_" in ast.unparse(node):
            continue
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = [d for d in node.decorator_list if ast.unparse(d) in ("triton.jit", "jit")]
        body.append(node)
    tree.body = body
    return ast.unparse(tree)


def triton_meta_attrs(source: str) -> dict:
    """The ``triton_meta['configs'][0]`` parameter attributes (``tt.divisibility``) Inductor wrote into the module's
    decorator, or ``{}`` when the source has none (a hand-written kernel)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "triton_meta" and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and key.value == "configs":
                    try:
                        configs = ast.literal_eval(value)
                    except ValueError:
                        return {}
                    return dict(configs[0]) if configs else {}
    return {}


def load_jit_function(source: str, kernel: str) -> Any:
    """Execute a kernel module in a fresh namespace and return its ``JITFunction`` named ``kernel``.

    Raises:
        KeyError: the module defines no function of that name.
    """
    from triton.runtime.jit import JITFunction

    text = _strip_module(source, kernel)
    filename = f"<tessera-kernel {kernel}>"
    # JITFunction reads its source through inspect.getsource, which consults linecache for non-file names.
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"tessera_kernel_{kernel}", "__file__": filename}
    exec(compile(text, filename, "exec"), namespace)
    fn = namespace[kernel]
    if not isinstance(fn, JITFunction):
        fn = JITFunction(getattr(fn, "fn", fn))
    return fn


def compile_to_ptx(
    source: str,
    kernel: str,
    signature: Mapping[str, str],
    constants: Mapping[str, Any],
    config: Mapping[str, Any],
    capability: int,
) -> str:
    """Compile one kernel to PTX for ``sm_<capability>`` in this process (needs a non-interpreting Triton).

    Args:
        source: the kernel module's Python source.
        kernel: the ``@triton.jit`` function's name.
        signature: parameter name -> Triton type (``*fp32``, ``i32``, ``constexpr``).
        constants: parameters specialised to constants (Inductor's ``triton_meta['constants']``).
        config: block sizes (constexprs) and :data:`COMPILE_OPTIONS`.
        capability: compute capability, e.g. 80 or 90.

    Returns:
        The PTX text, without line info.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    with _env(TRITON_DISABLE_LINE_INFO="1"):
        fn = load_jit_function(source, kernel)
        constexprs = dict(constants)
        constexprs.update({k: v for k, v in config.items() if k in signature})
        options = {k: config[k] for k in COMPILE_OPTIONS if k in config}
        options.update(debug=False, sanitize_overflow=False)
        src = triton.compiler.ASTSource(fn, dict(signature), constexprs, triton_meta_attrs(source))
        compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)
        return compiled.asm["ptx"]


def triton_version() -> str:
    import triton

    return triton.__version__
