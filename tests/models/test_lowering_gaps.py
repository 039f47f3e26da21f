"""Lowering gaps found while compiling the registry models, kept as regression tests once fixed."""

from __future__ import annotations

import torch

from tests.conftest import RecordingBackend


def test_graph_without_kernels_lowers():
    def cast_to_own_dtype(x: torch.Tensor) -> torch.Tensor:
        return x.type(torch.float32)

    torch._dynamo.reset()
    backend = RecordingBackend()  # fallback="raise"
    x = torch.randn(4)
    out = torch.compile(cast_to_own_dtype, backend=backend, dynamic=False)(x)
    torch.testing.assert_close(out, x)
    assert backend.executors == []  # nothing to launch, so no program was captured (Qwen2-VL's vision tower)
