"""L2 reuse from program order (target/reuse.py): distances on hand-built programs, and the predicted seconds they
change (target/kernelmodel.py)."""

import math

import pytest
import torch

from torch_tessera.lowering.program import (Buffer, BufferKind, ExternLaunch, KernelProgram, KernelSource, Provenance,
                                            ScalarArg, TensorArg, TritonLaunch)
from torch_tessera.target.costmodel import estimate_costs, program_features, view_bytes
from torch_tessera.target.kernelmodel import KernelModel
from torch_tessera.target.reuse import NEVER, l2_bytes_read, reuse_distances

N = 1 << 22  # 8 MiB of bf16 per tensor
SRC = ("@triton.jit\ndef {k}(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):\n"
       "    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)\n    tl.store(out_ptr0 + (x0), tmp0, None)\n")


def _v(buf, n=N):
    return TensorArg(buf, 0, (n,), (1,), torch.bfloat16)


def _copy(i, src, dst, n=N):
    return TritonLaunch(i, "triton_poi_fused_copy_0", ("in_ptr0", "out_ptr0", "xnumel"),
                        (_v(src, n), _v(dst, n), ScalarArg(n)), (n // 1024, 1, 1), {"XBLOCK": 1024, "num_warps": 4},
                        provenance=Provenance(("aten.copy",)))


def _program(launches, sizes):
    bufs = {b: Buffer(b, BufferKind.PARAMETER if b == "w" else BufferKind.TEMP, torch.bfloat16, n * 2, "cuda:0")
            for b, n in sizes.items()}
    kernels = {"triton_poi_fused_copy_0": KernelSource("triton_poi_fused_copy_0",
                                                       SRC.format(k="triton_poi_fused_copy_0"), {})}
    return KernelProgram(bufs, (), tuple(launches), (), kernels, "cuda:0", ())


def test_distances_follow_program_order():
    big = 1 << 26  # 128 MiB: more traffic than any L2
    prog = _program([_copy(0, "x", "y"), _copy(1, "y", "z"), _copy(2, "a", "b", big), _copy(3, "z", "c")],
                    {"x": N, "y": N, "z": N, "a": big, "b": big, "c": N})
    traffic = [f.nbytes for f in program_features(prog)]
    d = reuse_distances(prog, traffic, view_bytes)
    assert d[0] == ((NEVER, 2.0 * N),)                 # x: a program input, never touched before
    assert d[1] == ((0.0, 2.0 * N),)                   # y: written by the launch just before
    assert d[3] == ((traffic[2], 2.0 * N),)            # z: the 256 MiB copy ran in between
    assert l2_bytes_read(d[1], 25e6) == 2 * N and l2_bytes_read(d[3], 25e6) == 0.0
    assert l2_bytes_read(((20e6, 10e6),), 25e6) == 5e6  # only the part within the capacity


def test_a_read_just_written_is_faster_than_one_evicted():
    big = 1 << 26
    prog = _program([_copy(0, "x", "y"), _copy(1, "y", "z"), _copy(2, "a", "b", big), _copy(3, "z", "c")],
                    {"x": N, "y": N, "z": N, "a": big, "b": big, "c": N})
    m = KernelModel(eta_memory=0.8, dram_bytes_per_clock_per_sm=math.inf, l2_bytes_per_clock_per_sm=64.0,
                    latency_cycles=0.0, floor_s=0.0, eta_cuda=1.0)
    t = estimate_costs(prog, ["sim:h200"], model=m).seconds[:, 0]
    # launches 1 and 3 move the same bytes; 1 reads what launch 0 just wrote (L2), 3 what the big copy evicted
    assert t[1] < t[3]
    assert t[3] == pytest.approx(t[0], rel=1e-6)          # both read from DRAM
