"""Data types of the PTX stage: compiled PTX and the per-parameter access summary that crosses to ``graph/``.

A :class:`KernelAccess` says, for every pointer parameter of one Triton kernel, whether the kernel reads it, writes it,
both or neither, whether it does so atomically, whether its offsets depend on loaded data, and (when the address is an
affine function of block/thread ids and loop counters) which bytes relative to the parameter's pointer it can touch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from torch_tessera.errors import PTXCompileError, TargetDisagreementError  # noqa: F401  (re-exported)






class AccessMode(str, enum.Enum):
    """How a kernel uses the memory behind one pointer parameter."""

    UNTOUCHED = "untouched"
    READ = "read"
    WRITE = "write"
    READ_WRITE = "read-write"

    @property
    def reads(self) -> bool:
        return self in (AccessMode.READ, AccessMode.READ_WRITE)

    @property
    def writes(self) -> bool:
        return self in (AccessMode.WRITE, AccessMode.READ_WRITE)

    @staticmethod
    def of(reads: bool, writes: bool) -> "AccessMode":
        if reads and writes:
            return AccessMode.READ_WRITE
        if writes:
            return AccessMode.WRITE
        return AccessMode.READ if reads else AccessMode.UNTOUCHED


@dataclass(frozen=True)
class CompiledPTX:
    """PTX of one kernel for one target, with the kernel's runtime name for every PTX ``.param``.

    Attributes:
        kernel: kernel name (the PTX ``.entry`` name).
        target: compute capability, e.g. ``80`` for sm_80, ``90`` for sm_90(a).
        ptx: the PTX text.
        param_names: runtime parameter name of each PTX ``.param`` in order; Triton's trailing scratch pointers are
            named ``"<scratch0>"``, ``"<scratch1>"``.
        config: the meta-parameters it was compiled with (block sizes, ``num_warps``, ``num_stages``).
    """

    kernel: str
    target: int
    ptx: str
    param_names: tuple[str, ...]
    config: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ParamAccess:
    """Access summary of one pointer parameter.

    Attributes:
        name: runtime parameter name (``in_ptr0``, ``out_ptr1``, ``in_out_ptr0``...).
        mode: read / write / read-write / untouched, over all threads of the launch.
        atomic: an ``atom``/``red`` (or a bulk reduce) touches it.
        data_dependent: some address through it has an offset computed from loaded data (gather/scatter); its
            extent is then the whole view the launch passes.
        indirect: values loaded through it are used as addresses (it holds pointers); those accesses cannot be
            attributed to a parameter and make the kernel :attr:`KernelAccess.indirect`.
        extent: half-open byte range ``[start, end)`` relative to the parameter's pointer that the launch can touch,
            when every address through it is affine in block/thread ids and loop counters; ``None`` otherwise.
            Computed for one grid and one set of scalar arguments (see :func:`torch_tessera.ptx.extent`).
        notes: reasons the summary is conservative (unknown instructions), empty when it is exact.
    """

    name: str
    mode: AccessMode
    atomic: bool = False
    data_dependent: bool = False
    indirect: bool = False
    extent: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelAccess:
    """Access summary of one kernel: one :class:`ParamAccess` per pointer parameter.

    Attributes:
        kernel: kernel name.
        params: pointer parameters in signature order (scalars and Triton's scratch pointers are left out).
        indirect: some memory access has an address derived from no parameter (a pointer loaded from memory); the
            kernel may touch any buffer, so the scheduler must keep it with its neighbours.
        unknown: opcodes the analysis did not know that touched pointer-derived registers (their parameters were made
            read-write).
        targets: compute capabilities whose PTX agreed on this summary.
    """

    kernel: str
    params: tuple[ParamAccess, ...]
    indirect: bool = False
    unknown: tuple[str, ...] = ()
    targets: tuple[int, ...] = ()

    @property
    def by_name(self) -> dict[str, ParamAccess]:
        return {p.name: p for p in self.params}

    @property
    def reads(self) -> frozenset[str]:
        return frozenset(p.name for p in self.params if p.mode.reads)

    @property
    def writes(self) -> frozenset[str]:
        return frozenset(p.name for p in self.params if p.mode.writes)

    @property
    def unsure(self) -> bool:
        """The summary may miss accesses: the scheduler should not cut this kernel away from its neighbours."""
        return self.indirect

    @property
    def unsure_reason(self) -> str:
        if not self.indirect:
            return ""
        holders = [p.name for p in self.params if p.indirect]
        via = f" (pointers loaded through {', '.join(holders)})" if holders else ""
        return f"kernel {self.kernel} accesses memory through an address derived from no parameter{via}"

    def summary(self) -> tuple:
        """What must agree across targets: modes and flags, not extents (vector widths differ per target)."""
        return (
            tuple((p.name, p.mode, p.atomic, p.data_dependent, p.indirect) for p in self.params),
            self.indirect,
        )
