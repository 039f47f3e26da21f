"""torch_tessera: kernel-granularity disaggregation of model inference across heterogeneous GPUs.

``torch.compile(model, backend="tessera", options={...})`` lowers the model through TorchInductor into a
:class:`~torch_tessera.lowering.program.KernelProgram`, analyses what every kernel reads and writes, plans where each
kernel runs and executes the plan. Inference only, one program per static shape; a graph tessera cannot compile runs
with plain Inductor after a :class:`TesseraFallbackWarning`, and :func:`explain` says what happened to each graph.
"""

from __future__ import annotations

import logging

from torch_tessera.errors import (  # noqa: F401
    ConfigError,
    DeviceUnavailableError,
    GpuNotPresentError,
    InfeasiblePlanError,
    LoweringError,
    NotApplicableError,
    PTXParseError,
    ScheduleError,
    TesseraCacheWarning,
    TesseraError,
    TesseraFallbackWarning,
    TesseraIdleDeviceWarning,
    TesseraRecompileWarning,
    TransferTimeout,
    UnsupportedModelError,
)

__version__ = "0.1.0"

logging.getLogger("torch_tessera").addHandler(logging.NullHandler())


def _register() -> None:
    from torch_tessera.backend import register

    register()


_register()

from torch_tessera.backend.checks import InferenceOnlyError  # noqa: E402,F401  (public: the inference-only error)
from torch_tessera.backend.explain import explain  # noqa: E402,F401  (public: what tessera did with each graph)


def __getattr__(name: str):
    """``torch_tessera.hf`` without importing it first (it imports transformers, so not at ``import torch_tessera``)."""
    if name == "hf":
        import importlib

        return importlib.import_module("torch_tessera.hf")
    raise AttributeError(f"module 'torch_tessera' has no attribute {name!r}")
