"""The kernel program: the data type that crosses from ``lowering/`` to every later stage.

A :class:`KernelProgram` is an ordered list of kernel launches over named buffers. Buffers are *storages* (one per
allocation), never Python tensor objects: Inductor's buffer reuse (``buf3 = buf1``), views (``reinterpret_tensor``) and
in-place updates (``in_out_ptr``) all resolve to the storage they touch, so dependencies can be computed on byte ranges
of storages.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

import torch


class BufferKind(str, enum.Enum):
    """What a storage is to the program.

    PARAMETER: a graph input that holds weights (an ``nn.Parameter``), read-only.
    STATE: a graph input the program writes in place (KV cache, SSM state, running stats).
    INPUT: any other graph input (activations, token ids, positions).
    TEMP: an allocation made by the program (intermediates and outputs).
    """

    PARAMETER = "parameter"
    STATE = "state"
    INPUT = "input"
    TEMP = "temp"


@dataclass(frozen=True)
class Buffer:
    """One storage.

    Attributes:
        name: unique name in the program (graph-input name for inputs, ``buf<N>`` for temporaries).
        kind: see :class:`BufferKind`.
        dtype: dtype the storage was allocated with (a storage may be viewed with other dtypes).
        nbytes: size of the storage in bytes.
        device: device the program was lowered for, e.g. ``"cpu"`` or ``"cuda:0"``.
        input_index: position among the graph inputs, or ``None`` for temporaries.
    """

    name: str
    kind: BufferKind
    dtype: torch.dtype
    nbytes: int
    device: str
    input_index: int | None = None


@dataclass(frozen=True)
class TensorArg:
    """A launch argument that is a strided view of a buffer.

    Attributes:
        buffer: name of the storage.
        offset: storage offset of the view, in elements of ``dtype``.
        size: shape of the view.
        stride: strides of the view, in elements.
        dtype: element dtype of the view.
    """

    buffer: str
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n

    @property
    def byte_span(self) -> tuple[int, int]:
        """Half-open byte range ``[start, end)`` of the storage that the view can address (empty view: start == end)."""
        item = self.itemsize
        start = self.offset * item
        if self.numel == 0:
            return start, start
        last = self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride) if s > 0)
        return start, (last + 1) * item


@dataclass(frozen=True)
class ScalarArg:
    """A launch argument that is not a tensor (int, float, bool, None, dtype, a string...)."""

    value: Any


Arg = Union[TensorArg, ScalarArg]


#: Names of the module lists that hold a model's repeated layers (HF decoders ``layers``/``h``/``blocks``; diffusers
#: transformers ``transformer_blocks``).
LAYER_LISTS = ("layers", "layer", "h", "blocks", "block", "transformer_blocks")


@dataclass(frozen=True)
class Provenance:
    """Where a launch came from in the model.

    Attributes:
        aten_ops: ATen ops fused into the launch (e.g. ``("aten.native_layer_norm", "aten.mul")``).
        fx_nodes: names of the FX nodes the launch computes (post-AOT graph).
        module_paths: ``nn.Module`` paths of those nodes when known (e.g. ``"model.layers.0.self_attn"``).
    """

    aten_ops: tuple[str, ...] = ()
    fx_nodes: tuple[str, ...] = ()
    module_paths: tuple[str, ...] = ()

    @property
    def layer(self) -> int | None:
        """Index of the repeated layer the launch belongs to (``...layers.<N>...``, or any name of
        :data:`LAYER_LISTS` followed by an index, also in Dynamo's ``['transformer_blocks']`` form), if all its module
        paths agree."""
        found = set()
        for path in self.module_paths:
            parts = [p.strip("'\"") for p in path.replace("[", ".").replace("]", "").split(".")]
            for a, b in zip(parts, parts[1:]):
                if a in LAYER_LISTS and b.isdigit():
                    found.add(int(b))
                    break
        return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class TritonLaunch:
    """A launch of an Inductor-generated Triton kernel.

    Attributes:
        index: position in program order.
        kernel: kernel name (unique per program; several launches may share it).
        param_names: the kernel's runtime parameters, in order (``in_ptr0``, ``out_ptr0``, ``xnumel``...).
        args: one argument per runtime parameter.
        grid: launch grid ``(x, y, z)`` for ``config``.
        config: compile-time meta-parameters chosen (block sizes, ``num_warps``, ``num_stages``).
        mutated: parameter names Inductor declares mutated (``in_out_ptr``, ``out_ptr`` of in-place ops).
        provenance: where it came from.
    """

    index: int
    kernel: str
    param_names: tuple[str, ...]
    args: tuple[Arg, ...]
    grid: tuple[int, int, int]
    config: Mapping[str, Any]
    mutated: tuple[str, ...] = ()
    provenance: Provenance = field(default_factory=Provenance)

    kind = "triton"

    @property
    def tensor_args(self) -> dict[str, TensorArg]:
        return {n: a for n, a in zip(self.param_names, self.args) if isinstance(a, TensorArg)}


@dataclass(frozen=True)
class ExternLaunch:
    """A launch of a non-Triton kernel: an ATen op (cuBLAS GEMM, SDPA, a fallback).

    Attributes:
        index: position in program order.
        op: qualified overload name, e.g. ``"aten::mm.out"``.
        args: positional arguments; tensors as :class:`TensorArg`, lists kept as tuples.
        kwargs: keyword arguments, same encoding.
        writes: names of the schema arguments the op writes (alias annotation ``Tensor(a!)``), e.g. ``("out",)``.
        outputs: fresh tensors the op returned (not aliases of an argument), as views of new buffers.
        provenance: where it came from.
    """

    index: int
    op: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    writes: tuple[str, ...]
    outputs: tuple[TensorArg, ...] = ()
    provenance: Provenance = field(default_factory=Provenance)

    kind = "extern"

    @property
    def overload(self) -> torch._ops.OpOverload:
        """The ``torch.ops`` overload object for :attr:`op`."""
        ns, rest = self.op.split("::")
        name, _, ov = rest.partition(".")
        return getattr(getattr(getattr(torch.ops, ns), name), ov or "default")


Launch = Union[TritonLaunch, ExternLaunch]


@dataclass(frozen=True)
class KernelSource:
    """The code of one Triton kernel, enough to rebuild it on any device.

    Attributes:
        name: kernel name.
        source: Python source of the module Inductor wrote (``@triton_heuristics...`` + ``@triton.jit``).
        signature: Triton signature, parameter name -> type string (``*fp32``, ``i32``, ``constexpr``).
        constants: parameters specialised to constants.
    """

    name: str
    source: str
    signature: Mapping[str, str]
    constants: Mapping[str, Any] = field(default_factory=dict)

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class KernelProgram:
    """An ordered list of kernel launches over named buffers.

    Attributes:
        buffers: every storage the program touches, by name.
        inputs: each graph input, in the order the compiled callable receives them: a view of its buffer (two inputs
            that share a storage name one buffer), or a scalar.
        launches: kernel launches in program order.
        outputs: the returned values, as views of buffers (or scalars).
        kernels: source of every Triton kernel, by kernel name.
        device: device the program was lowered for.
        static_inputs: INPUT buffers the caller passes at the same address on every call (Dynamo's static inputs
            that are not parameters: module buffers such as a rotary-frequency table). A CUDA graph reads them where
            the caller keeps them, as ``mode="reduce-overhead"`` does, instead of copying them in every call; their
            contents may still change between calls.
    """

    buffers: Mapping[str, Buffer]
    inputs: tuple[Arg, ...]
    launches: tuple[Launch, ...]
    outputs: tuple[Arg, ...]
    kernels: Mapping[str, KernelSource]
    device: str
    static_inputs: tuple[str, ...] = ()

    @property
    def triton_launches(self) -> list[TritonLaunch]:
        return [l for l in self.launches if isinstance(l, TritonLaunch)]

    @property
    def extern_launches(self) -> list[ExternLaunch]:
        return [l for l in self.launches if isinstance(l, ExternLaunch)]

    def buffers_of(self, kind: BufferKind) -> list[Buffer]:
        return [b for b in self.buffers.values() if b.kind == kind]

    @property
    def fingerprint(self) -> str:
        """Stable hash of the program (kernel sources, launches, buffers): a cache key for plans and profiles."""
        h = hashlib.sha256()
        h.update(json.dumps(to_jsonable(self), sort_keys=True).encode())
        return h.hexdigest()[:24]


def to_jsonable(obj: Any) -> Any:
    """Turn a program (or any part of one) into JSON-compatible data (dtypes as strings, dataclasses as dicts)."""
    import dataclasses

    if isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        d = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        kind = getattr(type(obj), "kind", None)
        if isinstance(kind, str):
            d["kind"] = kind
        return d
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return obj
    if isinstance(obj, torch.device):
        return str(obj)
    if isinstance(obj, (torch.layout, torch.memory_format)):
        return str(obj)
    return repr(obj)
