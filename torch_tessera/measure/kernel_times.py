"""Per-launch seconds of a program timed back to back in program order, and the file format that keeps them beside
the program they were timed on (``bench/gpu_kernel_times.py`` writes it; ``tessera calibrate`` reads it).

**How a launch is timed.** The program's launches are issued in program order on one stream, a timing marker (a CUDA
event) between every two, and a launch's seconds are the time between its two markers: what it adds to a back-to-back
run, including the gap the stream leaves between two kernels. A host issues a launch in tens of microseconds, longer
than most kernels run, so an unheld GPU would wait for the host and the markers would time the host. The stream is
therefore held first by a backlog of GEMMs (one known GEMM timed first; as many as cover the host's issue time of the
chunk, x 1.5), and the launches are issued while it runs, in chunks of at most ``chunk`` launches (the launch queue is
finite). Each chunk's check: the backlog's GPU time must exceed the host's issue time of the backlog and the chunk,
so the GPU never waited; a chunk that fails is redone with twice the backlog, and flagged ``starved`` if it still
fails (a launch that synchronises the host, as a data-dependent shape does). Before a chunk, the program state is
put back and the launches before it run untimed (so every launch sees the buffers and state the program gives it),
and ``warm`` launches before the chunk run again after the backlog, so the L2 holds what program order leaves there.
Per launch the median over ``repeats`` runs is kept.

This is chosen over CUPTI kernel records (``torch.profiler``) because it times partitions (green-context streams) and
whole GPUs the same way, needs no mapping of library kernels (a cuBLAS launch may run several) to launches, and
counts the inter-kernel gap a back-to-back run pays. The sum over launches is checked against the program replayed as
one CUDA graph (``graph_total_s`` in the file).

**Format** (``"format": "torch_tessera.LaunchTimes"``, ``"version": 1``; one file per (model, device)): ``model``,
``device`` (as run, ``cuda:0@24sm``), ``sim_device`` (the catalog device it stands for, ``sim:h200@24sm`` with the
granted SM count), ``gpu`` (its name), ``settings``, ``method``, ``versions``, and ``programs``: name -> ``program``
(the dump beside it, :func:`~torch_tessera.lowering.serialize.dump_program`, path relative to this file),
``seconds`` (per launch, program order), ``spread`` (per launch, (max - min) / median over the repeats),
``starved`` (per launch: timed in a starved chunk), ``starved_chunks``, ``sum_s``, ``graph_total_s`` (``null`` when the graph could not be timed), and ``features`` (each
launch's :class:`~torch_tessera.target.costmodel.LaunchFeatures` as lowered there, used when the dump does not load).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from torch_tessera import jsonout
from torch_tessera.errors import ConfigError

FORMAT, VERSION = "torch_tessera.LaunchTimes", 1
SUFFIX = ".launch_times.json"


class Clock(Protocol):
    """Timing markers on one device: ``mark()`` queues a marker, ``hold(s)`` queues about ``s`` seconds of work that
    touches little memory, ``sync()`` waits for everything queued, ``elapsed(a, b)`` is seconds between two markers
    (after ``sync``), ``hold_unit()`` the seconds of one unit of :meth:`hold` work."""

    def mark(self) -> Any: ...
    def hold(self, units: int) -> None: ...
    def hold_unit(self) -> float: ...
    def sync(self) -> None: ...
    def elapsed(self, a: Any, b: Any) -> float: ...


class HostClock:
    """Markers on the host's clock, for devices that run synchronously (CPU virtual devices); nothing to hold."""

    def mark(self) -> float:
        return time.perf_counter()

    def hold(self, units: int) -> None:
        return None

    def hold_unit(self) -> float:
        return 0.0

    def sync(self) -> None:
        return None

    def elapsed(self, a: float, b: float) -> float:
        return b - a


