"""FakeTensor constant propagation (``torch._subclasses.fake_tensor``) and what ``torch.export`` leaves of it.

Checked on torch 2.13.0 (CPU) and 2.11.0 (the GPU machine): a FakeTensorMode keeps the real value of a tensor made
from Python data inside the traced code (``torch.tensor([...])``) when it has at most
``fake_tensor.CONSTANT_NUMEL_LIMIT`` elements (1 by default), and runs an op whose inputs all have values on those
values, so that ``.tolist()`` / ``.item()`` of the result give Python numbers instead of data-dependent symbols. The
module global is read at each check, so raising it for a while widens which tensors keep their values.

What export leaves in the graph of such reads (checked on the same versions): an ``aten.item`` node per value read,
with no users once the value was specialised, and an ``aten._assert_scalar`` node per ``torch._check`` of a
data-dependent value.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def constant_values(max_numel: int) -> Iterator[None]:
    """Within the block, FakeTensors made from Python data with at most ``max_numel`` elements keep their values.

    Raises:
        ValueError: ``max_numel`` < 1.
    """
    from torch._subclasses import fake_tensor

    if max_numel < 1:
        raise ValueError(f"max_numel must be >= 1, got {max_numel}")
    saved = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = max(saved, max_numel)
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved


def drop_scalar_reads(gm: torch.fx.GraphModule) -> int:
    """Remove the host-side scalar reads export left in ``gm`` once it had specialised their values.

    A model whose control flow reads small constant tensors (Qwen2-VL's image grid: its ``.tolist()`` split sizes)
    exports with those values baked in as Python ints, but ``aten.item`` nodes with no users stay in the graph, and
    ``torch._check`` calls on data-dependent values stay as ``aten._assert_scalar`` nodes. Neither is a kernel, and
    neither can be re-run on FakeTensors without values, so both are removed, and the integer work that only fed
    them with them. A graph without such reads is returned unchanged.

    Returns:
        The number of nodes removed.
    """
    aten = torch.ops.aten
    reads = (aten.item.default, aten._local_scalar_dense.default)
    checks = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten._assert_scalar.default]
    for node in checks:
        gm.graph.erase_node(node)
    unused = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in reads and not n.users]
    for node in unused:
        gm.graph.erase_node(node)
    if not checks and not unused:
        return 0
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return len(checks) + len(unused) + before - len(gm.graph.nodes)
