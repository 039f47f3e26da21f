"""Everything torch_tessera does to TorchInductor's internals, in one place.

Checked on torch 2.13.0 (CPU, this machine's CI version) and torch 2.11.0 (the GPU machine's version).

What we rely on, and why:

* ``compile_fx(gm, inputs, inner_compile=...)``: the documented hook that receives the post-AOTAutograd graph; we call
  Inductor's own ``compile_fx_inner`` inside it and then capture the result as a kernel program.
* ``CompiledFxGraph.current_callable``: the generated ``call(args)`` function. We run it once on FakeTensors to *record*
  the launches it makes (nothing executes), then replace it with our executor, leaving AOTAutograd's runtime wrappers
  (input-mutation epilogues, output aliasing) around us untouched.
* The generated module's globals ``empty_strided_<device>`` and ``reinterpret_tensor`` are C fast paths that bypass
  FakeTensorMode; during recording we swap them for ``torch.empty_strided`` / ``torch.as_strided``, and
  ``assert_alignment`` (CUDA wrappers; it reads data pointers) for a no-op.
* ``CachingAutotuner.run``: every Triton launch goes through it; during recording we swap it for a recorder.
* ``CachingAutotuner.configs`` / ``.launchers`` (the candidates before / after compiling): :func:`pin_config` keeps
  one of them, so that every device launches a kernel with the configuration its first device settled on.
* Provenance: ``PythonWrapperCodegen.generate_kernel_call`` and ``Scheduler.codegen_extern_call`` are wrapped during
  codegen to note which FX nodes (and so which ATen ops and ``nn.Module`` paths) each launch computes.
* Caches: Inductor's FX graph cache and the AOTAutograd cache stay as the user set them (both on by default).
  An FX graph cache hit returns the generated module without running codegen, so the provenance above is not
  recorded; the caller then supplies the record it saved for that module (:func:`codegen_key`) or asks for codegen
  again with the FX graph cache off (``needs_codegen``). An AOTAutograd cache hit skips tracing and
  ``inner_compile`` altogether: :func:`compile_graph` hooks the point of the hit path where the cached forward
  (``FxGraphCacheLoadable.post_compile``, loaded through its FX graph cache key) is ready, before AOTAutograd wraps
  it in its runtime wrappers, and hands it to the caller (``on_cache_hit``), who installs its executor as on a miss
  or declines; a declined hit is a cache bypass (torch then traces and calls ``inner_compile``). The bundled form of
  the AOTAutograd cache (``bundled_autograd_cache``, off by default) is turned off while we compile, and a compile
  in which no inner graph reached us is done again with the AOTAutograd cache off (:func:`compile_graph`), so a hit
  path we do not know can cost time, never run a graph without our executor. Run on torch 2.13.0; read, not yet
  run, in an older release's source with the same names (``FxGraphCacheLoadable`` in
  ``torch._functorch._aot_autograd.aot_autograd_result``: ``load(example_inputs)`` keeps the inputs as
  ``example_inputs``; ``post_compile(result, fx_config)``; ``fx_graph_cache_info``; ``CompiledFxGraph.fx_kwargs``
  with ``static_input_idxs``). On a torch without that class the AOTAutograd cache stays off while we compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CodegenEvent:
    """One kernel call Inductor generated, in codegen order.

    Attributes:
        kind: ``"triton"`` or ``"extern"``.
        name: kernel name (Triton) or Python kernel name (extern, e.g. ``extern_kernels.mm``).
        aten_ops: targets of the FX nodes the call computes.
        fx_nodes: names of those FX nodes.
        module_paths: deepest ``nn.Module`` path of each of those nodes.
    """

    kind: str
    name: str
    aten_ops: tuple[str, ...]
    fx_nodes: tuple[str, ...]
    module_paths: tuple[str, ...]


def _origins_of(snode: Any) -> list[Any]:
    origins: list[Any] = []
    nodes = snode.get_nodes() if hasattr(snode, "get_nodes") else [snode]
    for n in nodes:
        ir = getattr(n, "node", None)
        for o in sorted(getattr(ir, "origins", ()) or (), key=lambda o: o.name):
            if o not in origins:
                origins.append(o)
    return origins


def _event(kind: str, name: str, origins: Sequence[Any]) -> CodegenEvent:
    ops, names, paths = [], [], []
    for o in origins:
        target = getattr(o, "target", None)
        op = str(getattr(target, "__name__", target))
        if hasattr(target, "overloadpacket"):
            op = f"aten.{target.overloadpacket.__name__}"
        if op not in ops:
            ops.append(op)
        names.append(o.name)
        stack = o.meta.get("nn_module_stack") or {}
        if stack:
            path = list(stack.values())[-1][0]
            if path not in paths:
                paths.append(path)
    return CodegenEvent(kind, name, tuple(ops), tuple(names), tuple(paths))


@contextlib.contextmanager
def record_codegen(events: list[CodegenEvent]) -> Iterator[None]:
    """Append a :class:`CodegenEvent` to ``events`` for every kernel call Inductor generates inside the context."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.scheduler import Scheduler
    from torch._inductor.virtualized import V

    orig_call = PythonWrapperCodegen.generate_kernel_call
    orig_extern = Scheduler.codegen_extern_call

    def generate_kernel_call(self: Any, kernel_name: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("triton", True):
            scheduler = getattr(V.graph, "scheduler", None)
            node = getattr(scheduler, "current_node", None)
            events.append(_event("triton", kernel_name, _origins_of(node) if node is not None else []))
        return orig_call(self, kernel_name, *args, **kwargs)

    def codegen_extern_call(self: Any, scheduler_node: Any) -> Any:
        ir = getattr(scheduler_node, "node", None)
        name = str(getattr(ir, "python_kernel_name", None) or type(ir).__name__)
        origin = getattr(ir, "origin_node", None)
        events.append(_event("extern", name, [origin] if origin is not None else _origins_of(scheduler_node)))
        return orig_extern(self, scheduler_node)

    PythonWrapperCodegen.generate_kernel_call = generate_kernel_call
    Scheduler.codegen_extern_call = codegen_extern_call
    try:
        yield
    finally:
        PythonWrapperCodegen.generate_kernel_call = orig_call
        Scheduler.codegen_extern_call = orig_extern


def inductor_config_patches(device_type: str) -> dict[str, Any]:
    """Inductor config for a tessera compile: Triton kernels on every device, no Inductor CUDA graphs (the FX graph
    cache is left as the user set it)."""
    patches: dict[str, Any] = {
        "triton.cudagraphs": False,
        "cpp_wrapper": False,
    }
    if device_type == "cpu":
        patches["cpu_backend"] = "triton"
        # compiled in this process: a compile-worker pool started now would inherit TRITON_INTERPRET=1 (set only for
        # the duration of a CPU lowering) and later fail every GPU kernel it is handed
        patches["compile_threads"] = 1
    return patches


@contextlib.contextmanager
def compile_context(device_type: str) -> Iterator[None]:
    """Config under which :func:`compile_graph` runs (see :func:`inductor_config_patches`); the AOTAutograd cache in
    its unbundled form only (the bundled form's hit path does not pass the hook of :func:`compile_graph`), and off
    where that hook cannot be installed (:func:`_cached_forward_class` is ``None``)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    aot = {"bundled_autograd_cache": False} if _cached_forward_class() is not None else {
        "enable_autograd_cache": False}
    with inductor_config.patch(inductor_config_patches(device_type)), functorch_config.patch(aot):
        yield


#: ``on_cache_hit(compiled_fx_graph, fake_inputs, codegen_key, static_input_idxs)`` of :func:`compile_graph`:
#: ``None`` once it has installed its executor, else the reason it declines the hit.
CacheHitHandler = Callable[[Any, Sequence[Any], str, Sequence[int]], "str | None"]


def _cached_forward_class() -> Any:
    """``FxGraphCacheLoadable`` (the AOTAutograd cache's forward, loaded through its FX graph cache key), or
    ``None`` where this torch has no such class with the methods the hit hook wraps."""
    for module in ("torch._functorch._aot_autograd.aot_autograd_result",
                   "torch._functorch._aot_autograd.autograd_cache"):
        try:
            cls = getattr(__import__(module, fromlist=["FxGraphCacheLoadable"]), "FxGraphCacheLoadable", None)
        except ImportError:
            continue
        if cls is not None and hasattr(cls, "load") and hasattr(cls, "post_compile"):
            return cls
    return None


def _decline_hit(reason: str) -> Exception:
    """The exception that makes AOTAutograd treat a cache hit as a bypass (it traces and compiles instead); any
    exception does (``AOTAutogradCache.try_load`` catches them), torch's own type keeps its log quiet."""
    try:
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
    except ImportError:
        return RuntimeError(reason)
    return BypassAOTAutogradCache(reason)


def _clear_output_strides() -> None:
    """Forget the output strides a compiled graph's ``post_compile`` noted in the tracing context: the compile that
    follows notes them again and asserts that none are noted yet (torch 2.11, 2.13)."""
    context = torch._guards.TracingContext.try_get()
    if context is not None and getattr(context, "output_strides", None) is not None:
        context.output_strides.clear()


@contextlib.contextmanager
def _on_aot_cache_hits(on_hit: CacheHitHandler, seen: list) -> Iterator[None]:
    """Route the forward of every AOTAutograd cache hit inside the block to ``on_hit`` (appending it to ``seen``);
    a hit ``on_hit`` declines is turned into a bypass."""
    cls = _cached_forward_class()
    if cls is None:
        yield
        return
    orig = cls.post_compile

    def post_compile(self: Any, result: Any, fx_config: Any) -> Any:
        out = orig(self, result, fx_config)
        if self._is_backward():  # tessera compiles inference graphs only; nothing to do for a backward
            return out
        key, _ = self.fx_graph_cache_info
        static = tuple(getattr(out, "fx_kwargs", {}).get("static_input_idxs") or ())
        try:
            reason = (on_hit(out, list(self.example_inputs), f"fx:{key}", static)
                      if hasattr(out, "current_callable") else "the cached forward has no generated module")
        except Exception:  # noqa: BLE001 - AOTAutograd counts it a bypass, and the traced compile raises it again
            _clear_output_strides()
            raise
        if reason is not None:
            log.info("AOTAutograd cache hit not reused (%s); tracing the graph again", reason)
            _clear_output_strides()
            raise _decline_hit(f"tessera: {reason}")
        seen.append(out)
        return out

    cls.post_compile = post_compile
    try:
        yield
    finally:
        cls.post_compile = orig


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    on_compiled: Callable[[Any, Sequence[Any], Sequence[int]], None],
    needs_codegen: Callable[[Any], bool] = lambda compiled: False,
    on_cache_hit: CacheHitHandler | None = None,
    codegen_events: list[CodegenEvent] | None = None,
) -> Callable:
    """Compile ``gm`` with Inductor, calling ``on_compiled(compiled_fx_graph, fake_inputs, static_input_idxs)`` on
    each inner graph AOTAutograd traces and Inductor compiles, and ``on_cache_hit`` on each inner graph that comes
    from the AOTAutograd cache instead (no tracing, no ``inner_compile``).

    ``static_input_idxs`` are the inner graph's inputs the caller passes at one address on every call (parameters and
    module buffers, from AOTAutograd's ``fw_metadata.static_input_indices``; ``compile_fx`` hands them to its
    ``inner_compile``, and ``mode="reduce-overhead"`` reads them in place instead of copying them each call; checked
    on torch 2.11 and 2.13). Returns what ``compile_fx`` returns: a callable taking the graph's inputs (AOTAutograd's
    runtime wrappers, input mutations and output aliasing included, around the inner graphs).
    ``on_compiled`` may replace ``compiled_fx_graph.current_callable``. ``needs_codegen(compiled)`` is asked first:
    ``True`` (e.g. an FX graph cache hit whose codegen record the caller does not have) compiles the inner graph again
    with the FX graph cache off, so that codegen runs.

    ``on_cache_hit(compiled_fx_graph, fake_inputs, codegen_key, static_input_idxs)`` gets the cached forward after
    its ``post_compile``, with the inputs AOTAutograd loaded it for, the key :func:`codegen_key` gives for the same
    graph on a miss, and the static inputs Inductor compiled it for; it returns ``None`` once it has done what
    ``on_compiled`` does, or the reason it cannot (then AOTAutograd traces and the miss path runs). Without
    ``on_cache_hit`` the AOTAutograd cache is off. If neither callback saw a graph (a hit path this module does not
    hook), the compile is done again with the AOTAutograd cache off.

    ``codegen_events``: where :func:`record_codegen` appends the kernel calls Inductor generates, around each
    ``inner_compile`` (so a compile that only hits the caches never imports Inductor's codegen modules).
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    seen: list = []

    def recording() -> contextlib.AbstractContextManager:
        return record_codegen(codegen_events) if codegen_events is not None else contextlib.nullcontext()

    def inner_compile(inner_gm: torch.fx.GraphModule, inner_inputs: Sequence[Any], **kwargs: Any) -> Any:
        with recording():
            compiled = compile_fx_inner(inner_gm, inner_inputs, **kwargs)
        if needs_codegen(compiled):
            log.info("Inductor's FX graph cache gave a graph whose codegen record is not saved; generating it again")
            # the first compile's post_compile noted the output strides in the tracing context
            _clear_output_strides()
            with inductor_config.patch(fx_graph_cache=False), recording():
                compiled = compile_fx_inner(inner_gm, inner_inputs, **kwargs)
        on_compiled(compiled, inner_inputs, tuple(kwargs.get("static_input_idxs") or ()))
        seen.append(compiled)
        return compiled

    if on_cache_hit is None:
        with functorch_config.patch(enable_autograd_cache=False):
            return compile_fx(gm, list(example_inputs), inner_compile=inner_compile)
    with _on_aot_cache_hits(on_cache_hit, seen):
        result = compile_fx(gm, list(example_inputs), inner_compile=inner_compile)
    if seen:
        return result
    log.warning("no inner graph of this compile reached tessera (an AOTAutograd cache hit path it does not hook); "
                "compiling it again with the AOTAutograd cache off")
    _clear_output_strides()
    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, list(example_inputs), inner_compile=inner_compile)


def codegen_key(compiled: Any) -> str | None:
    """A key naming the generated code behind ``compiled``, the same on an FX graph cache hit as when it was generated:
    Inductor's FX graph cache key (``CompiledFxGraph._fx_graph_cache_key``, set on a miss and on a hit; torch 2.11,
    2.13), else the SHA-256 of the generated wrapper module's source. ``None`` when there is no generated module (a
    graph with nothing to launch) or neither can be read.
    """
    if not hasattr(compiled, "current_callable"):
        return None
    fx_key = getattr(compiled, "_fx_graph_cache_key", None)
    if isinstance(fx_key, str) and fx_key:
        return f"fx:{fx_key}"
    try:
        path = generated_module_globals(generated_call(compiled)).get("__file__")
        return f"src:{hashlib.sha256(Path(path).read_bytes()).hexdigest()}" if path else None
    except (RuntimeError, OSError, TypeError):
        return None


def generated_kernel_names(compiled: Any) -> set[str] | None:
    """Names of the Triton kernels (``CachingAutotuner`` globals) of the generated module behind ``compiled``, or
    ``None`` when it cannot be found."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    try:
        module_globals = generated_module_globals(generated_call(compiled))
    except RuntimeError:
        return None
    return {k for k, v in module_globals.items() if isinstance(v, CachingAutotuner)}


