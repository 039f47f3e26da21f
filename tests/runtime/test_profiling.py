"""``runtime.profiling.profile_launches`` on a CPU virtual device: real inputs or stand-ins give a column over every
launch, the caller's tensors are never written, and a fully cached program runs nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_tessera.runtime.profiling as profiling
from torch_tessera.backend.recording import RecordingBackend
from torch_tessera.runtime.executor import KernelLauncher
from torch_tessera.target.devices import open_device
from torch_tessera.target.profiler import ProfileCache


@pytest.fixture(scope="module")
def lowered():
    """A program with a Triton kernel, an extern GEMM and an in-place state update, and its example inputs."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("state", torch.zeros(4, 8))

        def forward(self, x):
            y = torch.relu(self.lin(x))
            self.state.add_(y)
            return y * 2

    torch._dynamo.reset()
    torch.manual_seed(0)
    m, x = M(), torch.randn(4, 8)
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    with torch.no_grad():
        torch.compile(m, backend=backend, dynamic=False)(x)
    (executor,) = backend.executors
    return executor.program, executor.kernel_objects, m, x


def test_stand_ins_and_real_inputs_time_every_launch(lowered, tmp_path):
    program, objects, m, x = lowered
    dev = open_device("cpu:0")
    launcher = KernelLauncher(program, objects, dev.torch_device)
    col = profiling.profile_launches(program, dev, launcher, cache=ProfileCache(tmp_path), warmup=0, repeats=1)
    assert col.kernels == tuple(launch.index for launch in program.launches)
    assert np.all(col.seconds > 0) and col.measured >= 2 and col.cache_hits == 0

    inputs = [torch.empty_strided(a.size, a.stride, dtype=a.dtype).normal_() for a in program.inputs]
    before = [t.clone() for t in inputs]
    col = profiling.profile_launches(program, dev, launcher, inputs=inputs, cache=ProfileCache(tmp_path / "real"),
                                     warmup=1, repeats=1)
    assert col.measured >= 2 and np.all(col.seconds > 0)
    assert any(program.buffers[a.buffer].kind.value == "state" for a in program.inputs)  # one input is written
    for got, want in zip(inputs, before):
        torch.testing.assert_close(got, want)  # the caller's tensors were copied, not written


def test_a_cached_program_allocates_and_runs_nothing(lowered, tmp_path, monkeypatch):
    program, objects, _, _ = lowered
    dev = open_device("cpu:0")
    launcher = KernelLauncher(program, objects, dev.torch_device)
    first = profiling.profile_launches(program, dev, launcher, cache=ProfileCache(tmp_path), warmup=0, repeats=1)

    def no_pool(*args, **kwargs):
        raise AssertionError("a fully cached program must not set up buffers")

    monkeypatch.setattr(profiling, "_setup_pool", no_pool)
    again = profiling.profile_launches(program, dev, launcher, cache=ProfileCache(tmp_path), warmup=0, repeats=1)
    assert again.measured == 0 and again.cache_hits == first.measured
    np.testing.assert_array_equal(again.seconds, first.seconds)
