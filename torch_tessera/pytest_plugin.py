"""A pytest plugin (entry point ``pytest11``) for benchmarking models compiled with tessera under pytest-benchmark.

The fixture :func:`tessera_compile` compiles with ``backend="tessera"`` and, when the test ends, puts what tessera
did into ``benchmark.extra_info["tessera"]`` (saved with the benchmark's JSON): per graph, tessera or the fallback,
launches per device, cut edges, predicted step, source of the costs and the plan's summary
(:func:`torch_tessera.explain`)::

    def test_mlp(benchmark, tessera_compile):
        f = tessera_compile(model, options={"devices": "cuda:0,cuda:1"})
        with torch.no_grad():
            benchmark(f, x)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest


@pytest.fixture
def tessera_compile(benchmark: Any) -> Iterator[Callable[..., Any]]:
    """``tessera_compile(model, options=None, **compile_kwargs)``: ``torch.compile(model, backend="tessera",
    options=options, dynamic=False, **compile_kwargs)``; at teardown each compiled object's
    :func:`torch_tessera.explain` goes to ``benchmark.extra_info["tessera"]`` (one entry per compiled object, each
    ``{"explain": <text>, "graphs": [<GraphReport as JSON>]}``)."""
    import torch

    import torch_tessera

    compiled: list[Any] = []

    def compile_(model: Any, options: dict | None = None, **compile_kwargs: Any) -> Any:
        compile_kwargs.setdefault("dynamic", False)
        fn = torch.compile(model, backend="tessera", options=dict(options or {}), **compile_kwargs)
        compiled.append(fn)
        return fn

    yield compile_
    benchmark.extra_info["tessera"] = [
        {"explain": str(e), "graphs": [g.to_jsonable() for g in e]}
        for e in (torch_tessera.explain(fn) for fn in compiled)]
