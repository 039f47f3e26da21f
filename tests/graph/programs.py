"""Hand-built kernel programs for DAG tests."""

import torch

from torch_tessera.lowering.program import (Buffer, BufferKind, ExternLaunch, KernelProgram, KernelSource,
                                            Provenance, ScalarArg, TensorArg, TritonLaunch)
from torch_tessera.ptx.types import AccessMode, KernelAccess, ParamAccess

F32 = torch.float32


def view(buffer, offset, size, stride=None):
    if stride is None:
        stride, acc = [], 1
        for s in reversed(size):
            stride.insert(0, acc)
            acc *= s
    return TensorArg(buffer, offset, tuple(size), tuple(stride), F32)


def buffers(**specs):
    """``name=(kind, numel)`` -> buffers of float32."""
    return {n: Buffer(n, kind, F32, numel * 4, "cpu", None) for n, (kind, numel) in specs.items()}


def triton(index, kernel, **args):
    names = tuple(args) + ("xnumel",)
    return TritonLaunch(index, kernel, names, tuple(args.values()) + (ScalarArg(1),), (1, 1, 1), {"XBLOCK": 128})


def mm(index, a, b, out, provenance=()):
    return ExternLaunch(index, "aten::mm.out", (a, b), {"out": out}, ("out",), (),
                        Provenance(aten_ops=provenance or ("aten.mm",)))


def access(kernel, indirect=False, **modes):
    return KernelAccess(kernel, tuple(ParamAccess(n, AccessMode(m)) for n, m in modes.items()), indirect=indirect)


def program(bufs, launches):
    return KernelProgram(bufs, (), tuple(launches), (), {}, "cpu")


SRC = KernelSource("k", "", {})
