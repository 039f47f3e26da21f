"""Shared test helpers: compile with the tessera backend and keep hold of the executors it installs."""

from __future__ import annotations

import os

#: Device the backend tests run on: "cpu" (CI, Triton interpreter) or "cuda" (the GPU machine).
TEST_DEVICE = os.environ.get("TESSERA_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU CI: Triton kernels run in the interpreter

import copy
import dataclasses
from typing import Any, Sequence

import pytest
import torch


def _interpreter_without_dead_overflow_checks() -> bool:
    """Turn off the Triton interpreter's integer-overflow sanitizer when its ``debug`` is off; return whether it did.

    With ``sanitize_overflow`` on, every int32 add/sub/mul a kernel does in the interpreter is redone in int64 and
    compared with the int32 range, then handed to ``device_assert``, which returns at once unless ``debug`` is set
    (triton 3.7 ``language/semantic.py``: ``binary_op_sanitize_overflow_impl``, ``device_assert``). The interpreter's
    ``debug`` is always False, so that work is discarded: about 45 % of the interpreter's time on the measured bench
    (profile in docs/results/2026-12-02-s14-citime/NOTES.md). Turning it off changes no value and no check. Left as
    is when ``debug`` is on (then the check can fire) or when the interpreter's options are not where 3.7 has them.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or getattr(options, "debug", True) or \
            not getattr(options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


if TEST_DEVICE == "cpu":
    INTERPRETER_SANITIZER_OFF = _interpreter_without_dead_overflow_checks()

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
