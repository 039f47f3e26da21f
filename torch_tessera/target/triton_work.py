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

_STATEMENT = re.compile(r"\btmp\d+\w*\s*=[^=]")
_MEMORY = re.compile(r"\btl\.(?:load|store)\(")
_LIBRARY = re.compile(r"\b(?:libdevice|tl_math|triton_helpers)\.\w+\(")


def kernel_body(source: str, kernel: str) -> str | None:
    """The text of ``kernel``'s ``def`` in Inductor's module ``source``; ``None`` if it is not there."""
    parts = source.split(f"def {kernel}(", 1)
    return parts[1] if len(parts) == 2 else None


def ops_per_element(body: str) -> int:
    """Instructions issued per index of the iteration space (module docstring), at least 1."""
    return max(1, len(_STATEMENT.findall(body)) + len(_MEMORY.findall(body))
               + LIBRARY_CALL_OPS * len(_LIBRARY.findall(body)))


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
