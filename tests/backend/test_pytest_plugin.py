"""The pytest plugin's ``tessera_compile`` fixture puts tessera's explanation in ``benchmark.extra_info``."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

pytest_plugins = ["pytester"]


def _plugin_args() -> list[str]:
    """``-p torch_tessera.pytest_plugin`` unless the installed package's ``pytest11`` entry point already loads it
    (pytest refuses a plugin registered twice under two names)."""
    if any(e.name == "tessera" for e in entry_points(group="pytest11")):
        return []
    return ["-p", "torch_tessera.pytest_plugin"]


def test_fixture_fills_extra_info(pytester):
    pytester.makepyfile(test_example="""
        import torch

        def test_mlp(benchmark, tessera_compile):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
            x = torch.randn(4, 16)
            f = tessera_compile(model, options={"devices": "cpu:0,cpu:1", "fallback": "raise"})
            with torch.no_grad():
                torch.testing.assert_close(f(x), model(x))
                benchmark.pedantic(f, args=(x,), rounds=2, iterations=1)
    """)
    out = pytester.path / "bench.json"
    result = pytester.runpytest_subprocess(*_plugin_args(), f"--benchmark-json={out}", "-q")
    result.assert_outcomes(passed=1)
    (bench,) = json.loads(out.read_text())["benchmarks"]
    (entry,) = bench["extra_info"]["tessera"]
    (graph,) = entry["graphs"]
    assert graph["backend"] == "tessera" and graph["reason"] is None
    assert set(graph["launches"]) <= {"cpu:0", "cpu:1"} and sum(graph["launches"].values()) > 0
    assert graph["costs"].startswith("model: roofline model") and graph["predicted_step_s"] > 0
    assert "Plan 'throughput'" in graph["plan"] and "graph 0/0: tessera" in entry["explain"]
