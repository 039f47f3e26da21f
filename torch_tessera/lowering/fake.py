"""Lower a full-size model without its weights: a meta-device model, FakeTensor parameters, ``torch.export``.

Planning a Llama-3.1-8B on a laptop needs its kernel program, not its 16 GB of weights: every parameter and input is a
FakeTensor (shape, dtype, device, no storage), the model is exported to an ATen graph whose placeholders are the
parameters, buffers and inputs, and that graph is lowered like any other (Triton kernels are generated for CPU tensors,
as for the interpreter; nothing is executed).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from torch_tessera.compat.torch_fake import drop_scalar_reads
from torch_tessera.errors import LoweringError
from torch_tessera.lowering.capture import CapturedGraph

log = logging.getLogger(__name__)


def _fake_like(fake_mode: Any, t: torch.Tensor, device: str) -> torch.Tensor:
    with fake_mode:
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)


def lower_without_weights(
    build: Callable[[], tuple[torch.nn.Module, Sequence[torch.Tensor]]],
    device: str = "cpu",
) -> CapturedGraph:
    """Capture the kernel program of a model built on the meta device, with fake weights.

    Args:
        build: returns ``(module, example_inputs)``; it is called under ``torch.device("meta")`` so nothing is
            allocated (example inputs may be meta tensors; only their shapes and dtypes matter).
        device: device type the program is lowered for (``"cpu"``: Triton kernels generated for CPU tensors).

    Returns:
        The captured program (no kernel objects are needed to plan).

    Raises:
        LoweringError: export or Inductor failed.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export.graph_signature import InputKind

    from torch_tessera.lowering import lower

    t0 = time.perf_counter()
    with torch.device("meta"):
        model, inputs = build()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(_fake_like(fake_mode, p, device), requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = _fake_like(fake_mode, b, device)
    fake_inputs = tuple(_fake_like(fake_mode, x, device) for x in inputs)
    try:
        with fake_mode:
            ep = torch.export.export(model, fake_inputs, strict=False)
    except Exception as e:  # noqa: BLE001 - the border with torch.export
        raise LoweringError(f"torch.export failed on the fake model: {type(e).__name__}: {_readable(e)}") from e
    t_export = time.perf_counter() - t0
    gm = ep.graph_module
    dropped = drop_scalar_reads(gm)
    if dropped:
        log.debug("dropped %d nodes of scalar reads and checks export had specialised", dropped)
    state = {**ep.state_dict, **ep.constants}
    example: list[Any] = []
    flags: list[bool] = []
    user = iter(fake_inputs)
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            example.append(next(user))
            flags.append(False)
        else:
            example.append(state[spec.target])
            flags.append(spec.kind == InputKind.PARAMETER)
    captured: list[CapturedGraph] = []
    with fake_mode:
        lower(gm, example, lambda c: captured.append(c) and None, parameter_flags=flags)
    if len(captured) != 1:
        raise LoweringError(f"expected one inference graph, Inductor compiled {len(captured)}")
    log.info("lowered without weights in %.1f s (export %.1f s): %d launches", time.perf_counter() - t0, t_export,
             len(captured[0].program.launches))
    return captured[0]


def _readable(error: Exception, max_lines: int = 12) -> str:
    """``error``'s message without the printed FX graphs torch.export puts in it (``def forward(...)`` and its body:
    hundreds of lines of buffer annotations), at most ``max_lines`` lines: what failed and where, not the graph."""
    lines, in_graph = [], False
    for line in str(error).splitlines():
        if line.lstrip().startswith(("def forward(", "class GraphModule(")):
            in_graph = True
            continue
        if in_graph and (not line.strip() or line.startswith((" ", "\t"))):
            continue
        in_graph = False
        if line.strip() and len(line) <= 400:
            lines.append(line)
    return "\n".join(lines[:max_lines]) + ("\n..." if len(lines) > max_lines else "")
