"""Single-device reference executor: runs a :class:`KernelProgram` launch by launch.

This is the executor the backend installs in place of Inductor's generated ``call()``. It owns the buffers (graph
inputs are bound to the caller's storages, temporaries are allocated at first use and freed after last use) and
launches every kernel itself: Triton kernels through their Inductor ``CachingAutotuner`` (on CPU under Triton's
interpreter), extern kernels through their ATen overload.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_tessera.errors import TesseraError
from torch_tessera.lowering.program import (
    BufferKind,
    ExternLaunch,
    KernelProgram,
    ScalarArg,
    TensorArg,
    TritonLaunch,
)

log = logging.getLogger(__name__)


class BufferPool:
    """The storages of one device: name -> flat ``uint8`` tensor over the whole storage."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.storages: dict[str, torch.Tensor] = {}
        self._typed: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        # buffers bound to a caller's storage and dropped since (release): a captured graph still addresses them raw
        self.released: set[str] = set()

    def bind(self, name: str, t: torch.Tensor, shift: int = 0) -> None:
        """Bind buffer ``name`` to the storage of tensor ``t``, starting ``shift`` bytes into it."""
        flat = torch.empty(0, dtype=torch.uint8, device=t.device)
        nbytes = t.untyped_storage().nbytes()
        flat.set_(t.untyped_storage(), shift, (nbytes - shift,), (1,))
        self.storages[name] = flat
        self._typed = {k: v for k, v in self._typed.items() if k[0] != name}

    def allocate(self, name: str, nbytes: int) -> None:
        self.storages[name] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def free(self, name: str) -> None:
        self.storages.pop(name, None)
        self._typed = {k: v for k, v in self._typed.items() if k[0] != name}

    def release(self, name: str) -> None:
        """Drop buffer ``name``, bound to a caller's storage, without forgetting it was bound (:attr:`released`): a
        captured graph goes on addressing it, at the address its caller checks before each replay."""
        self.free(name)
        self.released.add(name)

    def __contains__(self, name: str) -> bool:
        return name in self.storages

    def borrow(self) -> "BufferPool":
        """A new pool over the same storages: binding, allocating or freeing a buffer in it leaves this pool's
        bindings as they are (a CUDA graph captured in this pool keeps the addresses it holds bound and alive)."""
        out = BufferPool(self.device)
        out.storages = dict(self.storages)
        return out

    def view(self, arg: TensorArg) -> torch.Tensor:
        """The strided view ``arg`` describes, over this pool's storage for ``arg.buffer``."""
        key = (arg.buffer, arg.dtype)
        typed = self._typed.get(key)
        if typed is None:
            flat = self.storages[arg.buffer]
            item = arg.itemsize
            usable = flat.numel() - flat.numel() % item
            if flat.storage_offset() % item:
                raise TesseraError(f"buffer {arg.buffer} is bound {flat.storage_offset()} bytes into its storage, "
                                   f"not a multiple of {arg.dtype}'s {item} bytes")
            typed = flat[:usable].view(arg.dtype)
            self._typed[key] = typed
        # as_strided's offset is absolute in the storage: add where this pool's view of the buffer starts
        return torch.as_strided(typed, arg.size, arg.stride, typed.storage_offset() + arg.offset)


def borrow_pools(pools: Sequence[BufferPool]) -> list[BufferPool]:
    """:meth:`BufferPool.borrow` of each pool in ``pools``, a pool shared by several devices (one memory domain) still
    shared by them in the result."""
    made: dict[int, BufferPool] = {}
    return [made.setdefault(id(p), p.borrow()) for p in pools]


def check_input_tensor(spec: TensorArg, value: Any, index: int, where: str = "") -> None:
    """Raise :class:`TesseraError` unless graph input ``value`` (at position ``index``) is a tensor with the sizes and
    strides ``spec`` was lowered for; ``where`` prefixes the message (``"micro-batch 1: "``)."""
    if not isinstance(value, torch.Tensor):
        raise TesseraError(f"{where}input {index} ({spec.buffer}) should be a tensor, got {type(value).__name__}")
    if tuple(value.shape) != spec.size or tuple(value.stride()) != spec.stride:
        raise TesseraError(
            f"{where}input {index} ({spec.buffer}) has shape {tuple(value.shape)} and strides "
            f"{tuple(value.stride())}; the program was lowered for {spec.size} / {spec.stride}: recompile for this shape"
        )