class CudaClock:
    """CUDA events on ``stream``; the hold is a chain of 4096 x 4096 bf16 GEMMs on the same stream (few queue
    entries per millisecond held; the ``warm`` launches after it refill the L2)."""

    def __init__(self, stream: Any, device: Any):
        import torch

        self.torch, self.stream = torch, stream
        with torch.cuda.stream(stream):
            self._a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
            self._b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
            self._c = torch.empty(4096, 4096, device=device, dtype=torch.bfloat16)
        self._unit = None

    def mark(self) -> Any:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        return e

    def hold(self, units: int) -> None:
        with self.torch.cuda.stream(self.stream):
            for _ in range(units):
                self.torch.mm(self._a, self._b, out=self._c)

    def hold_unit(self) -> float:
        if self._unit is None:
            self.hold(3)
            a = self.mark()
            self.hold(20)
            b = self.mark()
            self.sync()
            self._unit = self.elapsed(a, b) / 20
        return self._unit

    def sync(self) -> None:
        self.stream.synchronize()

    def elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3


@dataclass(frozen=True)
class BackToBack:
    """Seconds per launch of one program timed back to back (see the module docstring).

    Attributes:
        seconds: median seconds per launch, program order.
        spread: (max - min) / median per launch over the repeats.
        starved_chunks: chunks in which the GPU may have waited for the host (their times include host time).
        chunks: chunks per repeat.
        starved: per launch, whether a chunk it was timed in was starved in some repeat.
    """

    seconds: tuple[float, ...]
    spread: tuple[float, ...]
    starved_chunks: int
    chunks: int
    starved: tuple[bool, ...] = ()


def time_back_to_back(n: int, run_launch: Callable[[int], None], reset: Callable[[], None], clock: Clock,
                      repeats: int = 5, chunk: int = 96, warm: int = 4, tries: int = 3) -> BackToBack:
    """Time launches ``0..n-1`` back to back in program order (module docstring).

    Args:
        n: launches in the program.
        run_launch: issues launch ``i`` on the clock's stream (does not wait for it).
        reset: puts the program's state back as it is before launch 0.
        clock: the markers (:class:`CudaClock` on a GPU, :class:`HostClock` on CPU).
        repeats: timed runs per launch (median kept).
        chunk: launches timed after one backlog.
        warm: launches before a chunk run again after its backlog, untimed, so the caches hold what program order
            leaves there.
        tries: attempts per chunk, the backlog doubled after each starved one.

    Raises:
        ConfigError: ``n``, ``repeats`` or ``chunk`` below 1.
    """
    if n < 1 or repeats < 1 or chunk < 1:
        raise ConfigError(f"time_back_to_back needs n, repeats and chunk >= 1 (got {n}, {repeats}, {chunk})")
    times = np.full((repeats, n), np.nan)
    starved = 0
    flagged = np.zeros(n, bool)
    bounds = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    unit = clock.hold_unit()
    backlog = {b: 1 for b in bounds}
    for r in range(repeats):
        for start, end in bounds:
            for attempt in range(tries):
                ok, row = _one_chunk(start, end, warm, run_launch, reset, clock, unit, backlog, attempt == 0 and r == 0)
                if ok:
                    break
                backlog[(start, end)] *= 2
            starved += not ok
            flagged[start:end] |= not ok
            times[r, start:end] = row
    med = np.median(times, axis=0)
    spread = (times.max(axis=0) - times.min(axis=0)) / np.where(med > 0, med, np.nan)
    return BackToBack(tuple(float(x) for x in med), tuple(float(x) for x in spread), starved, len(bounds),
                      tuple(bool(x) for x in flagged))


def _one_chunk(start: int, end: int, warm: int, run_launch, reset, clock: Clock, unit: float, backlog: dict,
               size_it: bool) -> tuple[bool, np.ndarray]:
    """One chunk's times and whether the GPU was held throughout (see :func:`time_back_to_back`)."""
    key = (start, end)
    first = max(0, start - warm)
    reset()
    for i in range(first):
        run_launch(i)
    clock.sync()
    if size_it and unit > 0:  # a dry issue of the chunk tells the host's pace
        t0 = time.perf_counter()
        for i in range(first, end):
            run_launch(i)
        host = time.perf_counter() - t0
        clock.sync()
        backlog[key] = max(backlog[key], math.ceil(1.5 * host / unit) + 1)
        reset()
        for i in range(first):
            run_launch(i)
        clock.sync()
    t0 = time.perf_counter()
    b0 = clock.mark()
    clock.hold(backlog[key] if unit > 0 else 0)
    for i in range(first, start):
        run_launch(i)
    marks = [clock.mark()]
    for i in range(start, end):
        run_launch(i)
        marks.append(clock.mark())
    host = time.perf_counter() - t0
    clock.sync()
    held = clock.elapsed(b0, marks[0])
    row = np.array([clock.elapsed(a, b) for a, b in zip(marks, marks[1:])])
    return (unit <= 0 or held >= host), row