def generated_kernel_objects(compiled: Any) -> dict[str, Any] | None:
    """The ``CachingAutotuner`` objects of the generated module behind ``compiled``, by kernel function name (the
    name a captured program's launches use), or ``None`` when the module cannot be found."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    try:
        module_globals = generated_module_globals(generated_call(compiled))
    except RuntimeError:
        return None
    return {v.fn.__name__: v for v in module_globals.values() if isinstance(v, CachingAutotuner)}


def generated_call(compiled: Any) -> Callable:
    """The generated wrapper module's ``call(args)`` behind ``compiled.current_callable``.

    On CUDA Inductor wraps it (``align_inputs_from_check_idxs`` copies misaligned inputs, reading data pointers);
    we unwrap closures until we reach the function defined in the generated module (the one whose globals hold
    ``reinterpret_tensor`` and ``call``).
    """
    todo = [compiled.current_callable]
    seen: set[int] = set()
    while todo:
        fn = todo.pop(0)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        func = getattr(fn, "__func__", fn)
        g = getattr(func, "__globals__", None)
        if g is not None and "reinterpret_tensor" in g and "call" in g:
            return fn
        for cell in getattr(func, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if callable(value):
                todo.append(value)
    raise RuntimeError("could not find Inductor's generated call() behind the compiled graph")


def generated_module_globals(fn: Callable) -> dict[str, Any]:
    """Globals of the generated wrapper module that defines ``fn`` (from :func:`generated_call`)."""
    return getattr(fn, "__func__", fn).__globals__


@contextlib.contextmanager
def recording_allocators(module_globals: dict[str, Any]) -> Iterator[None]:
    """Swap the wrapper's C allocation fast paths for ones that respect FakeTensorMode."""
    saved = {
        k: v
        for k, v in module_globals.items()
        if k.startswith("empty_strided_") or k in ("reinterpret_tensor", "assert_alignment")
    }
    for key in saved:
        if key == "assert_alignment":  # reads data pointers, which FakeTensors do not have
            module_globals[key] = lambda *args, **kwargs: None
        elif key == "reinterpret_tensor":
            module_globals[key] = lambda t, size, stride, offset: torch.as_strided(t, size, stride, offset)
        elif key != "empty_strided_p2p":
            device = key.removeprefix("empty_strided_").removesuffix("_pinned")

            def alloc(size: Any, stride: Any, dtype: torch.dtype, *_: Any, _device: str = device) -> torch.Tensor:
                return torch.empty_strided(size, stride, dtype=dtype, device=_device)

            module_globals[key] = alloc
    try:
        yield
    finally:
        module_globals.update(saved)


