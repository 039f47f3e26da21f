"""Shared test helpers: compile with the tessera backend and keep hold of the executors it installs."""

from __future__ import annotations

import os

#: Device the backend tests run on: "cpu" (CI, Triton interpreter) or "cuda" (the GPU machine).
TEST_DEVICE = os.environ.get("TESSERA_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU CI: Triton kernels run in the interpreter

import copy
from typing import Any, Sequence

import pytest
import torch

if TEST_DEVICE == "cpu":  # the whole CPU suite, the tests' own Triton kernels too (the library does it per launch)
    from torch_tessera.compat.triton import overflow_checks_off

    INTERPRETER_SANITIZER_OFF = overflow_checks_off() is not None

import torch_tessera  # noqa: F401  (registers the backend)
from torch_tessera.backend.recording import RecordingBackend  # noqa: F401  (re-exported for tests)


def compile_and_compare(model: torch.nn.Module, inputs: tuple, calls: int = 1, **options: Any) -> RecordingBackend:
    """Compile ``model`` with tessera, run it ``calls`` times beside an eager copy, assert equal outputs each call."""
    torch._dynamo.reset()
    model = model.to(TEST_DEVICE)
    inputs = tuple(x.to(TEST_DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs)
    eager = copy.deepcopy(model)
    backend = RecordingBackend(**options)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for _ in range(calls):
            got = compiled(*inputs)
            want = eager(*inputs)
            torch.testing.assert_close(got, want)
    return backend


@pytest.fixture
def recording_backend() -> type[RecordingBackend]:
    return RecordingBackend
