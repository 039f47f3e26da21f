"""Links between devices: measured (:func:`measure_links`) or modelled from cited figures (:func:`build_topology`).

Model. A link moves ``nbytes`` in ``latency + nbytes / bandwidth`` seconds. Figures per link family
(:data:`LINK_FIGURES`) are the published per-direction peaks times an achievable fraction:

* PCIe 4.0 x16: 16 GT/s per lane, 128b/130b encoding -> 31.5 GB/s per direction (PCI-SIG, PCI Express Base
  Specification 4.0); the Tessera artifact measured A100<->A100 peer copies at 21-23 GB/s over it, so we take 0.75.
* PCIe 5.0 x16: 32 GT/s per lane -> 63 GB/s per direction (PCI Express Base Specification 5.0); same fraction.
* NVLink 3 (A100 SXM): 600 GB/s total, 300 per direction (NVIDIA A100 datasheet).
* NVLink 4 (H100/H200 SXM): 900 GB/s total, 450 per direction (H100/H200 datasheets); 1 GiB peer copies between two
  H200s reach 394 GB/s (docs/DESIGN.md, measured facts), a fraction of 0.875.
* NVLink 5 (B200): 1.8 TB/s total, 900 per direction (NVIDIA HGX B200 specifications).

Pairing rule for simulated devices: two GPUs of the same NVLink model share an NVLink domain; any other pair talks over
the slower of the two PCIe generations, by peer copy when both support peer access, else staged through pinned host
memory (two sequential copies: half the bandwidth, twice the latency). The paper's pairs used 200-400 Gb/s RDMA NICs
(25-50 GB/s), the same order as PCIe 4/5 x16. Two partitions of one GPU copy device-to-device (read + write at the
device's bandwidth). CPU virtual devices copy host memory (nominal 5 GB/s, 5 us).

Hosts. When ``build_topology`` is given the host of every device, a pair on different hosts talks over the network
(:data:`NETWORK_FIGURES`, default ``rdma400``) instead of the intra-host link:

* ``rdma400``: one 400 Gb/s InfiniBand NDR / RoCE NIC per GPU (NVIDIA ConnectX-7 datasheet: 400 Gb/s = 50 GB/s per
  direction) x 0.9 achievable; 10 us per hop (NIC one-way ~2 us plus NCCL's proxy thread and kernel launch; replace
  it with the figure ``bench/gpu_distributed.py`` measures).
* ``rdma200``: 200 Gb/s HDR / ConnectX-6 (25 GB/s per direction) x 0.9; 10 us.
* ``tcp100``: 100 GbE without RDMA (gloo, NCCL's socket transport): 12.5 GB/s x 0.7; 30 us (kernel TCP stack).

Measurement. Per ordered pair: the latency of a 4 KiB copy, and bandwidth for message sizes 4 KiB .. 1 GiB, with CUDA
events on the source's stream (torch copies between GPUs on the source device's current stream). Peer copies when
``torch.cuda.can_device_access_peer``; pinned-host staging otherwise.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch

from torch_tessera.target import catalog
from torch_tessera.target.costs import MemoryPool, Topology
from torch_tessera.target.devices import Device, DeviceKind, DeviceSpec, parse_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkFigure:
    """One link family: achievable bandwidth (bytes/s per direction), latency (s) and the source of the peak."""

    bandwidth: float
    latency: float
    source: str


LINK_FIGURES: Mapping[str, LinkFigure] = {
    "pcie4": LinkFigure(31.5e9 * 0.75, 10e-6, "PCIe 4.0 x16 31.5 GB/s/dir (PCI-SIG base spec 4.0) x 0.75"),
    "pcie5": LinkFigure(63.0e9 * 0.75, 10e-6, "PCIe 5.0 x16 63 GB/s/dir (PCI-SIG base spec 5.0) x 0.75"),
    "nvlink3": LinkFigure(300e9 * 0.875, 8e-6, "NVLink 3 300 GB/s/dir (A100 datasheet) x 0.875"),
    "nvlink4": LinkFigure(450e9 * 0.875, 8e-6, "NVLink 4 450 GB/s/dir (H100/H200 datasheets) x 0.875 (measured H200)"),
    "nvlink5": LinkFigure(900e9 * 0.875, 8e-6, "NVLink 5 900 GB/s/dir (HGX B200 specifications) x 0.875"),
}
NETWORK_FIGURES: Mapping[str, LinkFigure] = {
    "rdma400": LinkFigure(50e9 * 0.9, 10e-6, "400 Gb/s NDR/RoCE NIC, 50 GB/s/dir (ConnectX-7 datasheet) x 0.9"),
    "rdma200": LinkFigure(25e9 * 0.9, 10e-6, "200 Gb/s HDR NIC, 25 GB/s/dir (ConnectX-6 datasheet) x 0.9"),
    "tcp100": LinkFigure(12.5e9 * 0.7, 30e-6, "100 GbE TCP, 12.5 GB/s/dir (IEEE 802.3) x 0.7"),
}
HOST_COPY = LinkFigure(5e9, 5e-6, "CPU virtual devices: nominal host memcpy")


@dataclass(frozen=True)
class HopFigure:
    """What one cut edge costs the two devices it joins, besides the link (see :class:`~.costs.Topology`).

    Attributes:
        overhead_s: seconds per cut edge per program run (per micro-batch), on the timelines of both devices.
        exposure: share of each copy's link time (``bytes / bandwidth``) that also lands on both devices' timelines.
        source: where the figures come from.
    """

    overhead_s: float
    exposure: float
    source: str


#: Per-hop charge between two H200s: 52 us of step time per cut edge per run, and 0.6 of each copy's time exposed, from
#: ``measured step = model step + kappa x calls + h x cut edges per step + phi x copy seconds per step`` fitted over
#: executed plans (``bench/fit_hop_overhead.py``; docs/BENCHMARKS.md, per-hop charge). The bare hop inside one CUDA
#: graph is smaller; the rest is overlap the runtime loses around each hop.
H200_HOP = HopFigure(52e-6, 0.6, "two H200s, one CUDA graph, 2026-11-29: fitted over tessera bench --measure runs "
                     "(bench/fit_hop_overhead.py: 52 us per cut edge per run, 0.6 of copy time exposed; bare hop "
                     "12-15.5 us, bench/gpu_multidevice_graph.py; docs/BENCHMARKS.md, per-hop charge)")

#: Per-hop charge between two SM partitions of one H200: 8 us of step time per cut edge per micro-batch (what the
#: waits add at 2 micro-batches); no copy, so nothing exposed. Source: docs/BENCHMARKS.md, cuts between two
#: partitions of one H200.
SAME_GPU_HOP = HopFigure(8e-6, 0.0, "SM partitions of one H200, one CUDA graph, 2026-12-03: measured (bench/"
                         "gpu_cut_diagnose.py, Llama af, 156 cut edges: executed - no-wait = 7.6-7.9 us per cut edge "
                         "per micro-batch at 2 micro-batches; no copy; docs/BENCHMARKS.md, cuts between two "
                         "partitions of one H200)")

#: Per pair kind. Pairs we have not measured carry the H200 figure over (an assumption, said in the source); two SM
#: partitions of one GPU share memory (no copy, so nothing to expose) but pay the cross-stream wait; CPU virtual
#: devices time nothing meaningful (plumbing only), so they get no charge.
HOP_FIGURES: Mapping[str, HopFigure] = {
    "gpu": H200_HOP,
    "same-gpu": SAME_GPU_HOP,
    "other-gpu": HopFigure(H200_HOP.overhead_s, H200_HOP.exposure, "not measured on this pair; assumed as measured "
                           "between two H200s (" + H200_HOP.source + ")"),
    "cpu": HopFigure(0.0, 0.0, "CPU virtual devices: no per-hop charge (CPU timings are plumbing only)"),
}


def hop_figure(a: DeviceSpec, b: DeviceSpec) -> tuple[HopFigure, str]:
    """The :data:`HOP_FIGURES` entry for the pair ``a -> b`` and its key."""
    if a.kind is DeviceKind.CPU and b.kind is DeviceKind.CPU:
        return HOP_FIGURES["cpu"], "cpu"
    if a.is_gpu and b.is_gpu and a.index == b.index:
        return HOP_FIGURES["same-gpu"], "same-gpu"
    ea, eb = _entry(a), _entry(b)
    h200 = catalog.CATALOG.get("h200")
    if ea is not None and ea is eb and ea is h200:
        return HOP_FIGURES["gpu"], "gpu"
    return HOP_FIGURES["other-gpu"], "other-gpu"


_PCIE_OF = {"pcie4": "pcie4", "pcie5": "pcie5", "nvlink3": "pcie4", "nvlink4": "pcie5", "nvlink5": "pcie5"}


def _entry(spec: DeviceSpec) -> catalog.CatalogEntry | None:
    return catalog.CATALOG.get(spec.catalog_key or "")


def model_link(a: DeviceSpec, b: DeviceSpec) -> tuple[float, float, str]:
    """Modelled (bandwidth bytes/s, latency s, reason) of the link ``a -> b``."""
    if a.kind is DeviceKind.CPU or b.kind is DeviceKind.CPU:
        if a.kind is b.kind:
            return HOST_COPY.bandwidth, HOST_COPY.latency, HOST_COPY.source
        f = LINK_FIGURES["pcie4"]
        return f.bandwidth, f.latency, "CPU <-> GPU over " + f.source
    if a.is_gpu and b.is_gpu and a.index == b.index:
        bw = min(a.mem_bandwidth, b.mem_bandwidth) / 2
        return bw, 5e-6, "same GPU: device-to-device copy (read + write at DRAM bandwidth)"
    ea, eb = _entry(a), _entry(b)
    fam_a = ea.interconnect if ea else "pcie4"
    fam_b = eb.interconnect if eb else "pcie4"
    if ea is not None and ea is eb and fam_a.startswith("nvlink"):
        f = LINK_FIGURES[fam_a]
        return f.bandwidth, f.latency, f.source
    pcie = min(_PCIE_OF[fam_a], _PCIE_OF[fam_b])  # "pcie4" < "pcie5"
    f = LINK_FIGURES[pcie]
    if ea is not None and eb is not None and ea.peer_access and eb.peer_access:
        return f.bandwidth, f.latency, "peer copy over " + f.source
    return f.bandwidth / 2, 2 * f.latency + 5e-6, "staged through pinned host memory over " + f.source


@dataclass(frozen=True)
class LinkMeasurement:
    """Measured link ``src -> dst``.

    Attributes:
        src: source device name.
        dst: destination device name.
        method: ``"peer"``, ``"staged"``, ``"same-gpu"`` or ``"host"``.
        latency: seconds of a 4 KiB copy.
        seconds_by_size: message size (bytes) -> seconds per copy (median).
    """

    src: str
    dst: str
    method: str
    latency: float
    seconds_by_size: Mapping[int, float] = field(default_factory=dict)

    @property
    def bandwidth(self) -> float:
        """Bandwidth (bytes/s) at the largest measured size."""
        size = max(self.seconds_by_size)
        return size / self.seconds_by_size[size]


def build_topology(devices: Sequence[DeviceSpec | str], measured: Sequence[LinkMeasurement] = (),
                   hosts: Sequence[str] | None = None, network: str | LinkFigure = "rdma400") -> Topology:
    """Links of every ordered pair: measured where ``measured`` has the pair, modelled otherwise.

    The memory of each device is its budget or capacity (``DeviceSpec.memory_bytes``); partitions of one GPU also
    share its memory (:func:`memory_pools`).

    Args:
        devices: device specs or strings, in plan order.
        measured: link measurements (by device names); they win over the model for pairs on one host.
        hosts: host name of each device (same order); pairs on different hosts get the ``network`` link. ``None``:
            every device on one host.
        network: a :data:`NETWORK_FIGURES` key or a :class:`LinkFigure` (e.g. from a measurement).

    Raises:
        ConfigError: ``hosts`` has the wrong length, or ``network`` is not a known figure.
    """
    from torch_tessera.errors import ConfigError

    specs = [parse_device(d) if isinstance(d, str) else d for d in devices]
    n = len(specs)
    if hosts is not None and len(hosts) != n:
        raise ConfigError(f"hosts gives {len(hosts)} host names for {n} devices; give one per device")
    if isinstance(network, str):
        if network not in NETWORK_FIGURES:
            raise ConfigError(f"network {network!r} is not one of {sorted(NETWORK_FIGURES)}")
        network = NETWORK_FIGURES[network]
    bw, lat = np.full((n, n), np.inf), np.zeros((n, n))
    hop, expose = np.zeros((n, n)), np.zeros((n, n))
    got = {(m.src, m.dst): m for m in measured}
    sources, hop_sources = set(), set()
    for i, a in enumerate(specs):
        for j, b in enumerate(specs):
            if i == j:
                continue
            fig, kind = hop_figure(a, b)
            hop[i, j], expose[i, j] = fig.overhead_s, fig.exposure
            hop_sources.add(f"{kind}: {fig.overhead_s * 1e6:.3g} us per cut edge, {fig.exposure:g} of copy time "
                            f"({fig.source})")
            if hosts is not None and hosts[i] != hosts[j]:
                bw[i, j], lat[i, j] = network.bandwidth, network.latency
                sources.add("across hosts: " + network.source)
                continue
            m = got.get((a.name, b.name))
            if m is not None:
                bw[i, j], lat[i, j] = m.bandwidth, m.latency
                sources.add(f"measured ({m.method})")
            else:
                bw[i, j], lat[i, j], why = model_link(a, b)
                sources.add(why)
    return Topology(tuple(s.name for s in specs), bw, lat, tuple(s.memory_bytes for s in specs),
                    source="; ".join(sorted(sources)) or "single device",
                    hosts=tuple(hosts) if hosts is not None else (), hop_overhead=hop, copy_exposure=expose,
                    overhead_source="; ".join(sorted(hop_sources)) or "single device",
                    memory_pools=memory_pools(specs, hosts))


def memory_pools(specs: Sequence[DeviceSpec], hosts: Sequence[str] | None = None) -> tuple[MemoryPool, ...]:
    """The memory the devices of one physical GPU share, counted once.

    Devices are on one GPU when both run on CUDA GPUs (whole or partition) of the same index and host. A device with
    a ``mem=`` budget (or an emulation profile's) keeps that budget, as the user asked, and is not a member; the
    others share the GPU's memory less those budgets. A GPU with one device and no budgeted partition needs no
    pool. Simulated devices (``sim:``) are each a GPU of their own, as the link model takes them; CPU virtual devices
    are test plumbing and share nothing.

    Args:
        specs: the devices, in topology order.
        hosts: host name of each device (``None``: one host).

    Returns:
        One :class:`MemoryPool` per GPU with at least two devices, at least one of them without a budget.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(specs):
        if s.is_gpu and s.index is not None:
            groups.setdefault((hosts[i] if hosts is not None else "", s.index), []).append(i)
    pools = []
    for (host, index), devs in groups.items():
        free = [i for i in devs if specs[i].memory_budget is None]
        if len(devs) < 2 or not free:
            continue
        total = specs[free[0]].memory_bytes
        given = sum(specs[i].memory_budget for i in devs if specs[i].memory_budget is not None)
        name = f"cuda:{index}" + (f" on {host}" if host else "")
        source = (f"the {total / 1e9:.2f} GB of one {specs[free[0]].model}, shared by "
                  + ", ".join(specs[i].name for i in free)
                  + (f", less {given / 1e9:.2f} GB set by mem= on " + ", ".join(specs[i].name for i in devs
                                                                             if i not in free) if given else ""))
        pools.append(MemoryPool(name, tuple(free), max(0, total - given), source))
    return tuple(pools)


# ---------------------------------------------------------------------------------------------------------- measuring

DEFAULT_SIZES = tuple(4096 << (2 * k) for k in range(10))  # 4 KiB, 16 KiB, ... 256 MiB, 1 GiB


def _time_cuda(fn, stream: torch.cuda.Stream, repeats: int) -> float:
    """Median seconds of ``fn`` timed with CUDA events on ``stream``."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _time_host(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _measure_pair(a: Device, b: Device, sizes: Sequence[int], repeats: int) -> LinkMeasurement:
    if not (a.spec.is_gpu and b.spec.is_gpu):
        method = "host"
    elif a.spec.index == b.spec.index:
        method = "same-gpu"
    elif torch.cuda.can_device_access_peer(a.spec.index, b.spec.index):
        method = "peer"
    else:
        method = "staged"
    results = {}
    for size in sizes:
        n = max(1, size // 2)
        with a.guard():
            src = torch.empty(n, dtype=torch.bfloat16, device=a.torch_device)
        with b.guard():
            dst = torch.empty(n, dtype=torch.bfloat16, device=b.torch_device)
        reps = repeats if size < (256 << 20) else max(3, repeats // 4)
        if method == "host":
            results[size] = _time_host(lambda: dst.copy_(src), reps)
        elif method == "staged":
            host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)

            def staged() -> None:
                host.copy_(src, non_blocking=True)
                torch.cuda.current_stream(a.torch_device).synchronize()
                dst.copy_(host, non_blocking=True)
                torch.cuda.current_stream(b.torch_device).synchronize()

            results[size] = _time_host(staged, reps)
        else:
            with a.guard():
                stream = torch.cuda.current_stream(a.torch_device)
                results[size] = _time_cuda(lambda: dst.copy_(src, non_blocking=True), stream, reps)
    latency = results[min(results)]
    return LinkMeasurement(a.name, b.name, method, latency, results)


def measure_links(devices: Sequence[Device], sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 10,
                  progress: bool = True) -> list[LinkMeasurement]:
    """Measure every ordered pair of ``devices``.

    Args:
        devices: open devices (real GPUs, partitions or CPU virtual devices).
        sizes: message sizes in bytes (KB to 1 GiB by default).
        repeats: timed copies per size (a quarter, at least 3, from 256 MiB up).
        progress: show a tqdm progress bar.
    """
    pairs = [(a, b) for a in devices for b in devices if a is not b]
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **_):
            return x
    out = []
    for a, b in tqdm(pairs, desc="links", disable=not progress):
        m = _measure_pair(a, b, sizes, repeats)
        log.info("link %s -> %s (%s): latency %.1f us, %.1f GB/s at %d bytes", a.name, b.name, m.method,
                 m.latency * 1e6, m.bandwidth / 1e9, max(sizes))
        out.append(m)
    return out


def link_table_rows(measured: Sequence[LinkMeasurement]) -> list[dict]:
    """One row per pair and size: what ``tessera devices --measure-links`` and the bench print."""
    return [{"src": m.src, "dst": m.dst, "method": m.method, "bytes": size, "seconds": s, "GB/s": size / s / 1e9}
            for m in measured for size, s in sorted(m.seconds_by_size.items())]
