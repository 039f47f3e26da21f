"""Any placement computes what eager PyTorch computes: random placements over two CPU virtual devices.

Each virtual device has its own buffer pool, fresh allocations are filled with NaN bytes, and every cut edge is a real
copy: a dependency the DAG misses, or a copy the runtime skips, shows up as a wrong value. The number of cut edges
transferred is checked against the placement's cut RAW edges, so a silent local recompute cannot pass.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.backend.test_models_equal_eager import SDPAAttention, StatefulCounter
from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.models import MLP, build_model
from torch_tessera.runtime.runner import random_placement
from torch_tessera.runtime.schedule import cut_edge_count

PLACEMENTS = 100

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


class MoE(torch.nn.Module):
    """Router, top-2 gating, per-expert gather and scatter-add."""

    def __init__(self, dim: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.router = torch.nn.Linear(dim, experts)
        self.w = torch.nn.Parameter(torch.randn(experts, dim, dim) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x), dim=-1)
        top, idx = probs.topk(2, dim=-1)
        out = torch.zeros_like(x)
        for k in range(2):
            y = torch.bmm(x.unsqueeze(1), self.w[idx[:, k]]).squeeze(1)
            out = out.index_add(0, torch.arange(x.shape[0]), y * top[:, k : k + 1])
        return out


def _models():
    torch.manual_seed(0)
    llama, llama_in = build_model("llama", "tiny")
    return {
        "mlp": (MLP(32, 64).eval(), (torch.randn(8, 32),)),
        "sdpa": (SDPAAttention().eval(), (torch.randn(2, 8, 32),)),
        "explicit_softmax": (SDPAAttention(explicit=True).eval(), (torch.randn(2, 8, 32),)),
        "state": (StatefulCounter(), (torch.randn(4, 16),)),
        "moe": (MoE().eval(), (torch.randn(6, 16),)),
        "llama": (llama, llama_in),
    }


MODELS = _models()


@pytest.mark.parametrize("name", list(MODELS))
def test_random_placements_equal_eager(name):
    model, inputs = MODELS[name]
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    eager = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), eager(*inputs))  # compiles; everything on device 0
        runners = backend.executors
        assert len(runners) == 1
        runner = runners[0]
        placements_with_cuts = 0
        for seed in range(PLACEMENTS):
            placement = random_placement(runner.dag, 2, seed)
            runner.set_placement(placement)
            before = {k: v.clone() for k, v in model.state_dict().items()}
            got = compiled(*inputs)
            eager.load_state_dict(before)  # eager from the same state (state buffers are updated in place)
            want = eager(*inputs)
            torch.testing.assert_close(got, want, msg=lambda m: f"placement seed {seed}: {m}")
            torch.testing.assert_close(model.state_dict(), eager.state_dict(), msg=lambda m: f"state, seed {seed}: {m}")
            ex = runner.executor
            expected = cut_edge_count(runner.dag, placement)
            assert ex.cut_edges_transferred == expected, (seed, ex.cut_edges_transferred, expected)
            assert ex.launches_executed == len(runner.program.launches)
            placements_with_cuts += expected > 0
        assert placements_with_cuts >= PLACEMENTS // 4  # the random placements really did cut edges
