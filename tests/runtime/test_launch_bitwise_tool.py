"""The launch-by-launch comparison of ``bench/gpu_launch_bitwise.py`` (``torch_tessera.measure.launch_bitwise``), on
CPU virtual devices: equal devices report no differing launch, and a device that computes differently is caught at the launch
that does it."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TEST_DEVICE
from tests.runtime.test_pipelining import _compile
from torch_tessera.lowering.program import TensorArg, TritonLaunch
from torch_tessera.measure import launch_bitwise as gpu_launch_bitwise
from torch_tessera.models import MLP
from torch_tessera.runtime import executor

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


def _program_and_inputs():
    torch.manual_seed(0)
    runner, args = _compile(MLP(32, 64).eval(), (torch.randn(8, 32),))
    return runner.program, [a.clone() if isinstance(a, torch.Tensor) else a for a in args], runner.executor.launchers[0]


def test_equal_devices_report_no_differing_launch():
    program, inputs, home = _program_and_inputs()
    res = gpu_launch_bitwise.compare_launches(program, inputs, home, torch.device("cpu"), ["cpu:1"])
    for alt in ("cpu:fresh", "cpu:1"):
        row = res["alternates"][alt]
        assert row["compared"] == len(program.launches) and row["differing"] == 0


def test_a_launch_that_computes_differently_elsewhere_is_named(monkeypatch):
    program, inputs, home = _program_and_inputs()
    target = next(l for l in program.launches if isinstance(l, TritonLaunch))  # the first Triton launch
    written = [a for n, a in zip(target.param_names, target.args) if isinstance(a, TensorArg) and "out" in n]
    assert written, "the first Triton launch names no output parameter"

    class OffByOne(executor.KernelLauncher):  # every launcher the tool builds computes this launch differently
        def launch(self, launch, pool, stream=None):
            result = super().launch(launch, pool, stream)
            if launch.index == target.index:
                pool.view(written[0]).add_(1.0)
            return result

    monkeypatch.setattr(executor, "KernelLauncher", OffByOne)
    res = gpu_launch_bitwise.compare_launches(program, inputs, home, torch.device("cpu"), ["cpu:1"])
    row = res["alternates"]["cpu:1"]
    assert row["differing"] >= 1
    first = row["first"][0]
    assert first["index"] == target.index and first["what"] == target.kernel
    assert first["max_abs_diff"] == pytest.approx(1.0, rel=1e-5)