@contextlib.contextmanager
def intercept_triton_launches(on_launch: Callable[[Any, tuple, dict], Any]) -> Iterator[None]:
    """Route every ``CachingAutotuner.run(*args, **kwargs)`` to ``on_launch(autotuner, args, kwargs)``."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    orig = CachingAutotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return on_launch(self, args, kwargs)

    CachingAutotuner.run = run
    try:
        yield
    finally:
        CachingAutotuner.run = orig


@dataclasses.dataclass(frozen=True)
class TritonKernelInfo:
    """What a ``CachingAutotuner`` knows about its kernel, in plain data."""

    name: str
    source: str
    signature: dict[str, str]
    constants: dict[str, Any]
    param_names: tuple[str, ...]
    config: dict[str, Any]
    mutated: tuple[str, ...]


def triton_kernel_info(autotuner: Any) -> TritonKernelInfo:
    """Name, module source, signature, first config and mutated parameters of an Inductor Triton kernel."""
    name = autotuner.fn.__name__
    filename = getattr(autotuner, "filename", None)
    if not filename:
        raise RuntimeError(f"kernel {name}: Inductor did not record the module file it wrote")
    with open(filename) as f:
        source = f.read()
    meta = autotuner.triton_meta
    signature = {str(k): str(v) for k, v in meta["signature"].items()}
    cfg = first_config(autotuner)
    config = dict(cfg.kwargs)
    config["num_warps"] = cfg.num_warps
    config["num_stages"] = cfg.num_stages
    params = tuple(k for k in signature if k not in cfg.kwargs)  # what call() passes: constants included
    mutated = tuple(getattr(autotuner, "mutated_arg_names", ()) or ())
    return TritonKernelInfo(name, source, signature, dict(meta.get("constants", {})), params, config, mutated)


def first_config(autotuner: Any) -> Any:
    """The first candidate ``triton.Config``. After precompiling, torch 2.11 drops ``configs`` and keeps the
    compiled ``launchers`` (each with its ``config``)."""
    if getattr(autotuner, "configs", None):
        return autotuner.configs[0]
    launchers = getattr(autotuner, "launchers", None)
    if launchers:
        return launchers[0].config
    raise RuntimeError(f"kernel {autotuner.fn.__name__}: neither configs nor compiled launchers are available")


def settled_config(autotuner: Any) -> Any:
    """The ``triton.Config`` an autotuner launches with once it has settled: its one compiled launcher, else
    ``None`` (not compiled yet, or several launchers: its next run benchmarks them). A single candidate that is not
    compiled yet has not settled: compiling can add candidates (``_dynamic_scale_rblock``, below)."""
    launchers = list(getattr(autotuner, "launchers", None) or [])
    return launchers[0].config if len(launchers) == 1 else None


def config_key(cfg: Any) -> tuple:
    """What identifies a ``triton.Config`` for numerics: its block sizes and launch parameters."""
    return (tuple(sorted(cfg.kwargs.items())), cfg.num_warps, cfg.num_stages, getattr(cfg, "num_ctas", 1),
            getattr(cfg, "maxnreg", None))


def pin_config(autotuner: Any, cfg: Any) -> bool:
    """Make an autotuner that has not settled launch with ``cfg`` (no benchmarking on its next run).

    Inductor's reduction kernels carry several candidate configurations (block sizes, warps) and the first run of a
    kernel object benchmarks them; two objects of one kernel (one per device or SM partition) can settle on different
    ones, and a reduction computed with another block size sums in another order (docs/BENCHMARKS.md, settled
    configs). Compiles the candidates first (as the first run would: compiling adds candidates with smaller
    reduction blocks where registers limit occupancy, ``_dynamic_scale_rblock``, so trimming the uncompiled list is
    not enough), then keeps the one compiled launcher whose :func:`config_key` is ``cfg``'s, pruning the others as
    Inductor's own autotuning does. Returns whether it did; ``False`` (no launcher matches: the configuration did
    not compile here, or this device's candidates differ) leaves every launcher, so the next run benchmarks them as
    usual. Checked on torch 2.11.0 and 2.13.0 (``launchers``, ``precompile``; ``_release_static_launchers_except``
    and ``_prune_compile_results_to_launcher`` where present)."""
    key = config_key(cfg)
    if not getattr(autotuner, "launchers", None):
        if not hasattr(autotuner, "precompile"):
            return False
        autotuner.precompile()
    keep = [x for x in (getattr(autotuner, "launchers", None) or []) if config_key(x.config) == key]
    if not keep:
        return False
    for prune in ("_release_static_launchers_except", "_prune_compile_results_to_launcher"):
        fn = getattr(autotuner, prune, None)
        if fn is not None:
            fn(keep[0])
    autotuner.launchers = keep[:1]
    return True


def launch_grid(autotuner: Any, args: Sequence[Any]) -> tuple[int, int, int]:
    """Grid of a launch with the autotuner's first config (what the interpreter and a 1-config GPU launch use)."""
    try:
        _, grid = autotuner._interpret_args_grid(tuple(args), first_config(autotuner))
    except Exception as e:  # noqa: BLE001 - private API; the grid is informational
        log.debug("grid of %s unavailable: %s", autotuner.fn.__name__, e)
        return (0, 0, 0)
    g = tuple(int(x) for x in grid) + (1, 1, 1)
    return g[:3]  # type: ignore[return-value]


