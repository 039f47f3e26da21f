"""A backend wrapper that keeps what the tessera backend installs: for tests, benchmarks and inspection."""

from __future__ import annotations

from typing import Any, Sequence

import torch


class RecordingBackend:
    """``torch.compile(m, backend=RecordingBackend(**options))``: the tessera backend, remembering its results.

    Attributes:
        options: the options passed on (``fallback`` defaults to ``"raise"`` here, so nothing is hidden).
        compiled: the callable returned for each Dynamo graph.
    """

    def __init__(self, **options: Any) -> None:
        self.options = {"fallback": "raise", **options}
        self.compiled: list[Any] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from torch_tessera.backend import tessera_backend

        fn = tessera_backend(gm, example_inputs, options=self.options)
        self.compiled.append(fn)
        return fn

    @property
    def executors(self) -> list:
        """The executor (or multi-device runner) of every captured program, in compile order."""
        return [e for fn in self.compiled for e in getattr(fn, "tessera_executors", [])]

    @property
    def programs(self) -> list:
        """The captured kernel programs, in compile order."""
        return [e.program for e in self.executors]
