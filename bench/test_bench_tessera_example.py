"""Example pytest-benchmark suite for models compiled with tessera (the ``tessera_compile`` fixture of the
``pytest11`` plugin ``torch_tessera.pytest_plugin``).

Run (GPU: whole GPU, then a partition pair; CPU: the interpreter, plumbing only)::

    python -m pytest bench/test_bench_tessera_example.py --benchmark-json=bench_tessera.json

Each benchmark's ``extra_info["tessera"]`` in the JSON says per graph whether tessera ran, launches per device, cut
edges, the predicted step and where the costs came from.
"""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: device lists benchmarked: the model's device alone, and two devices (two CPU virtual devices on CPU)
DEVICE_SETS = {"one": None, "two": "cuda:0@104sm,cuda:0@24sm" if DEVICE == "cuda" else "cpu:0,cpu:1"}


def _mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                               torch.nn.Linear(4 * width, width)).to(DEVICE, dtype)


@pytest.mark.parametrize("devices", list(DEVICE_SETS), ids=list(DEVICE_SETS))
def test_mlp_forward(benchmark, tessera_compile, devices):
    width = 1024 if DEVICE == "cuda" else 64
    model = _mlp(width)
    x = torch.randn(32, width, device=DEVICE, dtype=next(model.parameters()).dtype)
    options = {"devices": DEVICE_SETS[devices]} if DEVICE_SETS[devices] else {}
    f = tessera_compile(model, options=options)
    with torch.no_grad():
        torch.testing.assert_close(f(x), model(x), rtol=2e-2, atol=2e-2)

        def step():
            f(x)
            if DEVICE == "cuda":
                torch.cuda.synchronize()

        benchmark.pedantic(step, rounds=20 if DEVICE == "cuda" else 3, iterations=1, warmup_rounds=2)
