"""Profiler and cost model on a program lowered by Inductor (CPU: Triton kernels run in the interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch_tessera.lowering import lower
from torch_tessera.target.costmodel import KernelClass, estimate_costs, launch_features
from torch_tessera.target.devices import open_device
from torch_tessera.runtime.executor import BufferPool, KernelLauncher
from torch_tessera.target.profiler import ProfileCache, profile_program, to_cost_table


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64)

    def forward(self, x):
        return (self.down(torch.relu(self.up(self.norm(x)))) + x).softmax(-1)


@pytest.fixture(scope="module")
def captured():
    got = []
    with torch.no_grad():
        lower(torch.fx.symbolic_trace(Block().eval()), [torch.randn(32, 64)], lambda c: got.append(c))
    return got[0]


def test_classes_of_a_lowered_block(captured):
    classes = [launch_features(l).kernel_class for l in captured.program.launches]
    assert classes.count(KernelClass.GEMM) == 2
    assert KernelClass.NORM in classes and KernelClass.REDUCTION in classes and KernelClass.ELEMENTWISE in classes
    gemms = [launch_features(l) for l in captured.program.launches if launch_features(l).kernel_class == "gemm"]
    assert sorted(f.flops for f in gemms) == sorted([2 * 32 * 128 * 64 + 32 * 128, 2 * 32 * 64 * 128 + 32 * 64])


def test_profile_lowered_program_on_cpu_virtual_devices(captured, tmp_path):
    program = captured.program
    launcher = KernelLauncher(program, captured.kernel_objects)
    pool = BufferPool(torch.device("cpu"))
    for name, buf in program.buffers.items():
        pool.allocate(name, buf.nbytes)
        pool.storages[name].copy_(torch.randint(0, 60, (buf.nbytes,), dtype=torch.uint8))  # finite floats
    columns = []
    for dev in ("cpu:0", "cpu:1"):
        with open_device(dev) as d:
            columns.append(profile_program(program, d, lambda l: launcher.launch(l, pool), warmup=1, repeats=3,
                                           cache=ProfileCache(tmp_path), progress=False))
    assert columns[0].measured == len(program.launches) and columns[1].cache_hits == len(program.launches)
    table = to_cost_table(columns)
    assert table.seconds.shape == (len(program.launches), 2) and np.all(table.seconds > 0)
    model = estimate_costs(program, ["sim:a100", "sim:l40s"])
    assert model.kernels == table.kernels and np.all(np.isfinite(model.seconds))
