"""CUDA-core work of an Inductor Triton launch, read from the kernel's source and its launch configuration.

A pointwise or reduction kernel issues, for every index of its iteration space, one instruction per statement of its
body: each ``tmpN = ...`` line, each ``tl.load`` / ``tl.store``, and a library call (``libdevice``, ``tl_math``,
``triton_helpers``: tanh, exp, rsqrt, Welford steps) as :data:`LIBRARY_CALL_OPS` instructions. Masked-off lanes of a
block issue too, so the iteration space counts whole blocks: the grid times the ``XBLOCK`` / ``YBLOCK`` tile, and the
reduction length rounded up to ``R0_BLOCK`` (Triton block sizes are powers of two; a persistent reduction holds the
whole row, rounded up to the next power of two).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

#: Instructions of one library call (a libdevice transcendental, a Welford step: a division and a few FMAs), the
#: order of magnitude of their SASS sequences; one figure for all of them.
LIBRARY_CALL_OPS = 8

_ASSIGN = re.compile(r"^\s*((?:tmp\w+\s*,\s*)*tmp\w+)\s*=(?!=)\s*(.*)$")
_TMP = re.compile(r"\btmp\w+")
_MEMORY = re.compile(r"\btl\.(?:load|store)\(")
_LIBRARY = re.compile(r"\b(?:libdevice|tl_math|triton_helpers)\.\w+\(")
#: Calls that reduce a block's elements to one value per row (what follows on their result runs once per row).
_REDUCE = re.compile(r"\b(?:tl\.sum|tl\.max|tl\.min|triton_helpers\.(?:max2|min2|welford|prod))\(")


def kernel_body(source: str, kernel: str) -> str | None:
    """The text of ``kernel``'s ``def`` in Inductor's module ``source``; ``None`` if it is not there."""
    parts = source.split(f"def {kernel}(", 1)
    return parts[1] if len(parts) == 2 else None


def ops_per_element(body: str) -> int:
    """Instructions issued per index of the iteration space (module docstring), at least 1.

    A statement counts once per element (one that loads counts its load and itself: the conversion to fp32), a
    library call in it :data:`LIBRARY_CALL_OPS` times; constants
    (``tl.full``) count nothing, and a statement on per-row values only (the result of a reduction, constants, and
    what is computed from them alone, such as a norm's ``rsqrt`` of the mean) runs once per row and counts nothing
    per element. Every load and store counts one.
    """
    per_row: set[str] = set()
    ops = len(_MEMORY.findall(body))
    for line in body.splitlines():
        m = _ASSIGN.match(line)
        if m is None:
            continue
        targets = [t.strip() for t in m.group(1).split(",")]
        expr = m.group(2)
        if expr.startswith("tl.full("):
            per_row.update(targets)
            continue
        refs = set(_TMP.findall(expr))
        if _REDUCE.search(expr) or ("tl.load(" not in expr and refs and refs <= per_row):
            per_row.update(targets)
            ops += 1 if _REDUCE.search(expr) else 0  # the reduction adds each element once
            continue
        ops += 1 + LIBRARY_CALL_OPS * len(_LIBRARY.findall(expr))
    return max(1, ops)


def loaded_params(body: str, params: tuple[str, ...]) -> tuple[str, ...]:
    """The parameters among ``params`` the body loads from (a mutated one that is also loaded is read and written)."""
    return tuple(p for p in params if re.search(rf"\btl\.load\(\s*{re.escape(p)}\b", body))


def issued_elements(blocks: int, config: Mapping[str, int], reduction: int, elements: int) -> int:
    """Indices a grid of ``blocks`` CTAs issues, masked-off lanes included (module docstring).

    Args:
        blocks: CTAs of the grid.
        config: the launch's meta-parameters (``XBLOCK``, ``YBLOCK``, ``R0_BLOCK``).
        reduction: length of the reduction dimension (``r0_numel``); 1 for a pointwise kernel.
        elements: the iteration space without padding, returned when the tile is unknown.
    """
    tile = config.get("XBLOCK", 0) * config.get("YBLOCK", 1) * config.get("ZBLOCK", 1)
    if not blocks or not tile:
        return elements
    rblock = config.get("R0_BLOCK") or (1 << max(0, reduction - 1).bit_length())
    padded = blocks * tile * math.ceil(reduction / rblock) * rblock
    return max(elements, padded)