def load_kernel_module(source: str, name: str) -> Any:
    """Execute a kernel module's source and return its ``CachingAutotuner`` named ``name``."""
    from torch._inductor.codecache import PyCodeCache

    module = PyCodeCache.load(source)
    return getattr(module, name)


_KERNEL_DIR: list = []


def _kernel_dir() -> Any:
    """A folder for the kernel modules this process loads per device (removed at exit)."""
    if not _KERNEL_DIR:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        d = Path(tempfile.mkdtemp(prefix="tessera_kernels_"))
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        _KERNEL_DIR.append(d)
    return _KERNEL_DIR[0]


def load_kernel_for_device(source: str, name: str, device_index: int | None) -> Any:
    """A fresh ``CachingAutotuner`` for kernel ``name`` from its module source, bound to CUDA device ``device_index``.

    A CUDA function handle belongs to one device's context, so each GPU needs its own kernel object: we execute the
    source in a new module namespace (``PyCodeCache`` would return the cached module) and point the autotuner's
    device properties at ``device_index`` before it compiles.
    """
    import hashlib
    import importlib.util

    # Triton's @jit reads the function's source with ``inspect`` (triton 3.6: "@jit functions should be defined in a
    # Python file"), so the module must come from a real file: one per (source, device), in a per-process folder.
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = _kernel_dir() / f"k{digest}_dev{device_index}.py"  # Inductor's kernel names outgrow NAME_MAX
    if not path.exists():
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # Inductor-generated kernel source
    autotuner = getattr(module, name)
    # no autotune cache for these copies: a choice saved next to this file (``.best_config``) would seed the next
    # load's candidates with this device's own benchmark result, and every device must use the settled one
    # (runtime.executor.KernelLauncher)
    if hasattr(autotuner, "save_cache_hook"):
        autotuner.save_cache_hook = None
    props = getattr(autotuner, "device_props", None)
    if device_index is not None and props is not None and getattr(props, "index", None) != device_index:
        # torch 2.13: a dataclass; torch 2.11: a NamedTuple
        new_props = (dataclasses.replace(props, index=device_index) if dataclasses.is_dataclass(props)
                     else props._replace(index=device_index))
        autotuner.device_props = new_props
        # triton_meta["device"] is the device index (torch 2.11, 2.13) or, in some versions, the properties
        old = autotuner.triton_meta.get("device")
        autotuner.triton_meta["device"] = device_index if isinstance(old, int) else new_props
    return autotuner


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Real tensors inside the block even while Inductor compiles (its ``FakeTensorMode`` is active around
    ``inner_compile``): the measured costs run launches at compile time. ``torch._subclasses.fake_tensor.
    unset_fake_temporarily``, checked on torch 2.11.0 and 2.13.0."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield
