"""Record an Inductor-compiled graph's launches as a :class:`KernelProgram`.

The generated ``call()`` runs once on FakeTensors: Triton launches are intercepted (nothing executes), every other
ATen op the wrapper dispatches (``extern_kernels.mm`` -> ``aten.mm.out``, SDPA, fallbacks, copies) is observed by a
``TorchDispatchMode``. Storages are identified by object identity while the recording holds a reference to every
tensor it saw, so buffer reuse, views and in-place updates all resolve to the storage they touch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torch_tessera.compat import torch_inductor as compat
from torch_tessera.errors import LoweringError
from torch_tessera.lowering.program import (
    Arg,
    Buffer,
    BufferKind,
    ExternLaunch,
    KernelProgram,
    KernelSource,
    Launch,
    Provenance,
    ScalarArg,
    TensorArg,
    TritonLaunch,
)

log = logging.getLogger(__name__)

#: ATen ops the wrapper dispatches that are not launches: allocation, views, metadata.
_NOT_LAUNCHES = {
    "aten::empty_strided",
    "aten::empty",
    "aten::as_strided",
    "aten::detach",
    "aten::alias",
    "aten::lift_fresh",
    "prim::device",
    "prim::layout",
    "aten::sym_size",
    "aten::sym_stride",
    "aten::sym_storage_offset",
    "aten::sym_numel",
}
_ALLOCATIONS = {"aten::empty_strided", "aten::empty"}


@dataclass
class CapturedGraph:
    """A captured program and the live kernel objects that can launch it in this process.

    Attributes:
        program: the kernel program.
        kernel_objects: Inductor ``CachingAutotuner`` per kernel name (not serialisable; rebuilt from
            ``program.kernels`` when a program is loaded from disk).
        from_cache: the graph came from the AOTAutograd cache and the program from its saved codegen record: no
            tracing, no Inductor compile (``False``: traced by AOTAutograd in this compile).
    """

    program: KernelProgram
    kernel_objects: dict[str, Any] = field(default_factory=dict)
    from_cache: bool = False


class _Recorder(TorchDispatchMode):
    """Builds the buffer table and launch list while the generated ``call()`` runs on FakeTensors."""

    def __init__(self, events: Sequence[compat.CodegenEvent]) -> None:
        super().__init__()
        self.keep: list[torch.Tensor] = []  # keeps every storage alive, so identities are never reused
        self.names: dict[int, str] = {}
        self.buffers: dict[str, Buffer] = {}
        self.launches: list[Launch] = []
        self.kernels: dict[str, KernelSource] = {}
        self.kernel_objects: dict[str, Any] = {}
        self.device = "cpu"
        self._paused = 0
        self._triton_events: dict[str, list[compat.CodegenEvent]] = {}
        self._triton_seen: dict[str, int] = {}
        self._extern_events = [e for e in events if e.kind == "extern"]
        self._extern_pos = 0
        for e in events:
            if e.kind == "triton":
                self._triton_events.setdefault(e.name, []).append(e)

    # -- buffers -------------------------------------------------------------------------------------------------------
    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return t.untyped_storage()._cdata

    def add_input(self, t: torch.Tensor, name: str, kind: BufferKind, index: int) -> TensorArg:
        key = self._key(t)
        if key not in self.names:
            self.names[key] = name
            self.buffers[name] = Buffer(name, kind, t.dtype, int(t.untyped_storage().nbytes()), str(t.device), index)
            self.keep.append(t)
        return self.view(t)

    def view(self, t: torch.Tensor) -> TensorArg:
        key = self._key(t)
        name = self.names.get(key)
        if name is None:
            name = f"buf{len(self.names)}"
            self.names[key] = name
            nbytes = int(t.untyped_storage().nbytes())
            self.buffers[name] = Buffer(name, BufferKind.TEMP, t.dtype, nbytes, str(t.device))
            self.keep.append(t)
        return TensorArg(name, int(t.storage_offset()), tuple(int(s) for s in t.shape),
                         tuple(int(s) for s in t.stride()), t.dtype)

    def encode(self, value: Any) -> Any:
        """Launch arguments as plain data: tensors -> TensorArg, lists -> tuples, everything else as is."""
        def enc(v: Any) -> Any:
            return self.view(v) if isinstance(v, torch.Tensor) else v

        out = tree_map(enc, value)
        return tuple(out) if isinstance(out, list) else out

    # -- Triton --------------------------------------------------------------------------------------------------------
    def on_triton(self, autotuner: Any, args: tuple, kwargs: dict) -> None:
        self._paused += 1
        try:
            info = compat.triton_kernel_info(autotuner)
            if len(args) != len(info.param_names):
                raise LoweringError(
                    f"kernel {info.name}: launched with {len(args)} arguments, signature has {len(info.param_names)}"
                    f" runtime parameters {info.param_names}"
                )
            self.kernels.setdefault(info.name, KernelSource(info.name, info.source, info.signature, info.constants))
            self.kernel_objects.setdefault(info.name, autotuner)
            targs: list[Arg] = [self.view(a) if isinstance(a, torch.Tensor) else ScalarArg(a) for a in args]
            for a in args:
                if isinstance(a, torch.Tensor):
                    self.device = str(a.device)
            launch = TritonLaunch(
                index=len(self.launches),
                kernel=info.name,
                param_names=info.param_names,
                args=tuple(targs),
                grid=compat.launch_grid(autotuner, args),
                config=info.config,
                mutated=info.mutated,
                provenance=self._triton_provenance(info.name),
            )
            self.launches.append(launch)
        finally:
            self._paused -= 1

    def _triton_provenance(self, kernel: str) -> Provenance:
        k = self._triton_seen.get(kernel, 0)
        self._triton_seen[kernel] = k + 1
        events = self._triton_events.get(kernel, [])
        e = events[k] if k < len(events) else (events[-1] if events else None)
        return Provenance(e.aten_ops, e.fx_nodes, e.module_paths) if e else Provenance()

    # -- extern ops ----------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._paused:
            return out
        name = func._schema.name
        if name in _ALLOCATIONS:
            self.view(out)
            return out
        if name in _NOT_LAUNCHES or func.is_view:
            return out
        self._paused += 1
        try:
            writes = tuple(a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write)
            enc_args = tuple(self.encode(a) for a in args)
            enc_kwargs = {k: self.encode(v) for k, v in kwargs.items()}
            leaves, _ = tree_flatten(out)
            outputs = tuple(self.view(t) for t in leaves if isinstance(t, torch.Tensor))
            op = f"{name}.{func._overloadname}"
            self.launches.append(
                ExternLaunch(len(self.launches), op, enc_args, enc_kwargs, writes, outputs, self._extern_provenance(op))
            )
        finally:
            self._paused -= 1
        return out

    def _extern_provenance(self, op: str) -> Provenance:
        packet = op.split("::")[-1].split(".")[0]
        for i in range(self._extern_pos, min(self._extern_pos + 4, len(self._extern_events))):
            e = self._extern_events[i]
            if packet in e.name.split(".") or f"aten.{packet}" in e.aten_ops:
                self._extern_pos = i + 1
                return Provenance(e.aten_ops or (f"aten.{packet}",), e.fx_nodes, e.module_paths)
        return Provenance((f"aten.{packet}",))


def capture_program(
    compiled: Any,
    fake_inputs: Sequence[Any],
    events: Sequence[compat.CodegenEvent],
    input_names: Sequence[str] | None = None,
    parameter_flags: Sequence[bool] | None = None,
    static_input_idxs: Sequence[int] = (),
) -> CapturedGraph:
    """Record the launches of an Inductor ``CompiledFxGraph`` as a :class:`KernelProgram`.

    Args:
        compiled: Inductor's output for one graph (has ``current_callable``).
        fake_inputs: the FakeTensor (or int) inputs Inductor compiled for.
        events: the codegen events recorded while Inductor generated the graph (for provenance).
        input_names: a name per input (e.g. the Dynamo placeholder names); ``arg<i>`` when None.
        parameter_flags: per input, whether it is a model parameter (weights); others are inputs or state.
        static_input_idxs: inputs the caller passes at one address every call (Dynamo's static inputs: parameters
            and module buffers); those of kind INPUT are recorded in ``KernelProgram.static_inputs``.

    Returns:
        The captured program and the kernel objects that can launch it.

    Raises:
        LoweringError: the graph has symbolic shapes, or the wrapper did something the recorder cannot represent.
    """
    from torch._guards import detect_fake_mode

    for i, x in enumerate(fake_inputs):
        if isinstance(x, torch.SymInt) or (
            isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in (*x.shape, *x.stride()))
        ):
            raise LoweringError(
                f"graph input {i} has a symbolic shape; tessera plans static shapes. Compile with "
                "torch.compile(..., dynamic=False) (one program per shape bucket)."
            )
    fake_mode = detect_fake_mode(fake_inputs)
    if fake_mode is None:
        raise LoweringError("Inductor's inputs carry no FakeTensorMode; cannot record the program without running it")
    names = _readable_names(input_names) if input_names is not None and len(input_names) == len(fake_inputs) else None
    flags = list(parameter_flags) if parameter_flags is not None and len(parameter_flags) == len(fake_inputs) else None

    rec = _Recorder(events)
    inputs: list[Arg] = []
    for i, x in enumerate(fake_inputs):
        if isinstance(x, torch.Tensor):
            kind = BufferKind.PARAMETER if flags and flags[i] else BufferKind.INPUT
            inputs.append(rec.add_input(x, names[i] if names else f"arg{i}", kind, i))
        else:
            inputs.append(ScalarArg(x))

    try:
        call = compat.generated_call(compiled)
        module_globals = compat.generated_module_globals(call)
        with compat.recording_allocators(module_globals), compat.intercept_triton_launches(rec.on_triton):
            with fake_mode, rec:
                result = call(list(fake_inputs))
    except LoweringError:
        raise
    except Exception as e:  # noqa: BLE001 - the border with Inductor's generated code: report what failed, as ours
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        raise LoweringError(
            f"recording the Inductor program failed at {where.filename}:{where.lineno} ({where.line}): "
            f"{type(e).__name__}: {e}"
        ) from e

    outputs = tuple(rec.view(o) if isinstance(o, torch.Tensor) else ScalarArg(o) for o in result)
    buffers = _classify_state(rec.buffers, rec.launches)
    device = next((str(x.device) for x in fake_inputs if isinstance(x, torch.Tensor)
                   and not (x.device.type == "cpu" and x.dim() == 0)), rec.device)
    idxs = set(static_input_idxs)
    static = ({a.buffer for i, a in enumerate(inputs) if i in idxs and isinstance(a, TensorArg)}
              - {a.buffer for i, a in enumerate(inputs) if i not in idxs and isinstance(a, TensorArg)})
    static_inputs = tuple(sorted(b for b in static if buffers[b].kind == BufferKind.INPUT))
    program = KernelProgram(buffers, tuple(inputs), tuple(rec.launches), outputs, dict(rec.kernels), device,
                            static_inputs)
    log.info(
        "captured %d launches (%d Triton, %d extern) over %d buffers",
        len(program.launches), len(program.triton_launches), len(program.extern_launches), len(buffers),
    )
    return CapturedGraph(program, rec.kernel_objects)


def _readable_names(names: Sequence[str]) -> list[str]:
    """Dynamo placeholder names as module paths: ``l_self_modules_up_parameters_weight_`` -> ``up.weight``."""
    out = []
    for n in names:
        m = n.removeprefix("l_self_").removeprefix("l_").removesuffix("_")
        for tag in ("_modules_", "_parameters_", "_buffers_"):
            m = m.replace(tag, ".")
        m = m.removeprefix("modules_").removeprefix("parameters_").removeprefix("buffers_")
        out.append(m or n)
    return out if len(set(out)) == len(out) else list(names)


def _classify_state(buffers: Mapping[str, Buffer], launches: Sequence[Launch]) -> dict[str, Buffer]:
    """Mark graph inputs that some launch writes as STATE (KV caches, SSM state, running statistics)."""
    written: set[str] = set()
    for launch in launches:
        written |= launch_writes(launch)
    out = {}
    for name, b in buffers.items():
        if b.kind in (BufferKind.INPUT, BufferKind.PARAMETER) and name in written:
            b = Buffer(b.name, BufferKind.STATE, b.dtype, b.nbytes, b.device, b.input_index)
        out[name] = b
    return out


def extern_accesses(launch: ExternLaunch) -> tuple[set[str], set[str]]:
    """``(reads, writes)`` buffer sets of an extern launch, from its op schema.

    A written keyword-only argument (``out=``) is write-only; a written positional argument (``self`` of ``add_``) is
    read and written; every other tensor argument is read; fresh results are written.
    """
    reads: set[str] = set()
    writes: set[str] = {t.buffer for t in launch.outputs if not _aliases_argument(launch, t)}
    schema = launch.overload._schema
    for i, a in enumerate(schema.arguments):
        if a.kwarg_only or i >= len(launch.args):
            v = launch.kwargs.get(a.name)
        else:
            v = launch.args[i]
        bufs = {x.buffer for x in tree_flatten(v)[0] if isinstance(x, TensorArg)}
        if a.name in launch.writes:
            writes |= bufs
            if not a.kwarg_only:
                reads |= bufs
        else:
            reads |= bufs
    return reads, writes


def _aliases_argument(launch: ExternLaunch, t: TensorArg) -> bool:
    leaves = tree_flatten((launch.args, dict(launch.kwargs)))[0]
    return any(isinstance(x, TensorArg) and x.buffer == t.buffer for x in leaves)


def launch_writes(launch: Launch) -> set[str]:
    """Buffers a launch may write, from Inductor's own metadata (Triton ``out_ptr``/``in_out_ptr``/mutated names,
    extern schema alias annotations and fresh outputs). The PTX analysis (``torch_tessera.ptx``) refines this."""
    if isinstance(launch, TritonLaunch):
        return {
            a.buffer
            for n, a in launch.tensor_args.items()
            if n.startswith(("out_ptr", "in_out_ptr")) or n in launch.mutated
        }
    return extern_accesses(launch)[1]


Callback = Callable[[CapturedGraph], Any]
