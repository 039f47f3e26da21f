"""PTX access analysis: which bytes each Triton kernel reads and writes, read from its PTX.

Entry points:

- :func:`analyze_kernel`: one kernel -> :class:`KernelAccess`, compiled for several targets that must agree.
- :func:`analyze_program`: every Triton kernel of a :class:`~torch_tessera.lowering.program.KernelProgram`, compiled in
  one batch.
- :func:`access_from_ptx`: the summary of PTX you already have (a dump, a hand-written snippet).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from torch_tessera.lowering.program import KernelProgram, KernelSource
from torch_tessera.ptx.analysis import RawAccess, analyze_function
from torch_tessera.ptx.compile import DEFAULT_TARGETS, compile_many, compile_ptx
from torch_tessera.ptx.parser import parse_ptx
from torch_tessera.ptx.types import (AccessMode, CompiledPTX, KernelAccess, ParamAccess, PTXCompileError,
                                     TargetDisagreementError)

__all__ = ["AccessMode", "CompiledPTX", "KernelAccess", "ParamAccess", "PTXCompileError", "TargetDisagreementError",
           "access_from_ptx", "analyze_kernel", "analyze_program", "compile_ptx"]

log = logging.getLogger(__name__)


def access_from_ptx(ptx: str, param_names: Iterable[str] | None = None, kernel: str | None = None,
                    target: int | None = None) -> KernelAccess:
    """Summarise the accesses of PTX text.

    Args:
        ptx: PTX text with one ``.entry``.
        param_names: runtime name of each PTX ``.param`` (default: the PTX names). Names in ``<...>`` (Triton's
            scratch pointers) are left out of the summary, as are non-pointer params.
        kernel: name for messages (default: the entry's name).
        target: the compute capability the PTX was compiled for, recorded in ``targets``.

    Raises:
        PTXParseError: the PTX is malformed (the message names the kernel, line number and line).
    """
    fn = parse_ptx(ptx, kernel)
    names = list(param_names) if param_names is not None else [p.name for p in fn.params]
    if len(names) != len(fn.params):
        raise PTXCompileError(f"kernel {kernel or fn.name}: {len(names)} parameter names for {len(fn.params)} PTX "
                              f"params")
    raw = analyze_function(fn)
    return _summary(kernel or fn.name, fn.params, names, raw, target)


def _summary(kernel: str, params, names: list[str], raw: RawAccess, target: int | None) -> KernelAccess:
    out = []
    for p, name, a in zip(params, names, raw.params):
        if not (p.is_pointer or p.is_tensormap) or name.startswith("<"):
            continue
        out.append(ParamAccess(name=name, mode=AccessMode.of(a.reads, a.writes), atomic=a.atomic,
                               data_dependent=a.data_dependent, indirect=a.indirect, notes=tuple(a.notes)))
    return KernelAccess(kernel=kernel, params=tuple(out), indirect=raw.indirect, unknown=raw.unknown,
                        targets=() if target is None else (target,))


def _agree(kernel: str, per_target: list[KernelAccess]) -> KernelAccess:
    first = per_target[0]
    for other in per_target[1:]:
        if other.summary() != first.summary():
            diffs = [f"{a.name}: {a.mode.value}{'+atomic' * a.atomic} on sm_{first.targets[0]} vs "
                     f"{b.mode.value}{'+atomic' * b.atomic} on sm_{other.targets[0]}"
                     for a, b in zip(first.params, other.params) if a != b]
            raise TargetDisagreementError(
                f"kernel {kernel}: access summaries differ between targets ({'; '.join(diffs) or 'indirect flag'}). "
                f"This is a bug in the PTX analysis or in Triton; dump both PTX files (TESSERA_CACHE_DIR/ptx) and "
                f"report them.")
    targets = tuple(t for a in per_target for t in a.targets)
    unknown = tuple(sorted({u for a in per_target for u in a.unknown}))
    return KernelAccess(kernel=kernel, params=first.params, indirect=first.indirect, unknown=unknown, targets=targets)


def analyze_kernel(source: KernelSource, config: Mapping[str, Any], targets: Iterable[int] = DEFAULT_TARGETS
                   ) -> KernelAccess:
    """Access summary of one Triton kernel, compiled for every target in ``targets``.

    Args:
        source: the kernel (module source, signature, constants).
        config: block-size constexprs plus ``num_warps`` / ``num_stages``.
        targets: compute capabilities; the summaries of all of them must agree.

    Raises:
        PTXCompileError: Triton could not compile the kernel, or its PTX params do not match the signature.
        PTXParseError: the PTX is malformed.
        TargetDisagreementError: two targets give different summaries.
    """
    compiled = compile_many([(source, config, t) for t in targets])
    return _agree(source.name, [access_from_ptx(c.ptx, c.param_names, c.kernel, c.target) for c in compiled])


def analyze_program(program: KernelProgram, targets: Iterable[int] = DEFAULT_TARGETS) -> dict[str, KernelAccess]:
    """Access summary of every Triton kernel a program launches, by kernel name (one compile batch for all).

    A kernel launched with several configs is analysed with the first; the access modes do not depend on the config.
    """
    targets = tuple(targets)
    configs: dict[str, Mapping[str, Any]] = {}
    for launch in program.triton_launches:
        configs.setdefault(launch.kernel, launch.config)
    jobs = [(program.kernels[k], c, t) for k, c in configs.items() for t in targets]
    compiled = compile_many(jobs)
    out = {}
    for i, kernel in enumerate(configs):
        per = compiled[i * len(targets):(i + 1) * len(targets)]
        out[kernel] = _agree(kernel, [access_from_ptx(c.ptx, c.param_names, c.kernel, c.target) for c in per])
    log.info("analysed %d kernels on targets %s: %d unsure", len(out), targets, sum(a.unsure for a in out.values()))
    return out
