"""``graph/``: kernel program + PTX access summaries -> dependency DAG. Entry function: :func:`build_dependency_graph`."""

from __future__ import annotations

from typing import Mapping

from torch_tessera.graph.build import LaunchAccess, build, launch_access
from torch_tessera.graph.types import OP_CLASSES, DependencyGraph, KernelNode, add_kernel
from torch_tessera.lowering.program import KernelProgram
from torch_tessera.ptx.types import KernelAccess

__all__ = ["DependencyGraph", "KernelNode", "LaunchAccess", "OP_CLASSES", "add_kernel", "build_dependency_graph",
           "launch_access"]


def build_dependency_graph(program: KernelProgram, accesses: Mapping[str, KernelAccess]) -> DependencyGraph:
    """The kernel dependency DAG of a program.

    One node per launch (keyed by its program index). Triton launches read and write their tensor arguments as the
    PTX analysis of their kernel says (byte ranges: the view's span, or the affine extent when known); extern launches
    as their op schema says. Edges: RAW with the bytes the consumer reads that the producer last wrote (per storage,
    so views, buffer reuse and in-place updates resolve to the bytes they touch), WAR and WAW for ordering. Launches
    whose accesses are not proved (indirect addressing, no summary) are marked ``unsure``.

    Args:
        program: the kernel program.
        accesses: access summary per kernel name (from :func:`torch_tessera.ptx.analyze_program`).

    Returns:
        The DAG; each node's :class:`KernelNode` is ``dag.node(index)``.
    """
    return build(program, accesses)
