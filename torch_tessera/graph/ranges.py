"""Byte-range bookkeeping per storage: who last wrote each byte, and who read it since.

A :class:`StorageHistory` holds disjoint segments covering ``[0, nbytes)`` of one storage; each segment records its
last writer (a launch index, or ``None`` for bytes the program has not written: graph inputs, fresh allocations) and
the launches that read it since that write. Reads and writes split segments at their boundaries, so views of one
storage (a q/k/v split, a slice of a KV cache) only depend on the bytes they touch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open ranges, sorted, empty ranges dropped."""
    out: list[list[int]] = []
    for s, e in sorted(r for r in ranges if r[1] > r[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


#: Views with more contiguous runs than this are summarised by their envelope (see :func:`view_byte_ranges`).
MAX_RUNS = 64


def view_byte_ranges(offset: int, size: tuple[int, ...], stride: tuple[int, ...], itemsize: int,
                     max_runs: int = MAX_RUNS) -> list[tuple[int, int]] | None:
    """Exact bytes a strided view addresses, as merged half-open ranges, or None when it has more than ``max_runs``
    contiguous runs (then only its envelope ``[first byte, last byte + 1)`` is known).

    Args:
        offset: storage offset in elements.
        size / stride: the view's shape and strides (elements).
        itemsize: bytes per element.
        max_runs: largest number of runs enumerated.
    """
    import numpy as np

    if any(s == 0 for s in size):
        return []
    dims = sorted(((st, sz) for sz, st in zip(size, stride) if sz > 1), reverse=True)  # outer (large stride) first
    merged: list[list[int]] = []
    for st, sz in dims:  # collapse a dim into the next-inner one when they are contiguous with each other
        merged.append([st, sz])
    i = len(merged) - 1
    while i > 0:
        st_o, sz_o = merged[i - 1]
        st_i, sz_i = merged[i]
        if st_o == st_i * sz_i:
            merged[i - 1:i + 1] = [[st_i, sz_i * sz_o]]
        i -= 1
    run = itemsize
    if merged and merged[-1][0] == 1:
        run = merged[-1][1] * itemsize
        merged = merged[:-1]
    runs = 1
    for _, sz in merged:
        runs *= sz
    if runs > max_runs:
        return None
    starts = np.zeros(1, dtype=np.int64)
    for st, sz in merged:
        starts = (starts[:, None] + np.arange(sz, dtype=np.int64)[None, :] * st).reshape(-1)
    starts = np.unique(starts * itemsize + offset * itemsize)
    return merge_ranges([(int(s), int(s) + run) for s in starts])


@dataclass
class _Segment:
    start: int
    end: int
    writer: int | None = None
    readers: set[int] = field(default_factory=set)


class StorageHistory:
    """Last writer and readers-since of every byte of one storage."""

    def __init__(self, nbytes: int):
        self.segments = [_Segment(0, max(nbytes, 0))]

    def _split(self, at: int) -> None:
        for i, seg in enumerate(self.segments):
            if seg.start < at < seg.end:
                self.segments[i:i + 1] = [_Segment(seg.start, at, seg.writer, set(seg.readers)),
                                          _Segment(at, seg.end, seg.writer, set(seg.readers))]
                return
        if self.segments and at > self.segments[-1].end:  # a view beyond the recorded size: grow
            self.segments.append(_Segment(self.segments[-1].end, at))

    def _covering(self, start: int, end: int) -> list[_Segment]:
        self._split(start)
        self._split(end)
        return [s for s in self.segments if s.start >= start and s.end <= end and s.end > s.start]

    def read(self, start: int, end: int, reader: int) -> dict[int, list[tuple[int, int]]]:
        """Record a read; returns ``{writer: [(start, end), ...]}``: which earlier launch last wrote which of those
        bytes (the RAW sources)."""
        sources: dict[int, list[tuple[int, int]]] = {}
        for seg in self._covering(start, end):
            if seg.writer is not None and seg.writer != reader:
                sources.setdefault(seg.writer, []).append((seg.start, seg.end))
            seg.readers.add(reader)
        return sources

    def write(self, start: int, end: int, writer: int) -> tuple[set[int], set[int]]:
        """Record a write; returns (earlier writers of those bytes (WAW), readers since then (WAR))."""
        waw: set[int] = set()
        war: set[int] = set()
        for seg in self._covering(start, end):
            if seg.writer is not None and seg.writer != writer:
                waw.add(seg.writer)
            war |= seg.readers - {writer}
            seg.writer = writer
            seg.readers = set()
        self._coalesce()
        return waw, war

    def _coalesce(self) -> None:
        out: list[_Segment] = []
        for seg in self.segments:
            if out and out[-1].writer == seg.writer and out[-1].readers == seg.readers and out[-1].end == seg.start:
                out[-1].end = seg.end
            else:
                out.append(seg)
        self.segments = out
