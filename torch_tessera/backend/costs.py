"""Where the backend's plan takes its kernel costs from, as one call: :func:`choose_costs` (the roofline cost model of
the devices' specs today; measured costs on real GPUs are the open half of issue 24's item 2)."""

from __future__ import annotations

from typing import Sequence

from torch_tessera.lowering.program import KernelProgram
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.target.devices import DeviceSpec


def choose_costs(program: KernelProgram, specs: Sequence[DeviceSpec]) -> tuple[CostTable, Topology]:
    """Kernel costs and links for planning ``program`` on ``specs``: the roofline cost model; the table's ``source``
    says so, and :func:`torch_tessera.explain` reports it.

    Args:
        program: the lowered program.
        specs: the devices, in the order of option ``devices``.

    Returns:
        ``(costs, topology)``, the cost table's ``source`` naming where its numbers come from.
    """
    from torch_tessera.backend.pipeline import estimate

    return estimate(program, specs)
