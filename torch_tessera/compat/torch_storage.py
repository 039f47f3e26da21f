"""Storage reference counts, read from ``torch._C`` (as ``torch._inductor.cudagraph_trees`` reads them).

Checked on torch 2.13.0 (CPU) and 2.11.0 (the GPU machine): ``torch._C._storage_Use_Count(storage._cdata)`` counts
the references to a ``StorageImpl``: one per tensor (view or not) on it, plus one for the ``UntypedStorage`` object
the call itself makes.
"""

from __future__ import annotations

import torch


def tensors_on_storage(t: torch.Tensor) -> int | None:
    """How many tensors (``t`` included, views counted) hold ``t``'s storage; None where this torch cannot say."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return None
    return int(use_count(t.untyped_storage()._cdata)) - 1  # less the UntypedStorage made for the call
