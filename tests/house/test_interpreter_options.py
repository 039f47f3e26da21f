"""The CPU suite runs the Triton interpreter without its overflow sanitizer (tests/conftest.py), and that changes no
result: with ``debug`` off the sanitizer's checks are computed and never asserted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.conftest import TEST_DEVICE

cpu_only = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the Triton interpreter runs on the CPU suite only")


@cpu_only
def test_the_cpu_suite_runs_the_interpreter_without_the_sanitizer():
    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    assert options.debug is False and options.sanitize_overflow is False, options


@cpu_only
def test_int32_arithmetic_that_overflows_gives_the_same_values_with_the_sanitizer_on_and_off():
    """A kernel whose int32 add, sub and mul wrap: with the sanitizer on (Triton's default) it neither raises nor
    computes anything else than with it off, and both wrap as numpy's int32 does."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    @triton.jit
    def wrap(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        mask = i < n
        x = tl.load(x_ptr + i, mask=mask)
        tl.store(out_ptr + i, (x * 7 + 2_000_000_000) - (-2_000_000_000), mask=mask)

    x = torch.tensor([0, 1, 2**30, 2**31 - 1, -(2**31), 123_456_789, -5, 2**29], dtype=torch.int32)
    with np.errstate(over="ignore"):
        want = (x.numpy() * np.int32(7) + np.int32(2_000_000_000)) - np.int32(-2_000_000_000)
    builder = interpreter.interpreter_builder
    saved = builder.options
    got = {}
    try:
        for sanitize in (True, False):
            builder.options = dataclasses.replace(saved, sanitize_overflow=sanitize)
            out = torch.empty_like(x)
            wrap[(1,)](x, out, x.numel(), BLOCK=8)
            got[sanitize] = out.numpy().copy()
    finally:
        builder.options = saved
    assert np.array_equal(got[True], got[False]) and np.array_equal(got[False], want), (got, want)
    assert not np.array_equal(want.astype(np.int64), x.numpy().astype(np.int64) * 7 + 4_000_000_000)  # it wrapped


@cpu_only
def test_our_interpreted_launches_run_without_the_sanitizer_and_restore_it():
    """The library turns the sanitizer off only around its own interpreted launches (``interpreter_libdevice``) and
    puts the user's options back after: no leaked process state."""
    from triton.runtime import interpreter

    from torch_tessera.compat.triton import interpreter_libdevice

    builder = interpreter.interpreter_builder
    saved = builder.options
    try:
        builder.options = dataclasses.replace(saved, sanitize_overflow=True)  # as a user's process has it
        with interpreter_libdevice():
            assert builder.options.sanitize_overflow is False
            with interpreter_libdevice():  # re-entrant
                assert builder.options.sanitize_overflow is False
            assert builder.options.sanitize_overflow is False
        assert builder.options.sanitize_overflow is True
        builder.options = dataclasses.replace(saved, sanitize_overflow=True, debug=True)  # checks can fire: kept
        with interpreter_libdevice():
            assert builder.options.sanitize_overflow is True
    finally:
        builder.options = saved
