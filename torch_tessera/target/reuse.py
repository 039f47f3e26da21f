"""L2 reuse between launches, from program order: how much traffic lies between a launch's read of a tensor and the
last launch that touched the same buffer.

The L2 keeps the most recently touched bytes. A launch that reads a buffer touched ``d`` bytes of traffic ago (the sum
of the bytes every launch in between moved) finds up to ``capacity - d`` of its ``b`` bytes there: all of them when
``b + d`` fit, none when ``d`` alone exceeds the capacity. Weights read once per step and inputs of the program have no
earlier touch and come from DRAM. The cost model (:mod:`torch_tessera.target.kernelmodel`) takes the capacity from the
catalog's L2 size.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from torch_tessera.lowering.program import ExternLaunch, KernelProgram, TensorArg, TritonLaunch
from torch_tessera.target.triton_work import kernel_body, loaded_params

#: Distance of a read whose buffer no earlier launch touched (bytes).
NEVER = math.inf


def _extern_reads(launch: ExternLaunch) -> Iterable[TensorArg]:
    for a in launch.args:
        yield from _flat(a)
    for name, a in launch.kwargs.items():
        if name not in launch.writes:
            yield from _flat(a)


def _flat(obj: Any) -> Iterable[TensorArg]:
    if isinstance(obj, TensorArg):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flat(o)


def _triton_reads(launch: TritonLaunch, kernels) -> Iterable[TensorArg]:
    source = kernels.get(launch.kernel)
    body = kernel_body(source.source, launch.kernel) if source is not None else None
    args = launch.tensor_args
    if body is None:  # no source: every tensor argument but the outputs Inductor declares mutated
        return [t for n, t in args.items() if n not in launch.mutated]
    return [args[p] for p in loaded_params(body, tuple(args))]


def reads(launch, kernels) -> list[TensorArg]:
    """The tensors ``launch`` reads, each view once."""
    got = _triton_reads(launch, kernels) if isinstance(launch, TritonLaunch) else _extern_reads(launch)
    return list(dict.fromkeys(got))


def reuse_distances(program: KernelProgram, traffic: Sequence[float],
                    size: Callable[[TensorArg], float]) -> list[tuple[tuple[float, float], ...]]:
    """Per launch in program order, ``((distance, bytes), ...)`` for each tensor it reads.

    Args:
        program: the program (its launches, in order, and Triton sources).
        traffic: bytes each launch moves (reads plus writes), in program order.
        size: bytes a view spans (:func:`torch_tessera.target.costmodel.view_bytes`).

    Returns:
        For each launch, one pair per tensor read: the bytes of traffic since the last launch that touched its buffer
        (:data:`NEVER` if none did) and the bytes the view spans.
    """
    clock, last = 0.0, {}
    out = []
    for launch, moved in zip(program.launches, traffic):
        got = reads(launch, program.kernels)
        out.append(tuple((clock - last[t.buffer] if t.buffer in last else NEVER, float(size(t))) for t in got))
        clock += moved
        touched = got + [t for t in _flat(list(getattr(launch, "tensor_args", {}).values()))]
        if isinstance(launch, ExternLaunch):
            touched += list(_flat(list(launch.kwargs.values()))) + list(launch.outputs)
        for t in touched:
            last[t.buffer] = clock
    return out


def l2_bytes_read(reuse: Sequence[tuple[float, float]], capacity: float) -> float:
    """Bytes of the reads ``reuse`` (:func:`reuse_distances`, one launch) an L2 keeping ``capacity`` bytes serves."""
    return sum(min(b, max(0.0, capacity - d)) for d, b in reuse)
