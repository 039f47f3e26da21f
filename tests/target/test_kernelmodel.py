"""The kernel cost model's terms, each against its datasheet figure (target/catalog.py KernelFigures)."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target.catalog import CATALOG
from torch_tessera.target.costmodel import LaunchFeatures
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel, library_waves
from torch_tessera.target import library_grid as library_grid_module
from torch_tessera.target.library_grid import LibraryGrid, library_grid

ROOT = Path(__file__).resolve().parents[2]

A100, L40S, H200 = (parse_device(f"sim:{k}") for k in ("a100", "l40s", "h200"))
#: only the term under test is non-zero
BARE = KernelModel(eta_tensor=1.0, eta_cuda=1.0, eta_memory=1.0, dram_bytes_per_clock_per_sm=math.inf,
                   l2_bytes_per_clock_per_sm=64.0, latency_cycles=0.0, tile_cycles=0.0, tensor_power=1.0,
                   softmax_ops=0.0, floor_s=0.0, wave_cycles=0.0, operand_bytes_per_clock_per_sm=math.inf,
                   mask_ops=0.0, ragged_ops=0.0)


def feats(kclass=OpClass.ELEMENTWISE, flops=0.0, nbytes=0.0, tc=False, params=0.0, blocks=0, threads=128,
          dtype="bf16", scores=0.0, reuse=None, masked=False, **more):
    return LaunchFeatures(0, kclass, flops, nbytes, tc, "k", params, blocks, threads, dtype, scores, reuse,
                          masked=masked, **more)


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


def library_gemm(m, k, n, bias=False):
    """A bf16 cuBLAS ``torch.mm`` (``addmm`` with ``bias``) of ``m x k x n`` as the cost model sees it."""
    flops = 2.0 * m * n * k + (m * n if bias else 0)
    nbytes = 2.0 * (m * k + k * n + m * n + (n if bias else 0))
    tiles = math.ceil(m / 128) * math.ceil(n / 128)
    return LaunchFeatures(0, OpClass.GEMM, flops, nbytes, True, "aten::mm", 2.0 * k * n, tiles, 256, "bf16",
                          depth=k, rows=m, cols=n)


def test_a_small_library_gemm_runs_cublas_grid_in_waves_of_one_cta_time_on_a_partition():
    # 64 x 4096 x 4096 by cuBLAS: 32 output tiles of 128 x 128, but 128 CTAs of 64 x 32 (unsplit), sized for the 132
    # SMs the device reports also inside a green context: 8 waves on 16 SMs, 2 on 72, 1 on the whole GPU; each wave
    # one CTA's time: wave_cycles plus its (64 + 32) x 4096 bf16 operands at operand_bytes_per_clock_per_sm
    gemm = library_gemm(64, 4096, 4096)
    assert library_grid(gemm, 132) == LibraryGrid(128, 64, 32, 1, (64 + 32) * 4096)
    m = dataclasses.replace(BARE, wave_cycles=3000.0, operand_bytes_per_clock_per_sm=100.0)
    wave = (3000 + 96 * 4096 * 2 / 100) / 1980e6
    p16, p72 = parse_device("sim:h200@16sm"), parse_device("sim:h200@72sm")
    assert [library_waves(gemm, d) for d in (p16, p72, H200)] == [8, 2, 1]
    assert m.predict(gemm, p16) == pytest.approx(8 * wave, rel=1e-6)
    assert m.predict(gemm, p72) == pytest.approx(2 * wave, rel=1e-6)
    # the waves overlap the streaming: on the whole GPU the 33.6 MB stream at 128 CTAs' draw costs more than a wave
    slow = dataclasses.replace(m, dram_bytes_per_clock_per_sm=30.0)
    dram = dataclasses.replace(gemm, param_bytes=gemm.nbytes)
    assert slow.predict(dram, H200) == pytest.approx(gemm.nbytes / slow.dram_bandwidth(4800e9, 128, 1980e6), rel=1e-6)
    assert slow.predict(dram, H200) > wave


def test_a_library_gemm_splits_k_as_cublas_did(monkeypatch):
    # the row-major rule (the models' measured shapes emptied): K = 14,336 for 64 x 4,096 (32 tiles <= 2/3 of 132):
    # cuBLAS ran 128 x 64 tiles in 4 parts, 128 CTAs
    monkeypatch.setattr(library_grid_module, "MEASURED_TN_GRIDS", {})
    deep = library_grid(library_gemm(64, 14336, 4096), 132)
    assert deep.splits == 4 and deep.ctas == 128 and deep.operand_elements == (128 + 64) * 3584
    # K = 4,096 for 64 x 1,024 (8 tiles <= 1/8 of 132): split; K = 1,536: never
    assert library_grid(library_gemm(64, 4096, 1024), 132).splits > 1
    assert library_grid(library_gemm(64, 1536, 1024), 132).splits == 1
    # a GEMV (M = 1) of 12 tiles: 24 CTAs of 64 x 8, one wave on 24 SMs, two on 16
    gemv = library_gemm(1, 1536, 1536, bias=True)
    assert library_grid(gemv, 132) == LibraryGrid(24, 64, 8, 1, (64 + 1) * 1536)
    assert library_waves(gemv, parse_device("sim:h200@24sm")) == 1
    assert library_waves(gemv, parse_device("sim:h200@16sm")) == 2


def test_gemms_without_a_library_grid():
    gemm = library_gemm(64, 4096, 4096)
    p16 = parse_device("sim:h200@16sm")
    # a Triton template (depth unknown), a convolution (rows unknown), a CUDA-core (fp32) GEMM, one of more tiles
    # than SMs, shapes neither the sweeps nor the layouts run measured (320 columns, K = 160, 32 rows): no library
    # grid, no library waves
    for other in (dataclasses.replace(gemm, depth=0), dataclasses.replace(gemm, rows=0, cols=0),
                  dataclasses.replace(gemm, tensor_core=False), library_gemm(2048, 4096, 2048),
                  library_gemm(64, 5120, 320), library_gemm(64, 160, 4096), library_gemm(32, 4096, 4096)):
        assert library_grid(other, 132) is None and library_waves(other, p16) == 0
    # 2,048 x 4,096 x 2,048 (256 tiles): one CTA per 128 x 128 tile over its whole K, 2 waves on the whole GPU
    big = library_gemm(2048, 4096, 2048)
    per_sm = 989.5e12 / 132
    assert BARE.predict(big, H200) == pytest.approx(big.flops / (132 * per_sm * 256 / 264), rel=1e-6)


def test_library_grid_follows_cublas_on_the_h200_sweep(monkeypatch):
    # docs/results/2026-12-02-s15/call3/cublas_grids.json: 110 bf16 torch.mm shapes on one H200; of the 100 of at most
    # 132 tiles the rule's CTAs are within 15 % of cuBLAS's main kernel for 94, and its split decision agrees for all
    monkeypatch.setattr(library_grid_module, "MEASURED_TN_GRIDS", {})  # the sweep timed a row-major B
    rows = json.loads((ROOT / "docs/results/2026-12-02-s15/call3/cublas_grids.json").read_text())["rows"]
    near = agree = n = 0
    for r in rows:
        grid = library_grid(library_gemm(r["M"], r["K"], r["N"]), 132)
        if grid is None:
            assert r["tiles"] > 132
            continue
        main = r["kernels"][0]
        n += 1
        near += abs(grid.ctas / math.prod(main["grid"]) - 1) <= 0.15
        agree += (grid.splits > 1) == ("splitK" in main["name"])
    assert (n, agree) == (100, 100) and near >= 94


def test_library_waves_follow_cublas_on_the_h200_partitions(monkeypatch):
    # docs/results/2026-12-03-s16/cublas_partitions.txt (a row-major B): 14 shapes on 132, 72, 24 and 16 SMs; the
    # rule's waves equal cuBLAS's main-kernel waves in 53 of the 56 rows
    monkeypatch.setattr(library_grid_module, "MEASURED_TN_GRIDS", {})
    same = n = 0
    for line in (ROOT / "docs/results/2026-12-03-s16/cublas_partitions.txt").read_text().splitlines():
        f = line.split()
        if len(f) < 11 or not f[0].isdigit():
            continue
        gemm = library_gemm(int(f[0]), int(f[1]), int(f[2]), bias=f[3] == "yes")
        sms = int(f[5])
        n += 1
        same += library_waves(gemm, parse_device("sim:h200" if sms == 132 else f"sim:h200@{sms}sm")) == int(f[9])
    assert n == 56 and same >= 53


def test_the_models_transposed_weight_takes_cublas_measured_grid():
    # docs/results/2026-12-03-s16/call4/layouts/cublas_layouts.json: the 92 `tn` rows (the weight transposed, as
    # nn.Linear calls cuBLAS) on 132/72/24/16 SMs; the grid's CTAs and waves equal cuBLAS's main kernel's in every row
    rows = json.loads((ROOT / "docs/results/2026-12-03-s16/call4/layouts/cublas_layouts.json").read_text())["rows"]
    n = same = 0
    for r in rows:
        if r["layout"] != "tn":
            continue
        gemm = library_gemm(r["M"], r["K"], r["N"], bias=r["bias"])
        main = next(k for k in r["kernels"] if k["name"].startswith("nvjet"))
        device = parse_device("sim:h200" if r["sms"] == 132 else f"sim:h200@{r['sms']}sm")
        n += 1
        same += (library_grid(gemm, 132).ctas, library_waves(gemm, device)) == (math.prod(main["grid"]), r["waves"])
    assert (n, same) == (92, 92)
    # dit's GEMV 1 x 1536 x 1536: 96 CTAs of 16 columns (the row-major B's 24 of 64 x 8), 6 waves on 16 SMs
    gemv = library_gemm(1, 1536, 1536, bias=True)
    assert library_grid(gemv, 132) == LibraryGrid(96, 16, 64, 1, (16 + 1) * 1536)
    assert library_waves(gemv, parse_device("sim:h200@16sm")) == 6
    # the table is the H200's (132 SMs): another GPU keeps the row-major rule
    assert library_grid(gemv, 108) == LibraryGrid(24, 64, 8, 1, (64 + 1) * 1536)


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


def test_a_mask_adds_its_operations_per_score():
    kw = dict(flops=4 * 64 * 1e9, tc=True, blocks=142 * 108, threads=256, scores=1e9)
    plain, masked = feats(OpClass.ATTENTION, **kw), feats(OpClass.ATTENTION, masked=True, **kw)
    m = dataclasses.replace(BARE, softmax_ops=1.5, mask_ops=3.0)
    assert m.predict(masked, L40S) - m.predict(plain, L40S) == pytest.approx(1e9 * 3.0 / (16 * 142 * 2520e6),
                                                                               rel=1e-6)
    assert dataclasses.replace(m, mask_ops=0.0).predict(masked, L40S) == pytest.approx(m.predict(plain, L40S))


def test_a_ragged_attention_adds_its_operations_per_score():
    kw = dict(flops=4 * 64 * 1e9, tc=True, blocks=142 * 108, threads=256, scores=1e9)
    plain, ragged = feats(OpClass.ATTENTION, **kw), feats(OpClass.ATTENTION, ragged=True, **kw)
    m = dataclasses.replace(BARE, softmax_ops=1.5, mask_ops=3.0, ragged_ops=0.5)
    assert m.predict(ragged, L40S) - m.predict(plain, L40S) == pytest.approx(1e9 * 0.5 / (16 * 142 * 2520e6),
                                                                               rel=1e-6)
    both = feats(OpClass.ATTENTION, ragged=True, masked=True, **kw)  # a masked ragged attention pays both
    assert m.predict(both, L40S) - m.predict(plain, L40S) == pytest.approx(1e9 * 3.5 / (16 * 142 * 2520e6),
                                                                             rel=1e-6)


def test_each_pass_of_a_library_call_is_a_streaming_launch_of_its_own():
    m = dataclasses.replace(BARE, floor_s=2e-6, latency_cycles=1980.0)  # 1 us of latency at the H200's clock
    gemm = feats(OpClass.GEMM, flops=1e6, tc=True, blocks=10, threads=256)
    copies = dataclasses.replace(gemm, passes=(1e3, 96e6))
    # a tiny pass lasts its floor and latency; a large one streams at the DRAM's bandwidth
    assert m.predict(copies, H200) - m.predict(gemm, H200) == pytest.approx(2e-6 + 1e-6 + 2e-6 + 96e6 / 4800e9,
                                                                            rel=1e-6)
    # on a 16-SM partition a pass streams at those SMs' draw
    slow = dataclasses.replace(m, dram_bytes_per_clock_per_sm=32.0)
    p16 = parse_device("sim:h200@16sm")
    one = dataclasses.replace(gemm, passes=(96e6,))
    assert slow.predict(one, p16) - slow.predict(gemm, p16) == pytest.approx(
        2e-6 + 96e6 / slow.dram_bandwidth(4800e9, 16, 1980e6), rel=1e-6)


def test_a_kernel_waiting_on_chains_of_loads_lasts_a_wave_latency_per_wave():
    m = dataclasses.replace(BARE, wave_cycles=1980.0)  # 1 us per wave at the H200's clock
    # 640 CTAs of 1,024 threads (Mamba's depthwise conv in decode): two resident per SM
    conv = feats(OpClass.GEMM, flops=1e6, nbytes=4e6, blocks=640, threads=1024, load_chain=True)
    assert m.predict(conv, H200) == pytest.approx(math.ceil(640 / 264) * 1e-6, rel=1e-6)
    assert m.predict(conv, parse_device("sim:h200@16sm")) == pytest.approx(20 * 1e-6, rel=1e-6)
    assert m.predict(dataclasses.replace(conv, load_chain=False), H200) < 1e-6  # without it: its bytes alone


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
