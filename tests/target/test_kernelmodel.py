"""The kernel cost model's terms, each against its datasheet figure (target/catalog.py KernelFigures)."""

import dataclasses
import math

import pytest

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.catalog import CATALOG
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel, library_waves

A100, L40S, H200 = (parse_device(f"sim:{k}") for k in ("a100", "l40s", "h200"))
#: only the term under test is non-zero
BARE = KernelModel(eta_tensor=1.0, eta_cuda=1.0, eta_memory=1.0, dram_bytes_per_clock_per_sm=math.inf,
                   l2_bytes_per_clock_per_sm=64.0, latency_cycles=0.0, tile_cycles=0.0, tensor_power=1.0,
                   softmax_ops=0.0, floor_s=0.0, wave_cycles=0.0)


def feats(kclass=OpClass.ELEMENTWISE, flops=0.0, nbytes=0.0, tc=False, params=0.0, blocks=0, threads=128,
          dtype="bf16", scores=0.0, reuse=None):
    return LaunchFeatures(0, kclass, flops, nbytes, tc, "k", params, blocks, threads, dtype, scores, reuse)


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


def test_cuda_core_work_runs_at_the_fp32_rate_and_scales_with_partitions():
    ew = feats(flops=1e12)  # blocks unknown: one full wave; Inductor's Triton kernels compute bf16 tensors in fp32
    assert BARE.predict(ew, A100) == pytest.approx(1e12 / 19.5e12, rel=1e-6)
    part = parse_device("sim:h200@24sm")
    assert BARE.predict(ew, part) == pytest.approx(1e12 / (67e12 * part.sm_count / 132), rel=1e-6)


def test_launch_floor_and_unknown_devices():
    m = dataclasses.replace(BARE, floor_s=3e-6)
    assert m.predict(feats(), A100) == pytest.approx(3e-6)
    cpu = parse_device("cpu:0")
    with pytest.raises(DeviceUnavailableError, match="no kernel figures"):
        m.predict(feats(), cpu)


def test_few_sms_cannot_draw_the_gpus_dram_bandwidth():
    m = dataclasses.replace(BARE, dram_bytes_per_clock_per_sm=30.0, eta_memory=0.8)
    stream = feats(nbytes=1e9, params=1e9, blocks=10**6)
    whole, p16 = m.predict(stream, H200), m.predict(stream, parse_device("sim:h200@16sm"))
    draw16 = 30.0 * 16 * 1980e6  # 0.95 TB/s: the 16 SMs' loads in flight, far below 0.8 x 4.8 TB/s
    assert p16 == pytest.approx(1e9 / draw16, rel=0.01)
    assert whole == pytest.approx(1e9 / (0.8 * 4800e9), rel=0.03)  # 132 SMs draw more than the DRAM gives
    assert p16 / whole > 3.5  # the old partition curve gave 1 / 0.32 = 3.1
    assert BARE.predict(stream, parse_device("sim:h200@16sm")) < p16  # no per-SM limit: faster


def test_small_gemms_split_k_over_idle_sms():
    # 64 x 4096 x 4096: 32 output tiles of 128 x 128, K = 4096 deep: split into 4 parts on 132 SMs
    gemv = feats(OpClass.GEMM, flops=2 * 64 * 4096 * 4096, nbytes=34.6e6, tc=True, params=34.6e6, blocks=32,
                 threads=256)
    m = dataclasses.replace(BARE, dram_bytes_per_clock_per_sm=30.0)
    split = m.predict(gemv, H200)
    assert split == pytest.approx(34.6e6 / m.dram_bandwidth(4800e9, 128, 1980e6), rel=1e-6)
    shallow = dataclasses.replace(gemv, flops=2 * 64 * 4096 * 256)  # K = 256: too shallow to split
    assert m.predict(shallow, H200) == pytest.approx(34.6e6 / m.dram_bandwidth(4800e9, 32, 1980e6), rel=1e-6)
    assert split < m.predict(shallow, H200)


def test_a_kernels_latency_overlaps_its_streaming():
    m = dataclasses.replace(BARE, latency_cycles=5000.0, dram_bytes_per_clock_per_sm=30.0)
    p16 = parse_device("sim:h200@16sm")
    small, large = feats(nbytes=1e6, blocks=10**4), feats(nbytes=1e9, blocks=10**4)
    # 1 MB on 16 SMs streams in about 1 us, under the 2.5 us latency: the launch lasts its latency
    assert m.predict(small, p16) == pytest.approx(5000 / 1980e6, rel=1e-6)
    # 1 GB streams for about 1 ms: the latency is hidden in it
    assert m.predict(large, p16) == pytest.approx(1e9 / m.dram_bandwidth(4800e9, 16, 1980e6), rel=1e-6)


