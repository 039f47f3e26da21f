"""Where the backend's plan takes its kernel costs from (option ``costs``), as one call: :func:`choose_costs`."""

from __future__ import annotations

from typing import Sequence

from torch_tessera.lowering.program import KernelProgram
from torch_tessera.target.costs import CostTable, Topology
from torch_tessera.target.devices import DeviceSpec


def choose_costs(program: KernelProgram, specs: Sequence[DeviceSpec], costs: str) -> tuple[CostTable, Topology]:
    """Kernel costs and links for planning ``program`` on ``specs``.

    Args:
        program: the lowered program.
        specs: the devices, in the order of option ``devices``.
        costs: option ``costs`` (:data:`torch_tessera.options.COSTS`). ``"model"`` and ``"auto"`` both give the
            roofline cost model of the devices' specs today; the table's ``source`` says so, and
            :func:`torch_tessera.explain` reports it.

    Returns:
        ``(costs, topology)``, the cost table's ``source`` naming where its numbers come from.
    """
    from torch_tessera.backend.pipeline import estimate

    return estimate(program, specs)
