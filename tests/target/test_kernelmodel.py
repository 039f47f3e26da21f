"""The kernel cost model's terms, each against its datasheet figure (target/catalog.py KernelFigures)."""

import dataclasses

import pytest

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.catalog import CATALOG
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel

A100, L40S, H200 = (parse_device(f"sim:{k}") for k in ("a100", "l40s", "h200"))
#: only the term under test is non-zero
BARE = KernelModel(eta_tensor=1.0, eta_cuda=1.0, eta_memory=1.0, l2_bytes_per_clock_per_sm=64.0, latency_cycles=0.0,
                   floor_s=0.0)


def feats(kclass=OpClass.ELEMENTWISE, flops=0.0, nbytes=0.0, tc=False, params=0.0, blocks=0, threads=128,
          dtype="bf16"):
    return LaunchFeatures(0, kclass, flops, nbytes, tc, "k", params, blocks, threads, dtype)


def test_every_catalog_gpu_has_sourced_kernel_figures():
    for e in CATALOG.values():
        assert e.kernel is not None, e.key
        for f in dataclasses.astuple(e.kernel):
            assert f[0] >= 0 and f[1], (e.key, f)
    assert CATALOG["l40s"].kernel.l2_bytes.value == 96 * 2**20 and CATALOG["a100"].kernel.l2_bytes.value == 40 * 2**20


def test_latency_bound_kernels_scale_with_the_boost_clock():
    m = dataclasses.replace(BARE, latency_cycles=5000.0)
    tiny = feats(nbytes=1024, blocks=1)
    a, l = m.predict(tiny, A100), m.predict(tiny, L40S)
    assert a / l == pytest.approx(2520 / 1410, rel=0.05)  # clock ratio; the 1 KB itself is negligible


def test_streaming_kernels_follow_dram_bandwidth_and_large_ones_favour_the_a100():
    big = feats(nbytes=4e9, params=4e9, blocks=10**6)  # weights: never from L2
    assert BARE.predict(big, A100) == pytest.approx(4e9 / 2039e9, rel=1e-3)
    assert BARE.predict(big, L40S) / BARE.predict(big, A100) == pytest.approx(2039 / 864, rel=1e-3)


def test_activations_that_fit_in_half_the_l2_come_from_l2():
    act = 30 * 2**20  # fits half of the L40S's 96 MB, not half of the A100's 40 MB
    f = feats(nbytes=act, blocks=10**5)
    l40s = BARE.predict(f, L40S)
    assert l40s == pytest.approx(act / (64 * 142 * 2520e6), rel=1e-6)
    assert BARE.predict(f, A100) == pytest.approx(act / 2039e9, rel=1e-3)
    assert BARE.predict(dataclasses.replace(f, param_bytes=act), L40S) == pytest.approx(act / 864e9, rel=1e-3)


def test_tensor_rate_per_dtype_and_wave_quantization():
    gemm = feats(OpClass.GEMM, flops=2 * 8192**3, tc=True, blocks=108 * 40, threads=256)
    full = BARE.predict(gemm, A100)
    assert full == pytest.approx(2 * 8192**3 / 312e12, rel=1e-6)  # 40 full waves of 108 tiles
    one_more = dataclasses.replace(gemm, blocks=108 * 40 + 1)       # a 41st wave of one tile
    assert BARE.predict(one_more, A100) / full == pytest.approx(41 / 40 * (108 * 40) / (108 * 40 + 1), rel=1e-6)
    fp8 = dataclasses.replace(gemm, dtype="fp8")
    assert BARE.predict(fp8, H200) == pytest.approx(BARE.predict(gemm, H200) / 2, rel=1e-6)
    fp32 = dataclasses.replace(gemm, tensor_core=False, dtype="fp32")   # CUDA cores at the fp32 rate
    assert BARE.predict(fp32, A100) == pytest.approx(2 * 8192**3 / 19.5e12, rel=1e-6)


def test_cuda_core_fp16_rate_and_partitions():
    ew = feats(flops=1e12)  # blocks unknown: one full wave
    assert BARE.predict(ew, A100) == pytest.approx(1e12 / 78e12, rel=1e-6)
    part = parse_device("sim:h200@24sm")
    assert BARE.predict(ew, part) == pytest.approx(1e12 / (133.8e12 * part.sm_count / 132), rel=1e-6)


def test_launch_floor_and_unknown_devices():
    m = dataclasses.replace(BARE, floor_s=3e-6)
    assert m.predict(feats(), A100) == pytest.approx(3e-6)
    cpu = parse_device("cpu:0")
    with pytest.raises(DeviceUnavailableError, match="no kernel figures"):
        m.predict(feats(), cpu)
