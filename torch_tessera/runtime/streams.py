"""Streams of the runtime: priority classes, pipeline slots (:class:`Lane`) and how a copy is ordered among them.

Everything here is below the executors: it knows devices (``torch_device``, ``new_stream``) and CUDA streams, not
programs or schedules. On CPU virtual devices streams are ``None`` and every helper is a no-op.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

#: Most urgent stream priority assumed where CUDA cannot be asked (CPU virtual devices): CUDA's range on recent GPUs.
CPU_GREATEST_PRIORITY = -5

#: Priority classes of a program's streams (``PlacedExecutor.priority_class``). When several programs share the
#: devices (an LLM's prefill and decode served at once), the one on a request's per-token path is ``"urgent"`` and
#: the bulk one ``"background"``, so a decode kernel queued behind a prefill GEMM gets the SMs as blocks retire.
#: Source: the paper's pipelining ablation (arXiv 2604.10180, section 5) staggers priorities across micro-batches.
from torch_tessera.options import PRIORITY_CLASSES  # noqa: E402  (the home is options)


def slot_priorities(slots: int, greatest: int, priority_class: str = "normal") -> list[int]:
    """Stream priority of each slot (lower is more urgent).

    ``"normal"``: slot 0 the most urgent, each later slot one level less, the last at 0. ``"urgent"``: the same
    staggering one level more urgent, so no slot is at 0 (where a ``"normal"`` program's last slot and every
    ``"background"`` stream run). ``"background"``: every slot at 0. All are clipped at ``greatest``.

    Args:
        slots: number of slots (>= 1).
        greatest: the most urgent priority the device allows (CUDA: negative, e.g. -5; lower is more urgent).
        priority_class: one of :data:`PRIORITY_CLASSES`.

    Raises:
        ValueError: an unknown ``priority_class``.
    """
    if priority_class not in PRIORITY_CLASSES:
        raise ValueError(f"priority_class={priority_class!r}: use one of {PRIORITY_CLASSES}")
    if priority_class == "background":
        return [0] * slots
    shift = 1 if priority_class == "urgent" else 0
    return [max(greatest, -(slots - 1 - k) - shift) for k in range(slots)]


def single_priority(priority_class: str, greatest: int) -> int:
    """Priority of a program's own (non-pipelined) compute streams: 0, or one level more urgent for ``"urgent"``."""
    return slot_priorities(1, greatest, priority_class)[0]


def greatest_priority(devices: Sequence[Any]) -> int:
    """The most urgent stream priority the devices allow (CUDA's, or :data:`CPU_GREATEST_PRIORITY` on CPU)."""
    if any(d.torch_device.type == "cuda" for d in devices):
        return torch.cuda.Stream.priority_range()[1]
    return CPU_GREATEST_PRIORITY


def stream_ctx(stream: Any) -> Any:
    """``torch.cuda.stream(stream)`` for a CUDA stream; a null context for ``None`` or a CPU stand-in."""
    if stream is None or not isinstance(stream, torch.cuda.Stream):
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


@dataclass
class Lane:
    """One pipeline slot's streams.

    Attributes:
        slot: slot index (0 = most urgent).
        priority: the stream priority of all its streams (lower is more urgent).
        devices: the runtime devices, in the executor's order.
        streams: compute stream per device (index as ``devices``); None on a CPU virtual device.
        copy_streams: copy stream per link ``(src, dst)``, made at first use.
    """

    slot: int
    priority: int
    devices: list[Any]
    streams: list[Any]
    copy_streams: dict[tuple[int, int], Any] = field(default_factory=dict)

    def copy_stream(self, src: int, dst: int) -> Any:
        """The slot's copy stream for link ``src -> dst`` (on the destination device when it is a GPU)."""
        key = (src, dst)
        if key not in self.copy_streams:
            dev = self.devices[dst] if self.devices[dst].torch_device.type == "cuda" else self.devices[src]
            self.copy_streams[key] = dev.new_stream(priority=self.priority) if dev.torch_device.type == "cuda" else None
        return self.copy_streams[key]

    def cuda_streams(self) -> list[Any]:
        """Every CUDA stream of the slot: compute, then copy."""
        return [s for s in [*self.streams, *self.copy_streams.values()] if isinstance(s, torch.cuda.Stream)]

    def barrier(self) -> None:
        """Make every compute stream of the slot wait for all work queued so far on all the slot's streams."""
        every = self.cuda_streams()
        for s in self.streams:
            if isinstance(s, torch.cuda.Stream):
                for t in every:
                    if t is not s:
                        s.wait_stream(t)

    def join(self, devices: Sequence[Any]) -> None:
        """Every compute stream waits for the caller's current stream on its device (inputs may be in flight)."""
        for dev, s in zip(devices, self.streams):
            if isinstance(s, torch.cuda.Stream):
                caller = torch.cuda.current_stream(dev.torch_device)
                if s.cuda_stream != caller.cuda_stream:
                    s.wait_stream(caller)


def make_lanes(devices: Sequence[Any], slots: int, priority_class: str = "normal") -> list[Lane]:
    """``slots`` lanes over ``devices`` with staggered priorities (see :func:`slot_priorities`)."""
    greatest = greatest_priority(devices)
    return [Lane(k, p, list(devices), [d.new_stream(priority=p) if d.torch_device.type == "cuda" else None
                                        for d in devices])
            for k, p in enumerate(slot_priorities(slots, greatest, priority_class))]


def order_copy(src_stream: Any, dst_stream: Any, copy_stream: Any, waits: tuple[bool, bool],
               issue: Callable[[Any], None]) -> None:
    """Issue one cut-edge copy with ``issue(stream)`` and order it among the compute streams by stream waits.

    The copy runs after everything queued on the producer's stream (``src_stream``) and the consumer's stream
    (``dst_stream``) waits for it. ``waits = (wait_dst, src_waits)`` from :func:`~torch_tessera.runtime.schedule.
    copy_hazards`: the copy also waits for the consumer's stream (it overwrites bytes a launch there may still read),
    and the producer's stream waits for the copy (a later launch there overwrites what it reads).

    On ``copy_stream`` (the link's own stream) the copy overlaps later work of the producer. With ``copy_stream=None``
    it runs on the producer's stream: no copy stream and one event fewer per hop, at the price of serialising the
    copy with the producer's later launches; every ordering of the first way holds in the second (a copy stream only
    ever carries copies out of that producer, each after the producer's earlier work), which
    ``tests/runtime/test_graph_copy_order.py`` checks on real schedules.
    """
    wait_dst, src_waits = waits
    stream = src_stream if copy_stream is None else copy_stream
    if stream is not src_stream:
        stream.wait_stream(src_stream)
    if wait_dst:
        stream.wait_stream(dst_stream)
    issue(stream)
    dst_stream.wait_stream(stream)
    if src_waits and stream is not src_stream:
        src_stream.wait_stream(stream)
