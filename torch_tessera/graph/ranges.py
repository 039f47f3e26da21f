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
