"""torch_tessera: kernel-granularity disaggregation of model inference across heterogeneous GPUs.

``torch.compile(model, backend="tessera", options={...})`` lowers the model through TorchInductor into a
:class:`~torch_tessera.lowering.program.KernelProgram`, analyses what every kernel reads and writes, plans where each
kernel runs and executes the plan.
"""

from __future__ import annotations

import logging

from torch_tessera.errors import (  # noqa: F401
    ConfigError,
    DeviceUnavailableError,
    InfeasiblePlanError,
    LoweringError,
    PTXParseError,
    TesseraError,
    TransferTimeout,
    UnsupportedModelError,
)

__version__ = "0.1.0"

logging.getLogger("torch_tessera").addHandler(logging.NullHandler())


def _register() -> None:
    from torch_tessera.backend import register

    register()


_register()
