"""Device strings, specs, partitions' figures, the catalog and the price table (CPU only)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from torch_tessera.errors import DeviceUnavailableError, TesseraError
from torch_tessera.target import catalog, green, prices
from torch_tessera.target.devices import (
    DeviceKind,
    EMULATION_PROFILES,
    CpuStream,
    open_device,
    parse_device,
    parse_devices,
    parse_size,
    partition_bandwidth,
)
from torch_tessera.target.links import LINK_FIGURES

H200_BF16 = 1979e12 / 2  # H200 datasheet: 1,979 TFLOPS bf16 *with sparsity*
H200_SMS = 132


def h200(s: str):
    return parse_device(s, assume_gpu="h200")


# ----------------------------------------------------------------------------------------------------------- parsing

def test_whole_gpu_has_datasheet_figures():
    d = h200("cuda:0")
    assert d.kind is DeviceKind.CUDA and d.index == 0 and d.sm_count == H200_SMS
    assert d.peak_bf16_flops == pytest.approx(H200_BF16)
    assert d.mem_bandwidth == pytest.approx(4.8e12) and d.memory_bytes == 141 * 10**9
    assert d.arch == "sm_90"


def test_partition_takes_the_measured_share_where_measured_and_the_sm_share_elsewhere():
    from torch_tessera.target.devices import MEASURED_PARTITION_SHARE

    d = h200("cuda:1@24sm")
    assert d.kind is DeviceKind.PARTITION and d.index == 1
    assert (d.requested_sms, d.sm_count, d.total_sms) == (24, 24, H200_SMS)
    # measured on one H200 (docs/BENCHMARKS.md "Measured peaks"): 24 SMs kept 167 of 814 TFLOP/s, 1756 of 4242 GB/s
    assert ("h200", 24) in MEASURED_PARTITION_SHARE
    assert d.peak_bf16_flops == pytest.approx(H200_BF16 * 167 / 814)
    assert d.mem_bandwidth == pytest.approx(4.8e12 * 1756 / 4242)
    unmeasured = h200("cuda:1@40sm")  # no measurement at 40 SMs: compute scales with the SM share
    assert ("h200", unmeasured.sm_count) not in MEASURED_PARTITION_SHARE
    assert unmeasured.peak_bf16_flops == pytest.approx(H200_BF16 * unmeasured.sm_count / 132)
    assert unmeasured.mem_bandwidth < 4.8e12


def test_partition_rounds_up_to_hardware_group():
    d = h200("cuda:1@66sm")  # measured on the H200: asking 66 gave 72
    assert d.requested_sms == 66 and d.sm_count == 72
    assert d.name == "cuda:1@66sm"


def test_throttle_and_memory_budget():
    d = h200("CUDA:1@72SM+throttle36,mem=40GB")
    plain = h200("cuda:1@72sm")
    assert d.name == "cuda:1@72sm+throttle36,mem=40GB"
    assert d.throttle_sms == 36 and d.memory_budget == d.memory_bytes == 40 * 10**9
    assert d.mem_bandwidth < plain.mem_bandwidth
    assert d.peak_bf16_flops == plain.peak_bf16_flops  # the streamer takes bandwidth, not the partition's SMs


def test_named_profile():
    p = EMULATION_PROFILES["l40s-like"]
    d = h200("cuda:1@l40s-like")
    assert (d.profile, d.sm_count, d.throttle_sms, d.memory_bytes) == ("l40s-like", p.sms, p.throttle_sms,
                                                                       p.memory_budget)
    a = h200("cuda:0@a100-like")
    # the pair's asymmetry: the l40s-like side has more compute, the a100-like side more bandwidth and memory
    assert d.peak_bf16_flops > a.peak_bf16_flops
    assert a.mem_bandwidth > d.mem_bandwidth and a.memory_bytes > d.memory_bytes
    assert d.price_per_hour < h200("cuda:0").price_per_hour


@pytest.mark.parametrize("text,name,kind,index", [
    ("cpu:1", "cpu:1", DeviceKind.CPU, 1),
    ("cpu", "cpu:0", DeviceKind.CPU, 0),
    ("gpu:0", "cuda:0", DeviceKind.CUDA, 0),
    (" sim:L40S ", "sim:l40s", DeviceKind.SIM, None),
    ("sim:rtx-pro-6000", "sim:rtxpro6000", DeviceKind.SIM, None),
    ("sim:h200@24sm", "sim:h200@24sm", DeviceKind.SIM, None),
])
def test_good_strings(text, name, kind, index):
    d = h200(text)
    assert (d.name, d.kind, d.index) == (name, kind, index)


def test_memory_sizes():
    assert parse_size("40GB") == 40 * 10**9
    assert parse_size("40GiB") == 40 * 2**30
    assert parse_size("512mb") == 512 * 10**6
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("123") == 123
    assert parse_device("sim:a100,mem=40GiB").memory_bytes == 40 * 2**30


@pytest.mark.parametrize("text,why", [
    ("tpu:0", "does not start with"),
    ("cuda:x", "needs a device number"),
    ("cuda:0@0sm", "at least 1 SM"),
    ("cuda:0@24gb", "neither"),
    ("cpu:0@24sm", "no SM partition"),
    ("sim:", "malformed after the device kind"),
    ("cuda:0@", "malformed after the device kind"),
    ("cuda:0,mem=lots", "not a size"),
    ("cuda:0,speed=3", "unknown option 'speed'"),
])
def test_bad_strings_show_accepted_forms(text, why):
    with pytest.raises(DeviceUnavailableError) as e:
        h200(text)
    msg = str(e.value)
    assert why in msg
    assert "accepted device strings" in msg and "cuda:N@Ksm+throttleT" in msg and "sim:NAME" in msg
    assert isinstance(e.value, TesseraError)


def test_unknown_catalog_name_suggests_the_closest():
    with pytest.raises(DeviceUnavailableError, match="Did you mean 'a100'"):
        parse_device("sim:a1000")


def test_requests_the_gpu_cannot_meet():
    with pytest.raises(DeviceUnavailableError, match="exceed the GPU's 132 SMs"):
        h200("cuda:1@128sm+throttle36")
    with pytest.raises(DeviceUnavailableError, match="more than the GPU's 132"):
        h200("cuda:1@133sm")
    with pytest.raises(DeviceUnavailableError, match="exceeds the 141000000000 bytes"):
        h200("cuda:0,mem=200GB")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_missing_gpu_without_assumption():
    with pytest.raises(DeviceUnavailableError, match="sees 0 CUDA GPU"):
        parse_device("cuda:5")


def test_parse_devices_attaches_options_to_the_previous_device():
    ds = parse_devices("cuda:0, cuda:1@72sm+throttle36,mem=40GB, sim:b200", assume_gpu="h200")
    assert [d.name for d in ds] == ["cuda:0", "cuda:1@72sm+throttle36,mem=40GB", "sim:b200"]
    assert ds[0].memory_budget is None and ds[1].memory_budget == 40 * 10**9 and ds[2].memory_budget is None
    with pytest.raises(DeviceUnavailableError, match="appears twice"):
        parse_devices("cpu:0,cpu:0")
    with pytest.raises(DeviceUnavailableError, match="before any device"):
        parse_devices("mem=4GB,cpu:0")


# ----------------------------------------------------------------------------------------------- partitions (model)

@pytest.mark.parametrize("requested,major,total,granted", [
    (66, 9, 132, 72), (1, 9, 132, 8), (24, 9, 132, 24), (66, 8, 108, 66), (67, 8, 108, 68), (3, 8, 108, 4),
    (5, 7, 80, 6),
])
def test_predicted_sm_groups(requested, major, total, granted):
    assert green.predict_granted_sms(requested, major, total) == granted


def test_partition_bandwidth_model_fits_the_h200_measurements():
    # DESIGN.md: device copy 4250 GB/s whole; 1196 / 2222 / 3758 GB/s on 16 / 32 / 72 SMs
    for sms, measured in ((16, 1196 / 4250), (32, 2222 / 4250), (72, 3758 / 4250)):
        assert partition_bandwidth(1.0, 132, sms) == pytest.approx(measured, abs=0.06)
    assert partition_bandwidth(1.0, 132, 132) == pytest.approx(1.0)
    values = [partition_bandwidth(1.0, 132, n) for n in range(8, 133, 8)]
    assert values == sorted(values)
    assert partition_bandwidth(1.0, 132, 96, 36) < partition_bandwidth(1.0, 132, 96)
    assert partition_bandwidth(1.0, 132, 96, 0) == partition_bandwidth(1.0, 132, 96)


# ------------------------------------------------------------------------------------------------ runtime objects

def test_cpu_virtual_devices_open_without_cuda():
    with open_device("cpu:1") as d:
        assert d.torch_device == torch.device("cpu") and d.spec.index == 1
        s = d.new_stream(priority=-1)
        assert isinstance(s, CpuStream) and s.priority == -1
        with d.guard():
            x = torch.ones(3, device=d.torch_device)
        assert s.record_event().query() and x.sum().item() == 3


def test_simulated_devices_have_no_runtime():
    with pytest.raises(DeviceUnavailableError, match="simulated"):
        open_device("sim:a100")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_partitions_need_a_gpu():
    with pytest.raises(DeviceUnavailableError):
        green.create_partition(0, 24)
    with pytest.raises(DeviceUnavailableError):
        open_device(h200("cuda:1@24sm"))


# ------------------------------------------------------------------------------------------------------- catalog

REQUIRED = {"a100", "l40s", "h100", "h200", "h20", "rtxpro6000", "b200", "l4", "a10g"}


def test_catalog_has_the_required_gpus():
    assert REQUIRED <= set(catalog.CATALOG)


@pytest.mark.parametrize("key", sorted(catalog.CATALOG))
def test_catalog_figures_are_complete_sane_and_cited(key):
    e = catalog.CATALOG[key]
    figs = e.figures
    assert set(figs) == {"peak_bf16_flops", "peak_fp32_flops", "mem_bandwidth", "memory_bytes", "sm_count"}
    for f in figs.values():
        assert math.isfinite(f.value) and f.value > 0
        src = catalog.SOURCES[f.source]
        assert src.title and src.url.startswith("https://") and re.fullmatch(r"\d{4}-\d\d-\d\d", src.read)
    assert 5e13 <= e.peak_bf16_flops.value <= 5e15           # FLOP/s, dense tensor-core
    assert 1e13 <= e.peak_fp32_flops.value <= 2e14           # FLOP/s
    assert e.peak_fp32_flops.value < e.peak_bf16_flops.value  # tensor cores beat the fp32 pipes on every GPU here
    assert 2e11 <= e.mem_bandwidth.value <= 1e13              # bytes/s
    assert 1.6e10 <= e.memory_bytes.value <= 2e11             # bytes
    assert e.sm_count.value == int(e.sm_count.value) and 40 <= e.sm_count.value <= 200
    assert re.fullmatch(r"sm_\d{2,3}", e.arch)
    assert e.interconnect in LINK_FIGURES


def test_catalog_peaks_are_dense():
    # dense figures known from the datasheets (sparse ones are twice these)
    assert catalog.CATALOG["h100"].peak_bf16_flops.value == pytest.approx(989.4e12, rel=0.01)
    assert catalog.CATALOG["a100"].peak_bf16_flops.value == pytest.approx(312e12)
    assert catalog.CATALOG["l40s"].peak_bf16_flops.value == pytest.approx(362e12, rel=0.01)
    assert catalog.CATALOG["b200"].peak_bf16_flops.value == pytest.approx(2.25e15)


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H20", "h20"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie"), ("NVIDIA L40S", "l40s"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000"), ("NVIDIA H100 PCIe", None), ("Tesla T4", None),
])
def test_detected_names_map_to_catalog_entries(name, key):
    e = catalog.match_gpu_name(name)
    assert (e.key if e else None) == key


# -------------------------------------------------------------------------------------------------------- prices

def test_paper_prices_and_assumptions():
    paper = {"a100": 1.5, "l40s": 1.0, "h100": 2.9, "rtxpro6000": 1.2, "b200": 5.0}
    for key, value in paper.items():
        p = prices.PRICES[key]
        assert p.per_hour == value and not p.assumption and "Tessera" in p.source
    for key in set(catalog.CATALOG) - set(paper) - {"a100-pcie"}:
        assert prices.PRICES[key].assumption, key
    for key in catalog.CATALOG:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", prices.PRICES[key].date)


def test_partition_price_is_its_sm_share():
    whole = h200("cuda:1")
    part = h200("cuda:1@24sm")
    assert part.price_per_hour == pytest.approx(whole.price_per_hour * 24 / 132)
    assert "SM share 24/132" in part.price_source
    assert parse_device("cpu:0").price_per_hour == 0.0


def test_a_simulated_gpu_given_twice_is_two_gpus_of_that_model():
    ds = parse_devices("sim:h100,sim:h100,mem=40GB,sim:h100")
    assert [d.name for d in ds] == ["sim:h100", "sim:h100,mem=40GB", "sim:h100#2"]
    ds = parse_devices("sim:h100,sim:h100")
    assert [d.name for d in ds] == ["sim:h100", "sim:h100#2"] and ds[0].memory_bytes == ds[1].memory_bytes
    with pytest.raises(DeviceUnavailableError, match="appears twice"):
        parse_devices("cuda:0,cuda:0", assume_gpu="h200")
