"""The input checks of a captured replay's call, done in full once per distinct set of inputs and then confirmed by a
cheap fingerprint (:class:`CheckedInputs`).

A captured graph holds raw addresses, so before each replay its caller's inputs must be what the capture saw: the
right number of micro-batches and inputs, each tensor input with the shape and strides the program was lowered for,
the weights shared by every micro-batch, the micro-batches' state storages disjoint, and the inputs bound at capture
at their capture-time addresses. Checking all of that per call costs ~1 us per input and micro-batch in Python, on a
step of a few milliseconds. Calls of a serving loop or a benchmark pass the very same tensors again, so after a full
check the fingerprint of a call is: the same input objects, position by position (tensors watched through weak
references, so a tensor the caller drops, such as a finished request's KV cache, is freed at once, and a new object at
a recycled address never passes for it), and every distinct tensor among them still at the same address with the same
sizes and strides (``x.set_()``, ``x.resize_()``, ``x.unsqueeze_()`` or ``p.data = ...`` on the same object change one of
them). Anything else is checked in full again. The inputs copied into the graph's static storage (token ids, latents)
may be new tensors at every call: they are left out of the fingerprint and checked at every call (their shapes, and
the state storages' disjointness where the program has state).
"""

from __future__ import annotations

import operator
import weakref
from itertools import chain
from typing import Any, Callable, Sequence

import torch

from torch_tessera.lowering.program import TensorArg
from torch_tessera.runtime.executor import check_input_tensor

_ptr = torch.Tensor.data_ptr
_size = torch.Tensor.size
_stride = torch.Tensor.stride


def input_specs(program: Any, skip: frozenset[str] = frozenset(),
                positions: Sequence[int] | None = None) -> list[tuple[int, TensorArg]]:
    """``(position, spec)`` of the program's tensor inputs that :func:`check_input_shapes` checks.

    Args:
        program: the lowered program (its ``inputs``).
        skip: buffers not read from the caller's tensor at a replay (weights placed on another device at setup).
        positions: only these input positions (default: all).
    """
    wanted = None if positions is None else set(positions)
    return [(i, s) for i, s in enumerate(program.inputs) if isinstance(s, TensorArg) and s.buffer not in skip
            and (wanted is None or i in wanted)]


def check_input_shapes(specs: Sequence[tuple[int, TensorArg]], batches: Sequence[Sequence[Any]]) -> None:
    """Raise :class:`~torch_tessera.errors.TesseraError` (:func:`~torch_tessera.runtime.executor.check_input_tensor`)
    unless the tensor input at each position of ``specs`` (:func:`input_specs`) has,
    in every micro-batch, the sizes and strides the program was lowered for (what binding an input checks on every
    eager call; a graph replay binds nothing).

    Args:
        specs: ``(position, spec)`` pairs to check.
        batches: one input list per micro-batch, each as long as the program's inputs (checked before).
    """
    for m, batch in enumerate(batches):
        for i, spec in specs:
            check_input_tensor(spec, batch[i], i, f"micro-batch {m}: ")


class CheckedInputs:
    """The last fully checked call's inputs and their fingerprint (the module docstring).

    Args:
        check: the full check, ``check(batches) -> batches as lists``; raises on bad input.
        fresh: input positions a caller may pass new tensors for at every call (INPUT-kind inputs copied into the
            graph's static storage: token ids, latents); they are left out of the fingerprint and checked at every
            call by ``check_fresh`` instead.
        check_fresh: ``check_fresh(batches)`` raises on bad inputs at the ``fresh`` positions (and whatever depends
            on them) when the other positions matched the fingerprint.

    Attributes:
        full_checks: calls checked in full so far (a test asserts the fast path is taken, and left when it must be).
    """

    def __init__(self, check: Callable[[Sequence[Sequence[Any]]], list[list]], fresh: Sequence[int] = (),
                 check_fresh: Callable[[list[list]], None] | None = None) -> None:
        self.check = check
        self.fresh = frozenset(fresh)
        self.check_fresh = check_fresh
        self.full_checks = 0
        self._refs: list | None = None  # the watched inputs of the last full check, flat: tensors as weak references
        self._lengths: tuple[int, ...] = ()
        self._pick: Callable[[list], Sequence[Any]] = tuple
        self._distinct: Callable[[list], Sequence[Any]] = tuple  # the distinct tensors among the flat inputs
        self._fingerprint: tuple = ()

    def __call__(self, batches: Sequence[Sequence[Any]]) -> tuple[list[list], bool]:
        """``(batches as lists, fast)``: ``fast`` when the inputs outside ``fresh`` match the last full check's
        fingerprint (then only ``check_fresh`` runs), else checked in full by ``check`` (which raises on bad input;
        the fingerprint is then kept only once :meth:`confirm` is called)."""
        batches = [b if type(b) is list else list(b) for b in batches]
        refs = self._refs
        if refs is not None and tuple(map(len, batches)) == self._lengths:
            flat = list(chain.from_iterable(map(self._pick, batches)))
            if (all(map(operator.is_, flat, map(_deref, refs)))
                    and self._measure(self._distinct(flat)) == self._fingerprint):
                if self.check_fresh is not None:
                    self.check_fresh(batches)
                return batches, True
        self.full_checks += 1
        return self.check(batches), False

    def confirm(self, batches: list[list]) -> None:
        """Keep ``batches`` (fully checked, and run: inputs bound at capture are at these addresses) as the
        fingerprint later calls are compared with."""
        watched = [i for i in range(len(batches[0]) if batches else 0) if i not in self.fresh]
        self._pick = _picker(watched)
        flat = list(chain.from_iterable(map(self._pick, batches)))
        first: dict[int, int] = {}
        for k, v in enumerate(flat):
            if isinstance(v, torch.Tensor):
                first.setdefault(id(v), k)
        self._distinct = _picker(list(first.values()))
        self._fingerprint = self._measure(self._distinct(flat))
        self._refs = [weakref.ref(v) if isinstance(v, torch.Tensor) else _Held(v) for v in flat]
        self._lengths = tuple(map(len, batches))

    def forget(self) -> None:
        """Check the next call in full (the graph was captured again: its bound addresses may differ)."""
        self._refs = None

    @staticmethod
    def _measure(tensors: Sequence[torch.Tensor]) -> tuple:
        return (list(map(_ptr, tensors)), list(map(_size, tensors)), list(map(_stride, tensors)))


class _Held:
    """A watched input that is not a tensor (an int, None), held as it is; called like a weak reference."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


def _deref(ref: Callable[[], Any]) -> Any:
    return ref()


def _picker(positions: list[int]) -> Callable[[list], Sequence[Any]]:
    """``f(batch)``: the items of ``batch`` at ``positions``, as a sequence (one C call for two or more)."""
    if len(positions) >= 2:
        return operator.itemgetter(*positions)
    return lambda batch: [batch[i] for i in positions]
