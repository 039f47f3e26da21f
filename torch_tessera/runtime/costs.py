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
        return self.seconds[self._index[kernel]]

    @property
    def _index(self) -> dict[int, int]:
        idx = self.__dict__.get("_idx_cache")
        if idx is None:
            idx = {k: i for i, k in enumerate(self.kernels)}
            object.__setattr__(self, "_idx_cache", idx)
        return idx


@dataclass(frozen=True)
class Topology:
    """Devices and the links between them.

    Attributes:
        devices: device names, same order as the cost table's columns.
        bandwidth: ``[D, D]`` bytes/s of the link ``src -> dst`` (diagonal unused).
        latency: ``[D, D]`` seconds of fixed cost per transfer ``src -> dst`` (diagonal unused).
        memory: bytes each device may use for this model (weights, state, activations).
        source: where the link figures come from.
        hosts: host name of every device (empty: all on one host). Pairs on different hosts are linked by the
            network (see :func:`torch_tessera.runtime.links.build_topology`), which the bandwidth and latency already
            reflect; this field says why.
    """

    devices: tuple[str, ...]
    bandwidth: np.ndarray
    latency: np.ndarray
    memory: tuple[int, ...] = field(default=())
    source: str = "unspecified"
    hosts: tuple[str, ...] = field(default=())

    def same_host(self, a: int, b: int) -> bool:
        """Whether devices ``a`` and ``b`` share a host (always, when no hosts were given)."""
        return not self.hosts or self.hosts[a] == self.hosts[b]

    def transfer_seconds(self, src: int, dst: int, nbytes: int) -> float:
        """Predicted time to move ``nbytes`` from device ``src`` to ``dst`` (0 when src == dst)."""
        if src == dst or nbytes <= 0:
            return 0.0
        return float(self.latency[src, dst] + nbytes / self.bandwidth[src, dst])

    @staticmethod
    def uniform(devices: Sequence[str], bandwidth: float, latency: float, memory: Sequence[int] = ()) -> "Topology":
        """All pairs linked alike: ``bandwidth`` bytes/s, ``latency`` seconds."""
        d = len(devices)
        return Topology(
            devices=tuple(devices),
            bandwidth=np.full((d, d), float(bandwidth)),
            latency=np.full((d, d), float(latency)),
            memory=tuple(int(m) for m in memory),
            source="uniform",
        )
