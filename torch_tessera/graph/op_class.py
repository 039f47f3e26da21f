"""Kernel classes of the DAG's nodes: the one classifier of :mod:`torch_tessera.lowering.op_class`, as DAG values.

``op_class(launch)`` is the string value of :func:`torch_tessera.lowering.op_class.classify`, which the ``af``
baseline reads from the DAG (attention on one device, the rest on the other) and the cost model uses directly, so
a launch has one class everywhere.
"""

from __future__ import annotations

from torch_tessera.lowering.op_class import OP_CLASSES, OpClass, classify
from torch_tessera.lowering.program import Launch

__all__ = ["OP_CLASSES", "OpClass", "op_class"]


def op_class(launch: Launch) -> str:
    """The class of one launch as a DAG attribute value (one of :data:`OP_CLASSES`)."""
    return classify(launch).value
