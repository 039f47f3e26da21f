"""CUDA-core work of a Triton launch read from its source (target/triton_work.py) and what it changes in the
launch's features and predicted seconds."""

import dataclasses
import math

import pytest
import torch

from torch_tessera.lowering.program import KernelSource, Provenance, ScalarArg, TensorArg, TritonLaunch
from torch_tessera.target.costmodel import launch_features
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel
from torch_tessera.target.triton_work import LIBRARY_CALL_OPS, issued_elements, kernel_body, ops_per_element

GELU = '''
@triton.jit
def triton_poi_fused_gelu_0(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    x0 = xoffset + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_out_ptr0 + (x0), None).to(tl.float32)
    tmp2 = tl.full([1], 0.5, tl.float32)
    tmp3 = tmp0 * tmp2
    tmp4 = libdevice.tanh(tmp3)
    tmp5 = tmp3 * tmp4
    tl.store(in_out_ptr0 + (x0), tmp5, None)
'''
ADD = '''
@triton.jit
def triton_poi_fused_add_1(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    x0 = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp1 = tmp0 + tmp0
    tl.store(out_ptr0 + (x0), tmp1, None)
'''
RMS = '''
@triton.jit
def triton_per_fused_rms_2(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    r0_1 = tl.arange(0, R0_BLOCK)[None, :]
    tmp0 = tl.load(in_ptr0 + (r0_1 + 64*x0), None).to(tl.float32)
    tmp1 = tmp0 * tmp0
    tmp5 = tl.sum(tmp1, 1)[:, None].to(tl.float32)
    tmp6 = tl.full([1, 1], 64.0, tl.float32)
    tmp7 = (tmp5 / tmp6)
    tmp10 = libdevice.rsqrt(tmp7)
    tmp11 = tmp0 * tmp10
    tl.store(out_ptr0 + (r0_1 + 64*x0), tmp11, None)
'''


def _body(src, name):
    return kernel_body(src, name)


def test_ops_per_element_counts_statements_memory_and_library_calls():
    # gelu: load, store, the statements tmp0 (its fp32 conversion), tmp3, tmp4 (a library call) and tmp5; the
    # constant tmp2 is free
    assert ops_per_element(_body(GELU, "triton_poi_fused_gelu_0")) == 2 + 4 + LIBRARY_CALL_OPS
    assert ops_per_element(_body(ADD, "triton_poi_fused_add_1")) == 2 + 2
    # rms norm: per element the load, store, tmp0, the square, the sum's add and the final multiply; the mean and
    # the rsqrt of it run once per row and count nothing per element
    assert ops_per_element(_body(RMS, "triton_per_fused_rms_2")) == 2 + 4
    assert kernel_body(GELU, "not_there") is None


def test_issued_elements_count_masked_lanes_of_whole_blocks():
    assert issued_elements(4, {"XBLOCK": 1024}, 1, 4000) == 4096          # 4 blocks of 1024 for 4000 elements
    assert issued_elements(333, {"XBLOCK": 1}, 1536, 333 * 1536) == 333 * 2048  # persistent: row rounded to 2^k
    assert issued_elements(2048, {"XBLOCK": 2, "R0_BLOCK": 1024}, 1536, 4096 * 1536) == 4096 * 2048
    assert issued_elements(0, {}, 1, 77) == 77                               # tile unknown: the iteration space


def _launch(kernel, params, args, n):
    return TritonLaunch(0, kernel, params, args, (math.ceil(n / 1024), 1, 1), {"XBLOCK": 1024, "num_warps": 4},
                        ("in_out_ptr0",) if "in_out_ptr0" in params else (), Provenance(("aten.gelu",)))


def test_source_decides_flops_and_in_place_bytes_and_slows_a_heavy_kernel():
    n = 1 << 24
    x = TensorArg("x", 0, (n,), (1,), torch.bfloat16)
    gelu = _launch("triton_poi_fused_gelu_0", ("in_out_ptr0", "xnumel"), (x, ScalarArg(n)), n)
    kernels = {gelu.kernel: KernelSource(gelu.kernel, GELU, {})}
    without, with_src = launch_features(gelu), launch_features(gelu, None, kernels)
    assert without.flops == n and without.nbytes == 2 * n                   # one op per fused ATen op, bytes once
    assert with_src.flops == n * (6 + LIBRARY_CALL_OPS)
    assert with_src.nbytes == 2 * 2 * n                                     # loaded and stored in place
    m = KernelModel(eta_cuda=0.3, eta_memory=0.8, dram_bytes_per_clock_per_sm=30.0, latency_cycles=0.0,
                    floor_s=0.0)
    p16 = parse_device("sim:h200@16sm")
    assert m.predict(with_src, p16) > 2 * m.predict(without, p16)             # compute-bound on 16 SMs