def bind_input(pool: BufferPool, spec: TensorArg, value: Any, index: int) -> None:
    """Bind graph input ``value`` so that the program's views of buffer ``spec.buffer`` address its elements.

    The program was recorded with the input at storage offset ``spec.offset``; callers often pass views at other
    offsets (``input_ids[:, -1:]`` of a growing sequence, a slice of a batch). The buffer is then bound to the
    caller's storage shifted by the difference, so every recorded view (relative to the storage) moves with it.

    Raises:
        TesseraError: the input is not a tensor, or sits before the recorded offset in a storage too small to shift.
    """
    check_input_tensor(spec, value, index)
    shift = (value.storage_offset() - spec.offset) * value.element_size()
    if shift < 0 or value.untyped_storage().nbytes() - shift < spec.byte_span[1]:
        raise TesseraError(
            f"input {index} ({spec.buffer}) has storage offset {value.storage_offset()}, the program was lowered for "
            f"{spec.offset} and its storage cannot be shifted to match; pass a contiguous copy (x.clone())"
        )
    pool.bind(spec.buffer, value, shift)


def _tensor_args(value: Any) -> list[TensorArg]:
    leaves, _ = tree_flatten(value)
    return [x for x in leaves if isinstance(x, TensorArg)]


def launch_buffers(launch: TritonLaunch | ExternLaunch) -> set[str]:
    """Every buffer a launch's arguments or outputs name."""
    if isinstance(launch, TritonLaunch):
        return {a.buffer for a in launch.args if isinstance(a, TensorArg)}
    names = {a.buffer for a in _tensor_args(launch.args)} | {a.buffer for a in _tensor_args(dict(launch.kwargs))}
    return names | {a.buffer for a in launch.outputs}


def fresh_extern_outputs(program: KernelProgram) -> dict[int, set[str]]:
    """Per extern launch, the buffers it creates (its results that no earlier launch or input touched)."""
    seen = {a.buffer for a in program.inputs if isinstance(a, TensorArg)}
    fresh: dict[int, set[str]] = {}
    for launch in program.launches:
        if isinstance(launch, ExternLaunch):
            used = {a.buffer for a in _tensor_args(launch.args)} | {a.buffer for a in _tensor_args(dict(launch.kwargs))}
            new = {o.buffer for o in launch.outputs} - seen - used
            if new:
                fresh[launch.index] = new
        seen |= launch_buffers(launch)
    return fresh


#: Triton kernel source hash -> the configuration the first device to run it in this process settled on (see
#: :meth:`KernelLauncher.launch`).
SETTLED_CONFIGS: dict[str, Any] = {}
#: (kernel source hash, device) pairs already warned about a configuration other than the settled one (once each)
_WARNED: set[tuple[str, str]] = set()
#: guards SETTLED_CONFIGS and pinning: the measured bench's timing threads launch kernels concurrently
_SETTLING = threading.Lock()


