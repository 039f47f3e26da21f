"""Which caller tensors a placed copy was made from: keys that tell a moved or modified static input apart."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from torch_tessera.lowering.program import KernelProgram, TensorArg


def tensor_key(t: torch.Tensor) -> tuple:
    """``(data_ptr(), _version)`` of ``t``: equal keys mean the caller passes the same tensor, not modified since by
    in-place torch ops on it or on a tensor sharing its version counter (its views made by view ops, ``detach()``).

    Writes that bypass that counter leave the key unchanged: through ``t.data`` (a tensor with a counter of its own),
    numpy or DLPack aliases of the storage, custom kernels writing it. With ``static_inputs="place"`` such a write
    leaves a placed copy stale (see :class:`~torch_tessera.runtime.placed.PlacedExecutor`; ``static_inputs="copy"``
    copies every call).

    An inference tensor (made under ``torch.inference_mode``) has no version counter: its key is
    ``(data_ptr(), None)``, which :meth:`PlacedExecutor.stale_static` always treats as stale (placed again every
    call, as the per-call copy would).
    """
    if t.is_inference():
        return (t.data_ptr(), None)
    return (t.data_ptr(), t._version)


def input_positions(program: KernelProgram, names: Any) -> tuple[tuple[int, str], ...]:
    """``(input index, buffer)`` of every graph input of ``program`` bound to one of the buffers ``names``."""
    return tuple((i, a.buffer) for i, a in enumerate(program.inputs) if isinstance(a, TensorArg) and a.buffer in names)


def static_input_keys(positions: Sequence[tuple[int, str]], inputs: Sequence[Any]) -> dict[str, tuple]:
    """Static INPUT buffer -> :func:`tensor_key` of each caller tensor bound to it (in input order), at
    ``positions`` (:func:`input_positions`): what a placed copy of it was made from. A few attribute reads per static
    input: cheap enough for every call of a replayed graph."""
    out: dict[str, tuple] = {}
    for i, name in positions:
        if isinstance(inputs[i], torch.Tensor):
            out[name] = out.get(name, ()) + (tensor_key(inputs[i]),)
    return out
