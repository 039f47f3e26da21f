"""The roofline cost model on hand-built launches with hand-computed FLOPs, bytes and times; the link model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.program import (
    Buffer, BufferKind, ExternLaunch, KernelProgram, KernelSource, Provenance, ScalarArg, TensorArg, TritonLaunch,
)
from torch_tessera.target.costmodel import (
    DEFAULT_EFFICIENCY, Efficiency, KernelClass, RooflineModel, calibrate, classify, estimate_costs,
    launch_features,
)
from torch_tessera.target.devices import parse_device
from torch_tessera.target.links import LinkMeasurement, build_topology


def view(buf, size, dtype=torch.bfloat16, stride=None, offset=0):
    if stride is None:
        stride, acc = [], 1
        for s in reversed(size):
            stride.insert(0, acc)
            acc *= s
    return TensorArg(buf, offset, tuple(size), tuple(stride), dtype)


def mm_launch(index, m, n, k, dtype=torch.bfloat16):
    a, b, c = view("a", (m, k), dtype), view("b", (k, n), dtype), view("c", (m, n), dtype)
    return ExternLaunch(index, "aten::mm.out", (a, b), {"out": c}, ("out",), (c,), Provenance(("aten.mm",)))


def add_launch(index, n, kernel="triton_poi_fused_add_0"):
    x, y, z = view("x", (n,), torch.float32), view("y", (n,), torch.float32), view("z", (n,), torch.float32)
    return TritonLaunch(index, kernel, ("in_ptr0", "in_ptr1", "out_ptr0", "xnumel"), (x, y, z, ScalarArg(n)),
                        (n // 1024, 1, 1), {"XBLOCK": 1024}, (), Provenance(("aten.add",)))


def program(*launches):
    bufs = {n: Buffer(n, BufferKind.TEMP, torch.float32, 1 << 30, "cuda:0") for n in "abcxyz"}
    kernels = {l.kernel: KernelSource(l.kernel, f"# {l.kernel}", {}) for l in launches if isinstance(l, TritonLaunch)}
    return KernelProgram(bufs, (), tuple(launches), (), kernels, "cuda:0")


# ------------------------------------------------------------------------------------------------- FLOPs and bytes

def test_gemm_flops_and_bytes():
    f = launch_features(mm_launch(0, 64, 4096, 4096))
    assert f.kernel_class is KernelClass.GEMM and f.tensor_core
    assert f.flops == 2 * 64 * 4096 * 4096 and f.depth == 4096  # K, what a library can split
    # A (64x4096) + B (4096x4096) + C (64x4096), bf16; C appears as out= and as output but is counted once
    assert f.nbytes == 2 * (64 * 4096 + 4096 * 4096 + 64 * 4096)


def test_fp32_gemm_is_not_on_tensor_cores():
    assert not launch_features(mm_launch(0, 8, 8, 8, torch.float32)).tensor_core


def test_addmm_bmm_baddbmm_flops():
    bias, a, b = view("x", (256,)), view("a", (32, 128)), view("b", (128, 256))
    f = launch_features(ExternLaunch(0, "aten::addmm.default", (bias, a, b), {}, (), (view("c", (32, 256)),)))
    assert f.flops == 2 * 32 * 256 * 128 + 32 * 256 and f.depth == 128
    a3, b3 = view("a", (4, 32, 128)), view("b", (4, 128, 256))
    f = launch_features(ExternLaunch(0, "aten::bmm.default", (a3, b3), {}, ()))
    assert f.flops == 2 * 4 * 32 * 256 * 128 and f.depth == 128
    c3 = view("c", (4, 32, 256))
    f = launch_features(ExternLaunch(0, "aten::baddbmm.default", (c3, a3, b3), {}, ()))
    assert f.flops == 2 * 4 * 32 * 256 * 128 + 4 * 32 * 256


def test_sdpa_flops_prefill_causal_and_decode_gqa():
    # prefill, 4 x 1024 tokens, 32 query heads, 8 KV heads, head dim 128, causal: half of the full QK^T and PV
    q, k, v = view("a", (4, 32, 1024, 128)), view("b", (4, 8, 1024, 128)), view("c", (4, 8, 1024, 128))
    pre = ExternLaunch(0, "aten::_scaled_dot_product_flash_attention.default", (q, k, v, 0.0, True), {}, ())
    f = launch_features(pre)
    assert f.kernel_class is KernelClass.ATTENTION
    assert f.flops == 4 * 4 * 32 * 1024 * 1024 * 128 / 2
    # decode: one query token against 1024 cached ones; is_causal passed by keyword, no halving when L != S
    q1 = view("a", (64, 32, 1, 128))
    kd, vd = view("b", (64, 8, 1024, 128)), view("c", (64, 8, 1024, 128))
    dec = ExternLaunch(1, "aten::scaled_dot_product_attention.default", (q1, kd, vd), {"is_causal": True}, ())
    f = launch_features(dec)
    assert f.flops == 4 * 64 * 32 * 1 * 1024 * 128
    assert f.nbytes == 2 * (64 * 32 * 128 + 2 * 64 * 8 * 1024 * 128)


def test_an_attention_reading_a_mask_is_marked_masked():
    # the LLMs' cuDNN attention over a static KV cache: an additive mask [1, 1, L, S] as its fourth argument
    q, k, v = view("q", (1, 32, 1024, 128)), view("k", (1, 32, 1088, 128)), view("v", (1, 32, 1088, 128))
    mask = view("m", (1, 1, 1024, 1088))
    op = "aten::_scaled_dot_product_cudnn_attention.default"
    masked = launch_features(ExternLaunch(0, op, (q, k, v, mask, False), {"scale": 0.088}, ()))
    plain = launch_features(ExternLaunch(1, op, (q, k, v, None, False), {}, ()))
    assert masked.masked and not plain.masked
    assert masked.scores == plain.scores == 32 * 1024 * 1088  # a mask is not a causal flag: no halving
    by_name = launch_features(ExternLaunch(2, "aten::scaled_dot_product_attention.default", (q, k, v),
                                           {"attn_mask": mask}, ()))
    assert by_name.masked
    # a causal flag reads no mask; neither does a GEMM
    causal = launch_features(ExternLaunch(3, "aten::_scaled_dot_product_flash_attention.default",
                                          (q, k, k, 0.0, True), {}, ()))
    assert not causal.masked and not launch_features(mm_launch(4, 64, 64, 64)).masked


def test_an_attention_of_a_length_off_the_128_row_tile_is_ragged():
    op = "aten::_scaled_dot_product_cudnn_attention.default"

    def attention(length, keys):
        q, k = view("q", (1, 24, length, 64)), view("k", (1, 24, keys, 64))
        return launch_features(ExternLaunch(0, op, (q, k, k, None, False), {}, ()))

    # the MMDiT's joint attention of 4,429 tokens is ragged, its 4,096-token one is not; a key axis alone counts too
    assert attention(4429, 4429).ragged and not attention(4096, 4096).ragged
    assert attention(4096, 4160).ragged and attention(1, 4096).ragged  # a decode step's single query row
    # (B, L, H, E) layout of the flash op: the length is axis 1
    q = view("q", (1, 4480, 24, 64))
    flash = launch_features(ExternLaunch(0, "aten::_flash_attention_forward.default", (q, q, q), {}, ()))
    assert not flash.ragged
    assert not launch_features(mm_launch(4, 100, 100, 100)).ragged


def conv_launch(x, w, stride, padding, groups, out, bias=True):
    b = view("bias", (w[0],)) if bias else None
    args = (view("x", x), view("w", w), b, stride, padding, [1] * len(stride), False, [0] * len(stride), groups)
    return ExternLaunch(0, "aten::convolution.default", args, {}, (), (view("out", out),))


def test_a_channels_first_convolution_is_cudnns_implicit_gemm_between_layout_copies():
    # the MMDiT's patch embedding: 16 channels of 128 x 128, 2 x 2 kernel, stride 2, to 1,536 channels of 64 x 64
    f = launch_features(conv_launch((1, 16, 128, 128), (1536, 16, 2, 2), [2, 2], [0, 0], 1, (1, 1536, 64, 64)))
    assert f.tensor_core and (f.rows, f.cols, f.depth) == (64 * 64, 1536, 16 * 4)
    assert f.flops == 2 * 64 * 64 * 1536 * 64 and f.blocks == 32 * 12
    # the input, weight and output each copied (read and written) and a separate bias add over the output
    x, w, out = 2 * 16 * 128 * 128, 2 * 1536 * 64, 2 * 1536 * 64 * 64
    assert f.passes == (2 * x, 2 * w, 2 * out, 2 * out + 2 * 1536)
    # a channels-last input needs no copies; without a bias, no add
    last = conv_launch((1, 16, 128, 128), (1536, 16, 2, 2), [2, 2], [0, 0], 1, (1, 1536, 64, 64), bias=False)
    last = dataclasses.replace(last, args=(view("x", (1, 16, 128, 128), stride=(16 * 128 * 128, 1, 128 * 16, 16)),
                                           *last.args[1:]))
    assert launch_features(last).passes == ()


def test_a_depthwise_convolution_runs_on_cuda_cores_one_thread_per_output():
    # Mamba's causal conv1d in decode: 64 sequences x 5,120 channels, 4 taps, groups = channels
    f = launch_features(conv_launch((64, 5120, 5), (5120, 1, 4), [1], [0], 5120, (64, 5120, 2)))
    assert not f.tensor_core and f.passes == () and f.load_chain
    assert f.flops == 2 * 64 * 5120 * 2 * 4
    assert (f.blocks, f.threads_per_block) == (math.ceil(64 * 5120 * 2 / 1024), 1024)  # 640, as the profiler saw


def test_elementwise_triton_launch():
    f = launch_features(add_launch(0, 1 << 20))
    assert f.kernel_class is KernelClass.ELEMENTWISE and not f.tensor_core
    assert f.flops == 1 << 20
    assert f.nbytes == 3 * 4 * (1 << 20)


def test_broadcast_view_counts_its_span():
    n = 4096
    x = view("x", (n,), torch.float32, stride=(0,))  # one scalar broadcast over n elements
    y, z = view("y", (n,), torch.float32), view("z", (n,), torch.float32)
    l = TritonLaunch(0, "k", ("in_ptr0", "in_ptr1", "out_ptr0", "xnumel"), (x, y, z, ScalarArg(n)), (4, 1, 1), {})
    assert launch_features(l).nbytes == 4 + 2 * 4 * n


def test_scatter_into_a_cache_moves_the_scattered_elements_not_the_cache():
    # One decode token's K (64 sequences x 8 heads x 128) written into a [64, 8, 1088, 128] bf16 cache by an
    # Inductor pointwise kernel whose iteration space is the token's elements.
    new = 64 * 8 * 128
    k = view("k", (64, 8, 1, 128))
    cache = view("cache", (64, 8, 1088, 128))
    pos = view("pos", (1,), torch.int64)
    scatter = TritonLaunch(0, "triton_poi_fused_index_copy_0", ("in_ptr0", "in_ptr1", "out_ptr0", "xnumel"),
                           (pos, k, cache, ScalarArg(new)), (new // 1024, 1, 1), {"XBLOCK": 1024}, (),
                           Provenance(("aten.index_copy",)))
    assert launch_features(scatter).nbytes == 8 + 2 * new + 2 * new
    # A hand-written kernel (not Inductor's pointwise/reduction naming) keeps the whole views: nothing bounds it.
    other = dataclasses.replace(scatter, kernel="my_scatter")
    assert launch_features(other).nbytes == 8 + 2 * new + 2 * 64 * 8 * 1088 * 128


def test_reduction_and_norm_classes():
    x, out = view("x", (64, 4096), torch.float32), view("z", (64,), torch.float32)
    red = TritonLaunch(0, "triton_red_fused_sum_0", ("in_ptr0", "out_ptr0", "xnumel", "r0_numel"),
                       (x, out, ScalarArg(64), ScalarArg(4096)), (64, 1, 1), {"R0_BLOCK": 2048},
                       provenance=Provenance(("aten.sum",)))
    f = launch_features(red)
    assert f.kernel_class is KernelClass.REDUCTION and f.flops == 64 * 4096
    norm = dataclasses.replace(red, provenance=Provenance(("aten.pow", "aten.mean", "aten.add", "aten.rsqrt",
                                                            "aten.mul")))
    assert classify(norm) is KernelClass.NORM
    assert launch_features(norm).flops == 5 * 64 * 4096  # five fused ops per element
    other = ExternLaunch(0, "aten::index_select.default", (x, 0, view("y", (8,), torch.int64)), {}, ())
    assert classify(other) is KernelClass.OTHER and launch_features(other).flops == 0


# ------------------------------------------------------------------------------------------------------ roofline

def test_roofline_by_hand():
    a100 = parse_device("sim:a100")  # 312e12 bf16 FLOP/s, 2039e9 bytes/s
    eff = dict(DEFAULT_EFFICIENCY)
    eff[KernelClass.GEMM] = Efficiency(0.5, 0.5)
    eff[KernelClass.ELEMENTWISE] = Efficiency(0.5, 0.8)
    model = RooflineModel(eff, overhead_s=1e-5)
    big = launch_features(mm_launch(0, 4096, 4096, 4096))  # compute-bound
    assert model.predict(big, a100) == pytest.approx(1e-5 + 2 * 4096**3 / (312e12 * 0.5))
    add = launch_features(add_launch(1, 1 << 24))  # memory-bound: 3 * 4 bytes per element
    assert model.predict(add, a100) == pytest.approx(1e-5 + 12 * (1 << 24) / (2039e9 * 0.8))


def test_estimate_costs_table_shape_and_sense():
    prog = program(mm_launch(0, 4096, 4096, 4096), add_launch(1, 1 << 24))
    table = estimate_costs(prog, ["sim:a100", "sim:l40s", "sim:h100", parse_device("sim:h200")])
    assert table.devices == ("sim:a100", "sim:l40s", "sim:h100", "sim:h200")
    assert table.kernels == (0, 1) and table.seconds.shape == (2, 4)
    gemm, add = table.row(0), table.row(1)
    assert gemm[2] < gemm[0]          # H100 has 3x the A100's tensor peak
    assert add[1] > add[0] > add[3]   # bandwidth: L40S 864 < A100 2039 < H200 4800 GB/s
    assert table.source.startswith("kernel model")
    sub = estimate_costs(prog, ["sim:a100"], kernels=[1])
    assert sub.kernels == (1,) and sub.seconds[0, 0] == pytest.approx(add[0])


def test_devices_without_figures_are_refused():
    unknown = dataclasses.replace(parse_device("sim:a100"), name="cuda:0", model="Mystery GPU",
                                  peak_bf16_flops=math.nan, peak_fp32_flops=math.nan, mem_bandwidth=math.nan)
    with pytest.raises(DeviceUnavailableError, match="profile it"):
        estimate_costs(program(add_launch(0, 1024)), [unknown])


def _synthetic(device, truth):
    """(features, seconds) of GEMMs and adds of many sizes, timed by a known model."""
    rows = []
    for m in (1, 16, 64, 256, 1024, 4096):
        f = launch_features(mm_launch(0, m, 4096, 4096))
        rows.append((f, truth.predict(f, device)))
    for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26):
        f = launch_features(add_launch(0, n))
        rows.append((f, truth.predict(f, device)))
    return rows


def test_calibrate_recovers_a_known_model_and_transfers_to_another_device():
    eff = dict(DEFAULT_EFFICIENCY)
    eff[KernelClass.GEMM] = Efficiency(0.6, 0.8)
    eff[KernelClass.ELEMENTWISE] = Efficiency(0.3, 0.55)
    truth = RooflineModel(eff, overhead_s=3e-6)
    h200 = parse_device("sim:h200")
    fitted = calibrate(_synthetic(h200, truth), h200)
    assert fitted.overhead_s == pytest.approx(3e-6)
    step = 10 ** (3 / 120)  # the log grid's step
    assert 1 / step < fitted.efficiency[KernelClass.GEMM].compute / 0.6 < step
    assert 1 / step < fitted.efficiency[KernelClass.ELEMENTWISE].memory / 0.55 < step
    assert fitted.efficiency[KernelClass.ATTENTION] == DEFAULT_EFFICIENCY[KernelClass.ATTENTION]  # no data: prior
    assert "calibrated on sim:h200" in fitted.source
    part = parse_device("sim:h200@24sm")
    for f, _ in _synthetic(part, truth):
        assert fitted.predict(f, part) == pytest.approx(truth.predict(f, part), rel=0.12)


def test_calibrate_without_measurements_returns_the_prior():
    prior = RooflineModel()
    assert calibrate([], "sim:h200", prior) is prior


# ---------------------------------------------------------------------------------------------------- link model

def test_topology_of_simulated_pairs():
    t = build_topology(["sim:a100", "sim:a100,mem=40GB", "sim:a100-pcie", "sim:l40s", "cpu:0"])
    nvlink3 = 300e9 * 0.875
    assert t.bandwidth[0, 1] == pytest.approx(nvlink3)                   # two A100 SXM: NVLink 3
    assert t.bandwidth[2, 3] == pytest.approx(31.5e9 * 0.75 / 2)         # L40S has no P2P: staged over PCIe 4
    assert t.latency[2, 3] > t.latency[0, 1]
    assert t.memory == (80 * 10**9, 40 * 10**9, 80 * 10**9, 48 * 10**9, t.memory[4])
    nbytes = 64 << 20
    assert t.transfer_seconds(0, 1, nbytes) == pytest.approx(t.latency[0, 1] + nbytes / nvlink3)
    assert t.transfer_seconds(1, 1, nbytes) == 0.0
    pair = build_topology(["sim:h100", "sim:rtxpro6000"])
    assert pair.bandwidth[0, 1] == pytest.approx(63e9 * 0.75 / 2)        # PCIe 5, RTX PRO has no P2P


def test_measured_links_override_the_model():
    m = LinkMeasurement("cpu:0", "cpu:1", "host", 2e-6, {4096: 3e-6, 1 << 20: 1e-4})
    t = build_topology(["cpu:0", "cpu:1"], measured=[m])
    assert t.bandwidth[0, 1] == pytest.approx((1 << 20) / 1e-4) and t.latency[0, 1] == 2e-6
    assert t.bandwidth[1, 0] != t.bandwidth[0, 1]  # the reverse direction was not measured: modelled
    assert "measured" in t.source


def test_two_partitions_of_one_gpu_copy_device_to_device():
    a = parse_device("cuda:1@24sm", assume_gpu="h200")
    b = parse_device("cuda:1@72sm", assume_gpu="h200")
    t = build_topology([a, b])
    assert t.bandwidth[0, 1] == pytest.approx(min(a.mem_bandwidth, b.mem_bandwidth) / 2)


def test_grouped_mm_is_a_tensor_core_gemm_over_the_stacked_rows():
    # MoE experts: 128 routed rows over 8 experts of (4096 x 1024) weights, int32 group offsets
    a, w = view("a", (128, 4096)), view("w", (8, 4096, 1024))
    offs, out = view("o", (8,), torch.int32), view("c", (128, 1024))
    f = launch_features(ExternLaunch(0, "aten::_grouped_mm.default", (a, w, offs), {}, (), (out,)))
    assert f.kernel_class is KernelClass.GEMM
    assert f.tensor_core and f.dtype == "bf16"  # the int32 offsets do not decide the dtype
    assert f.flops == 2 * 128 * 1024 * 4096
    assert f.blocks == 8 * 1 * 8  # per expert: ceil(16 rows / 128) x ceil(1024 / 128) tiles
