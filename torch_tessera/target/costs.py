"""Costs the scheduler plans with: per-kernel times on each device, and the links between devices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class CostTable:
    """Time of every kernel launch on every device.

    Attributes:
        devices: device names, e.g. ``("cuda:0", "cuda:1@24sm")``.
        kernels: launch indices (program order) the rows refer to.
        seconds: array ``[len(kernels), len(devices)]`` of times in seconds (float64); ``inf`` = cannot run there.
        source: where the numbers come from ("measured on <gpu> <date>", "roofline model <catalog>").
    """

    devices: tuple[str, ...]
    kernels: tuple[int, ...]
    seconds: np.ndarray
    source: str = "unspecified"

    def __post_init__(self) -> None:
        if self.seconds.shape != (len(self.kernels), len(self.devices)):
            raise ValueError(
                f"CostTable.seconds has shape {self.seconds.shape}, expected {(len(self.kernels), len(self.devices))}"
            )

    def row(self, kernel: int) -> np.ndarray:
        """Times of one launch on every device (seconds)."""
        return self.seconds[self.kernel_index[kernel]]

    @property
    def kernel_index(self) -> dict[int, int]:
        """Row of each launch index in :attr:`seconds` (built once; do not modify)."""
        idx = self.__dict__.get("_idx_cache")
        if idx is None:
            idx = {k: i for i, k in enumerate(self.kernels)}
            object.__setattr__(self, "_idx_cache", idx)
        return idx


@dataclass(frozen=True)
class MemoryPool:
    """Memory that several devices of a topology share: the SM partitions of one physical GPU.

    Each member keeps its own budget in :attr:`Topology.memory`; the bytes all members hold together (resident
    buffers plus each used member's activation reserve) must also fit :attr:`capacity`.

    Attributes:
        name: the physical device, e.g. ``"cuda:0"`` (``"cuda:0 on host-a"`` when hosts are given).
        members: indices of the sharing devices in :attr:`Topology.devices` (at least one, increasing).
        capacity: bytes the members may hold together: the GPU's memory less the ``mem=`` budgets of its partitions
            that carry one (those count their own budget and are not members).
        source: how :attr:`capacity` was set, for error messages (e.g. ``"the 141.00 GB of one NVIDIA H200"``).
    """

    name: str
    members: tuple[int, ...]
    capacity: int
    source: str = ""

    def __post_init__(self) -> None:
        if not self.members or list(self.members) != sorted(set(self.members)) or self.capacity < 0:
            raise ValueError(f"MemoryPool {self.name!r}: members must be increasing device indices and capacity >= 0, "
                             f"got {self.members}, {self.capacity}")


@dataclass(frozen=True)
class Topology:
    """Devices and the links between them.

    Attributes:
        devices: device names, same order as the cost table's columns.
        bandwidth: ``[D, D]`` bytes/s of the link ``src -> dst`` (diagonal unused).
        latency: ``[D, D]`` seconds of fixed cost per transfer ``src -> dst`` on the LINK (diagonal unused).
        memory: bytes each device may use for this model (weights, state, activations).
        source: where the link figures come from.
        hosts: host name of every device (empty: all on one host). Pairs on different hosts are linked by the
            network (see :func:`torch_tessera.target.links.build_topology`), which the bandwidth and latency already
            reflect; this field says why.
        hop_overhead: ``[D, D]`` seconds each edge cut ``src -> dst`` costs on the timelines of BOTH devices it joins,
            per program run (per micro-batch): the event, copy node and cross-device wait of one hop and the overlap
            it breaks, which perfect micro-batch overlap would hide but the runtime does not (``None``: zeros; the
            figures and their source are in :mod:`torch_tessera.target.links`, ``HOP_FIGURES``).
        copy_exposure: ``[D, D]`` share (0..1) of each copy's link time (``bytes / bandwidth``) that also lands on
            both devices' timelines (copies on the dependency chain are not fully overlapped; ``None``: zeros).
        overhead_source: where ``hop_overhead`` and ``copy_exposure`` come from.
        memory_pools: memory several devices share (SM partitions of one GPU: :class:`MemoryPool`); the planners keep
            each pool's members within its capacity together, besides each device's own budget in :attr:`memory`.
    """

    devices: tuple[str, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    memory: tuple[int, ...] = field(default=())
    source: str = "unspecified"
    hosts: tuple[str, ...] = field(default=())
    hop_overhead: np.ndarray | None = None
    copy_exposure: np.ndarray | None = None
    overhead_source: str = "none"
    memory_pools: tuple[MemoryPool, ...] = field(default=())

    def __post_init__(self) -> None:
        d = len(self.devices)
        if any(m >= d for pool in self.memory_pools for m in pool.members):
            raise ValueError(f"Topology.memory_pools names device indices beyond the {d} devices")
        for name in ("hop_overhead", "copy_exposure"):
            v = getattr(self, name)
            arr = np.zeros((d, d)) if v is None else np.broadcast_to(np.asarray(v, dtype=np.float64), (d, d)).copy()
            if (arr < 0).any() or not np.isfinite(arr).all():
                raise ValueError(f"Topology.{name} must be finite and >= 0, got {arr.tolist()}")
            np.fill_diagonal(arr, 0.0)
            object.__setattr__(self, name, arr)

    def without_overheads(self) -> "Topology":
        """The same links with no per-hop charge on the devices (the cycle model of bytes and latency alone)."""
        from dataclasses import replace

        return replace(self, hop_overhead=None, copy_exposure=None, overhead_source="none")

    def free_transfers(self) -> "Topology":
        """Same devices and memory, transfers free (infinite bandwidth, no latency, no per-hop charge): the
        zero-communication bound's topology."""
        return Topology(self.devices, np.full_like(np.asarray(self.bandwidth, dtype=np.float64), 1e30),
                        np.zeros_like(np.asarray(self.latency, dtype=np.float64)), self.memory, "free transfers",
                        self.hosts, memory_pools=self.memory_pools)

    def same_host(self, a: int, b: int) -> bool:
        """Whether devices ``a`` and ``b`` share a host (always, when no hosts were given)."""
        return not self.hosts or self.hosts[a] == self.hosts[b]

    def transfer_seconds(self, src: int, dst: int, nbytes: int) -> float:
        """Predicted time to move ``nbytes`` from device ``src`` to ``dst`` (0 when src == dst)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return float(self.latency[src, dst] + nbytes / self.bandwidth[src, dst])

    @staticmethod
    def uniform(devices: Sequence[str], bandwidth: float, latency: float, memory: Sequence[int] = (),
                hop_overhead: float = 0.0, copy_exposure: float = 0.0) -> "Topology":
        """All pairs linked alike: ``bandwidth`` bytes/s, ``latency`` seconds on the link, ``hop_overhead`` seconds
        and ``copy_exposure`` (share of the copy time) on both devices of every cut edge."""
        d = len(devices)
        return Topology(
            devices=tuple(devices),
            bandwidth=np.full((d, d), float(bandwidth)),
            latency=np.full((d, d), float(latency)),
            memory=tuple(int(m) for m in memory),
            source="uniform",
            hop_overhead=np.full((d, d), float(hop_overhead)),
            copy_exposure=np.full((d, d), float(copy_exposure)),
            overhead_source="uniform" if hop_overhead or copy_exposure else "none",
        )