# -- the file format -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchTimes:
    """One program's launches timed on one device, read back from a file (:func:`load_launch_times`).

    Attributes:
        model: registry model.
        program: program name (``prefill``, ``decode``, ``denoise``).
        device: the device string it ran on (``cuda:0@24sm``).
        sim_device: the catalog device it stands for (``sim:h200@24sm``).
        seconds: per launch, program order.
        features: per launch (:class:`~torch_tessera.target.costmodel.LaunchFeatures`), from the dumped program
            when it loads, else as stored in the file.
        starved: per launch, whether its time may include host time (a starved chunk; all ``False`` when the file
            has no per-launch flags).
        source: the file.
    """

    model: str
    program: str
    device: str
    sim_device: str
    seconds: tuple[float, ...]
    features: tuple
    starved: tuple[bool, ...]
    source: str


def features_json(features: Sequence[Any]) -> list[dict]:
    """:class:`LaunchFeatures` as JSON objects (the class by its value)."""
    out = []
    for f in features:
        d = asdict(f)
        d["kernel_class"] = f.kernel_class.value
        out.append(d)
    return out


def _features_from_json(rows: Sequence[Mapping]) -> tuple:
    from torch_tessera.target.costmodel import KernelClass, LaunchFeatures

    def one(r: Mapping) -> LaunchFeatures:
        reuse = r.get("reuse")
        reuse = None if reuse is None else tuple((float(d), float(b)) for d, b in reuse)
        return LaunchFeatures(**{**r, "kernel_class": KernelClass(r["kernel_class"]), "reuse": reuse})

    return tuple(one(r) for r in rows)


def write_launch_times(path: str | os.PathLike, *, model: str, device: str, sim_device: str, gpu: str,
                       settings: Mapping, programs: Mapping[str, Mapping], method: str, versions: Mapping) -> None:
    """Write one (model, device) file of the format in the module docstring; ``programs`` maps a program name to
    its entries (``program``, ``seconds``, ``spread``, ``starved_chunks``, ``sum_s``, ``graph_total_s``,
    ``features``)."""
    data = {"format": FORMAT, "version": VERSION, "model": model, "device": device, "sim_device": sim_device,
            "gpu": gpu, "settings": dict(settings), "method": method, "versions": dict(versions),
            "programs": {k: dict(v) for k, v in programs.items()}}
    Path(path).write_text(jsonout.dumps(data, indent=1))


def load_launch_times(path: str | os.PathLike) -> list[LaunchTimes]:
    """Every program of one file, features from its dumped program (or, when that does not load, the stored ones).

    Raises:
        ConfigError: not a file of this format, or a program whose launch count differs from its seconds.
    """
    from torch_tessera.lowering.serialize import ProgramFileError, load_program
    from torch_tessera.target.costmodel import program_features

    origin = os.fspath(path)
    try:
        data = json.loads(Path(origin).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{origin}: cannot read launch times ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(f"{origin}: not a {FORMAT} file of version {VERSION}")
    out = []
    for name, p in data["programs"].items():
        feats = None
        if p.get("program"):
            try:
                prog = load_program(Path(origin).parent / p["program"])
                feats = program_features(prog)
            except ProgramFileError:
                feats = None
        if feats is None and p.get("features"):
            feats = _features_from_json(p["features"])
        if feats is None:
            raise ConfigError(f"{origin}: program {name}: neither its dump {p.get('program')!r} loads nor are "
                              "features stored")
        if len(feats) != len(p["seconds"]):
            raise ConfigError(f"{origin}: program {name}: {len(feats)} launches but {len(p['seconds'])} seconds")
        starved = tuple(bool(x) for x in p.get("starved") or [False] * len(feats))
        out.append(LaunchTimes(data["model"], name, data["device"], data["sim_device"],
                               tuple(float(s) for s in p["seconds"]), feats, starved, origin))
    return out