def test_a_small_library_gemm_runs_its_whole_gpu_grid_in_waves_on_a_partition():
    # 8 x 4096 x 1024 by cuBLAS: 8 output tiles, K = 4096: 8 x min(132 // 8, 4096 // 512) = 64 split-K CTAs, sized
    # for the 132 SMs the device reports also inside a green context; 4 waves on 16 SMs, 1 on the whole GPU
    gemm = dataclasses.replace(feats(OpClass.GEMM, flops=2 * 8 * 4096 * 1024, tc=True, blocks=8, threads=256),
                               depth=4096)
    m = dataclasses.replace(BARE, wave_cycles=3000.0)
    p16, p72 = parse_device("sim:h200@16sm"), parse_device("sim:h200@72sm")
    assert m.predict(gemm, p16) == pytest.approx(4 * 3000 / 1980e6, rel=1e-6)  # the waves outlast the tiny products
    assert m.predict(gemm, p72) == m.predict(gemm, H200) == pytest.approx(3000 / 1980e6, rel=1e-6)
    assert BARE.predict(gemm, p16) < m.predict(gemm, p16) / 4  # the products alone: 1.1 us
    # the waves overlap the streaming: a GEMM whose bytes take longer than its waves costs its bytes
    heavy = dataclasses.replace(gemm, nbytes=1e9)
    assert m.predict(heavy, p16) == pytest.approx(BARE.predict(heavy, p16), rel=1e-6)
    # no library grid: a Triton template (depth unknown), a GEMM of as many tiles as SMs, CUDA-core (fp32) GEMMs
    for other in (dataclasses.replace(gemm, depth=0), dataclasses.replace(gemm, blocks=132),
                  dataclasses.replace(gemm, tensor_core=False)):
        assert library_waves(other, p16) == 0
    shallow = dataclasses.replace(gemm, depth=256)  # too shallow to split: 8 CTAs, one wave on 16 SMs
    assert library_waves(shallow, p16) == 1 and library_waves(gemm, p16) == 4


def test_a_library_gemm_of_more_than_a_quarter_as_many_tiles_as_sms_runs_one_cta_per_tile():
    # 768 x 4096 x 768 by cuBLAS: 36 output tiles > 132 // 4: no split-K, 36 CTAs each over the whole K = 4096
    gemm = dataclasses.replace(feats(OpClass.GEMM, flops=2 * 768 * 4096 * 768, tc=True, blocks=36, threads=256),
                               depth=4096)
    per_sm = 989.5e12 / 132
    assert BARE.predict(gemm, H200) == pytest.approx(gemm.flops / (36 * per_sm), rel=1e-6)
    assert library_waves(gemm, parse_device("sim:h200@16sm")) == 0  # its grid is its tiles: no split-K waves
    # on 16 SMs the 36 tiles run in 3 waves (the last a quarter full): the tensor term's wave efficiency
    assert BARE.predict(gemm, parse_device("sim:h200@16sm")) == pytest.approx(gemm.flops / (16 * per_sm * 36 / 48),
                                                                               rel=1e-6)
    # a Triton template of the same shape (depth unknown) and a library GEMM of 32 tiles still split over idle SMs
    assert BARE.predict(dataclasses.replace(gemm, depth=0), H200) < BARE.predict(gemm, H200) / 2
    quarter = dataclasses.replace(gemm, flops=gemm.flops * 32 / 36, blocks=32)
    assert library_waves(quarter, parse_device("sim:h200@16sm")) > 0
    assert BARE.predict(quarter, H200) < BARE.predict(gemm, H200) / 2


def test_each_wave_of_tiles_pays_the_tile_overhead():
    gemm = feats(OpClass.GEMM, flops=2 * 8192**3, tc=True, blocks=108 * 40, threads=256)
    m = dataclasses.replace(BARE, tile_cycles=3000.0)
    assert m.predict(gemm, A100) - BARE.predict(gemm, A100) == pytest.approx(40 * 3000 / 1410e6, rel=1e-6)


def test_dense_gemms_slow_a_whole_gpu_down_not_a_partition():
    m = dataclasses.replace(BARE, tensor_power=1.2)
    gemm = feats(OpClass.GEMM, flops=1e13, tc=True, blocks=10**5, threads=256)
    part = parse_device("sim:h200@72sm")  # 72 of 132 SMs: 0.65 of the board power, no throttle
    assert m.predict(gemm, part) == pytest.approx(BARE.predict(gemm, part), rel=1e-6)
    assert m.predict(gemm, H200) == pytest.approx(1.2 * BARE.predict(gemm, H200), rel=1e-6)


def test_attention_softmax_on_the_special_function_units():
    attn = feats(OpClass.ATTENTION, flops=4 * 64 * 1e9, tc=True, blocks=142 * 108, threads=256, scores=1e9)
    m = dataclasses.replace(BARE, softmax_ops=2.0)
    extra = m.predict(attn, L40S) - BARE.predict(attn, L40S)
    assert extra == pytest.approx(1e9 * 2.0 / (16 * 142 * 2520e6), rel=1e-6)
    # more SMs at a higher clock: the softmax runs 2.35x faster on the L40S than on the A100
    assert (m.predict(attn, A100) - BARE.predict(attn, A100)) / extra == pytest.approx(142 * 2520 / (108 * 1410),
                                                                                      rel=1e-6)


def test_reads_of_recently_touched_buffers_come_from_l2():
    near = feats(nbytes=40e6, blocks=10**5, reuse=((5e6, 20e6),))        # written 5 MB of traffic ago
    far = dataclasses.replace(near, reuse=((100e6, 20e6),))              # 100 MB ago: evicted from a 50 MB L2
    fresh = dataclasses.replace(near, reuse=((math.inf, 20e6),))         # never touched: weights, inputs
    t_near, t_far = BARE.predict(near, H200), BARE.predict(far, H200)
    assert t_far == pytest.approx(40e6 / 4800e9, rel=1e-6) == BARE.predict(fresh, H200)
    assert t_near == pytest.approx(20e6 / 4800e9 + 20e6 / (64 * 132 * 1980e6), rel=1e-6)
    assert t_near < t_far
    # the same reads on the L40S's 96 MB L2 still hit at 40 MB of distance; on the A100's 40 MB they do not
    mid = dataclasses.replace(near, reuse=((40e6, 1e6),))
    assert BARE.predict(mid, L40S) < BARE.predict(dataclasses.replace(mid, reuse=()), L40S)
    assert BARE.predict(mid, A100) == BARE.predict(dataclasses.replace(mid, reuse=()), A100)