class KernelLauncher:
    """Launches single kernels of a program on a device (Triton via ``CachingAutotuner``, extern via ATen).

    One configuration per kernel per process: the first launch of a Triton kernel anywhere in the process settles
    its configuration (benchmarking the candidates, as Inductor does); every later kernel object of the same source,
    on any device or SM partition, is pinned to it before its first run (:func:`~torch_tessera.compat.torch_inductor.
    pin_config`). A placement then computes what the home device computes, bit for bit, for Triton kernels: a
    freshly loaded kernel object would autotune anew, and a reduction could get another block size on each fresh
    load, even on the same GPU (docs/BENCHMARKS.md, settled configurations).
    """

    def __init__(
        self,
        program: KernelProgram,
        kernel_objects: Mapping[str, Any] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.program = program
        self.device = device
        self._objects = dict(kernel_objects or {})
        self._agreed: set[str] = set()
        self._source_hash: dict[str, str] = {}

    def kernel(self, name: str) -> Any:
        """The kernel object for ``name`` on this launcher's device (loaded from source on first use)."""
        obj = self._objects.get(name)
        if obj is None:
            from torch_tessera.compat.torch_inductor import load_kernel_for_device

            index = self.device.index if self.device is not None and self.device.type == "cuda" else None
            obj = load_kernel_for_device(self.program.kernels[name].source, name, index)
            self._objects[name] = obj
        return obj

    def launch(self, launch: TritonLaunch | ExternLaunch, pool: BufferPool, stream: Any = None) -> Any:
        """Run one launch with its arguments taken from ``pool``. Returns the extern op's result (None for Triton)."""

        def arg(v: Any) -> Any:
            if isinstance(v, TensorArg):
                return pool.view(v)
            if isinstance(v, ScalarArg):
                return v.value
            return v

        if isinstance(launch, TritonLaunch):
            args = [arg(a) for a in launch.args]
            if stream is None and pool.device.type == "cuda":
                stream = torch.cuda.current_stream(pool.device)
            raw_stream = 0 if stream is None else stream.cuda_stream
            kernel = self.kernel(launch.kernel)
            if launch.kernel not in self._agreed:
                self._agree_config(launch.kernel, kernel)
            with _interpreter_context(pool.device):
                kernel.run(*args, stream=raw_stream)
            if launch.kernel not in self._agreed:
                self._note_settled(launch.kernel, kernel)
            return None
        args = tree_map(arg, launch.args)
        kwargs = tree_map(arg, dict(launch.kwargs))
        return launch.overload(*args, **kwargs)

    def _agree_config(self, name: str, kernel: Any) -> None:
        """Before a kernel object's first launch here: pin it to the configuration this process settled on."""
        from torch_tessera.compat.torch_inductor import config_key, pin_config, settled_config

        if getattr(kernel, "triton_interpret", False):  # the interpreter launches the first candidate, untuned
            self._agreed.add(name)
            return
        key = self._hash(name)
        with _SETTLING:
            want = SETTLED_CONFIGS.get(key)
            if want is None:
                return  # the first object to run it: it settles (benchmarks) now, _note_settled records the choice
            self._agreed.add(name)
            have = settled_config(kernel)
            if have is None and pin_config(kernel, want):
                return
        if have is None:
            self._warn(key, name, f"has no compiled candidate equal to {want} (settled elsewhere in this process): "
                                  "it benchmarks its own")
        elif config_key(have) != config_key(want):
            self._warn(key, name, f"already runs configuration {have}, not {want} as elsewhere in this process")

    def _note_settled(self, name: str, kernel: Any) -> None:
        from torch_tessera.compat.torch_inductor import config_key, settled_config

        cfg = settled_config(kernel)
        if cfg is None:
            return
        key = self._hash(name)
        with _SETTLING:
            first = SETTLED_CONFIGS.setdefault(key, cfg)
        self._agreed.add(name)
        if config_key(first) != config_key(cfg):  # another thread settled the same kernel at the same time
            self._warn(key, name, f"settled on {cfg} while another launch settled on {first}")

    def _warn(self, key: str, name: str, what: str) -> None:
        if (key, str(self.device)) in _WARNED:
            return
        _WARNED.add((key, str(self.device)))
        log.warning("kernel %s on %s %s: its results may differ in the last bits between devices", name, self.device,
                    what)

    def _hash(self, name: str) -> str:
        h = self._source_hash.get(name)
        if h is None:
            h = self._source_hash[name] = self.program.kernels[name].source_hash
        return h


@contextlib.contextmanager
def _interpreter_context(device: torch.device) -> Iterator[None]:
    if device.type == "cpu":
        from torch_tessera.compat.triton import interpreter_libdevice

        with interpreter_libdevice():
            yield
    else:
        yield


class ProgramExecutor:
    """Runs a :class:`KernelProgram` on one device, launch by launch.

    Calling the executor with the graph's inputs (a list, as Inductor's ``call()`` takes them) returns the outputs.
    ``launches_executed`` counts every launch run since construction: tests compare it with the program length to
    prove the program, not Inductor's ``call()``, did the work.

    Args:
        program: the program to run.
        kernel_objects: live ``CachingAutotuner`` objects by kernel name (from lowering); others are rebuilt from
            ``program.kernels`` sources.
    """

    def __init__(self, program: KernelProgram, kernel_objects: Mapping[str, Any] | None = None) -> None:
        self.program = program
        self.launcher = KernelLauncher(program, kernel_objects)
        self.launches_executed = 0
        self.calls = 0
        self._fresh = fresh_extern_outputs(program)
        self._program_order = tuple(launch.index for launch in program.launches)
        self._free_after = self._last_uses(self._program_order)

    def _last_uses(self, order: Sequence[int]) -> dict[int, list[str]]:
        """Launch index after which each temporary (not an output) is no longer needed, when run in ``order``."""
        program = self.program
        out_buffers = {a.buffer for a in program.outputs if isinstance(a, TensorArg)}
        last_use: dict[str, int] = {}
        for i in order:
            for b in launch_buffers(program.launches[i]):
                last_use[b] = i
        free_after: dict[int, list[str]] = {}
        for b, i in last_use.items():
            if program.buffers[b].kind == BufferKind.TEMP and b not in out_buffers:
                free_after.setdefault(i, []).append(b)
        return free_after

    def _checked_order(self, order: Sequence[int]) -> tuple[int, ...]:
        order = tuple(int(i) for i in order)
        if sorted(order) != list(self._program_order):
            raise TesseraError(
                f"launch order must be a permutation of the program's {len(self._program_order)} launch indices "
                f"(0..{len(self._program_order) - 1}), got {len(order)} indices; pass every launch exactly once"
            )
        return order

    def __call__(self, args: list) -> list:
        inputs = list(args)
        if isinstance(args, list):
            args.clear()  # Inductor's calling convention: the callee owns (and clears) the argument list
        return self.run(inputs)

    def run(self, inputs: Sequence[Any], order: Sequence[int] | None = None) -> list:
        """Run the program on ``inputs`` (the graph inputs, in order) and return its outputs.

        Args:
            inputs: the graph inputs, in the program's input order.
            order: launch indices in the order to run them (a permutation of ``range(len(program.launches))``);
                ``None`` runs them in program order. Any topological order of the program's dependency DAG gives the
                same result; temporaries are allocated at their first use and freed after their last use in this
                order. The executor does not check the order against the DAG.

        Raises:
            TesseraError: wrong number or kind of inputs, or ``order`` is not a permutation of the launch indices.
        """
        program = self.program
        if order is None:
            order, free_after = self._program_order, self._free_after
        else:
            order = self._checked_order(order)
            free_after = self._last_uses(order)
        if len(inputs) != len(program.inputs):
            raise TesseraError(f"program expects {len(program.inputs)} inputs, got {len(inputs)}")
        device = torch.device(program.device)
        pool = BufferPool(device)
        for i, (spec, value) in enumerate(zip(program.inputs, inputs)):
            if isinstance(spec, TensorArg) and spec.buffer not in pool:
                bind_input(pool, spec, value, i)
        for index in order:
            launch = program.launches[index]
            for b in launch_buffers(launch):
                if b not in pool and b not in self._fresh.get(launch.index, ()):
                    pool.allocate(b, program.buffers[b].nbytes)
            result = self.launcher.launch(launch, pool)
            if isinstance(launch, ExternLaunch) and launch.index in self._fresh:
                leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
                for spec, t in zip(launch.outputs, leaves):
                    if spec.buffer in self._fresh[launch.index] and spec.buffer not in pool:
                        pool.bind(spec.buffer, t)
            self.launches_executed += 1
            for b in free_after.get(launch.index, ()):
                pool.free(b)
        for o in program.outputs:
            if isinstance(o, TensorArg) and o.buffer not in pool:  # an output no launch touches (e.g. empty)
                pool.allocate(o.buffer, program.buffers[o.buffer].nbytes)
        self.calls += 1
        return [pool.view(o) if isinstance(o, TensorArg) else o.value for o in program.outputs]
