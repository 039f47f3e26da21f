"""Measure every launch of a :class:`KernelProgram` on one device: one column of the cost table.

Each distinct launch (same kernel source, same argument shapes/strides/dtypes and scalars, same grid and config) is
timed once: Inductor reuses one kernel across identical layers, so a 32-layer model costs ~1/32 of its launches. Per
distinct launch: ``warmup`` untimed runs, then ``repeats`` timed runs, the median kept. Before every run the optional
``rotate(launch, i)`` callback may swap in fresh inputs or rotate buffers so caches do not flatter the result (it runs
outside the timed region). GPUs are timed with CUDA events on the device's stream; CPU virtual devices with
``time.perf_counter``; tests pass a fake :class:`Timer`.

Results are cached on disk, one JSON file per launch key, under ``$TESSERA_CACHE_DIR/profiles`` (default
``~/.cache/torch_tessera/profiles``). The key hashes the kernel source (Triton) or op name (extern), the argument
signature (shapes, strides, dtypes, scalars), grid and config, the device's model, architecture, SM count and throttle,
and the torch and Triton versions, so a changed kernel, another device or another compiler never reuses a stale time.
A cache that cannot be written keeps its times in memory for the process, after one
:class:`~torch_tessera.errors.TesseraCacheWarning`; an unreadable entry is ignored with a log warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from torch_tessera.lowering.program import ExternLaunch, KernelProgram, Launch, TensorArg, to_jsonable
from torch_tessera import knobs
from torch_tessera.target.costs import CostTable
from torch_tessera.errors import DeviceUnavailableError, TesseraCacheWarning, warn_user
from torch_tessera.target.devices import Device, DeviceKind, DeviceSpec

log = logging.getLogger(__name__)


class Timer(Protocol):
    """Times one call of ``fn``, in seconds."""

    def time(self, fn: Callable[[], None]) -> float: ...


class PerfCounterTimer:
    """Wall-clock timer for CPU virtual devices (CPU work is synchronous)."""

    def time(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


class CudaEventTimer:
    """CUDA-event timer: ``fn`` runs with ``stream`` current, events recorded on it before and after."""

    def __init__(self, stream: torch.cuda.Stream):
        self.stream = stream

    def time(self, fn: Callable[[], None]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            fn()
            end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where profiles are cached: ``override``, else ``$TESSERA_CACHE_DIR``, else ``~/.cache/torch_tessera``."""
    return (Path(override) if override else knobs.cache_dir()) / "profiles"


def _signature(obj: object) -> object:
    if isinstance(obj, TensorArg):  # which storage it views does not change the time; its shape does
        return ["T", list(obj.size), list(obj.stride), str(obj.dtype), obj.offset % 16]
    if isinstance(obj, (tuple, list)):
        return [_signature(o) for o in obj]
    if isinstance(obj, dict):
        return {str(k): _signature(v) for k, v in obj.items()}
    return to_jsonable(obj)


#: Version of the cached profiles: bump when what a cached time means changes (an entry of another version is a miss).
SCHEMA = 2


def _versions() -> list[str]:
    try:
        import triton

        triton_version = str(triton.__version__)
    except ImportError:  # pragma: no cover - torch without triton
        triton_version = "none"
    return [f"schema{SCHEMA}", torch.__version__, triton_version]


def launch_key(program: KernelProgram, launch: Launch, device: DeviceSpec) -> str:
    """Cache key of one launch on one device (see the module docstring for what it covers)."""
    if isinstance(launch, ExternLaunch):
        code = ["extern", launch.op]
        body = [_signature(list(launch.args)), _signature(dict(launch.kwargs))]
    else:
        src = program.kernels.get(launch.kernel)
        code = ["triton", src.source_hash if src is not None else launch.kernel]
        body = [_signature(list(launch.args)), list(launch.grid), to_jsonable(dict(launch.config))]
    blob = json.dumps([code, body, device.cache_identity, _versions()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def program_key(program: KernelProgram, device: DeviceSpec, kernels: Sequence[int] | None = None) -> str:
    """Cache key of a whole run of ``kernels`` (default: every launch) of ``program`` on ``device``, in that order:
    the key of the back-to-back time :func:`calibrate_to_total` scales a column to."""
    by_index = {launch.index: launch for launch in program.launches}
    wanted = list(by_index) if kernels is None else list(kernels)
    blob = json.dumps(["program", [launch_key(program, by_index[k], device) for k in wanted]])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class ProfileCache:
    """One JSON file per launch key: ``{"seconds": ..., "label": ..., "device": ..., "measured_at": ...}``.

    Times are also kept in memory for the life of the object, so a directory that cannot be written (one
    :class:`~torch_tessera.errors.TesseraCacheWarning` naming it and the fix) still serves what this process measured.

    Attributes:
        root: the directory of the entries (``<cache root>/profiles``).
        write_error: why the directory could not be written (``None`` while writes succeed).
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = cache_dir(root)
        self.write_error: str | None = None
        self._memory: dict[str, float] = {}

    def get(self, key: str) -> float | None:
        """Seconds cached under ``key``, or ``None`` (a miss; an unreadable or invalid entry is logged and missed)."""
        if key in self._memory:
            return self._memory[key]
        path = self.root / f"{key}.json"
        try:
            seconds = float(json.loads(path.read_text())["seconds"])
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("ignoring unreadable profile cache entry %s: %s", path, exc)
            return None
        if not (math.isfinite(seconds) and seconds >= 0):
            log.warning("ignoring profile cache entry %s: %r is not a time in seconds", path, seconds)
            return None
        self._memory[key] = seconds
        return seconds

    def put(self, key: str, seconds: float, label: str, device: str) -> None:
        """Cache ``seconds`` under ``key``: in memory always, on disk unless the directory cannot be written."""
        self._memory[key] = seconds
        if self.write_error is not None:
            return
        tmp = self.root / f"{key}.json.tmp{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"seconds": seconds, "label": label, "device": device,
                                       "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}))
            tmp.replace(self.root / f"{key}.json")
        except OSError as exc:
            self.write_error = f"{type(exc).__name__}: {exc}"
            message = (f"the profile cache {self.root} cannot be written ({self.write_error}); measured kernel times "
                       "are kept in memory for this process only, so the next process measures again. Set "
                       "TESSERA_CACHE_DIR to a writable directory.")
            log.warning("%s", message)
            warn_user(message, TesseraCacheWarning)


@dataclass(frozen=True)
class ProfileColumn:
    """Measured seconds of launches on one device.

    Attributes:
        device: device name.
        kernels: launch indices.
        seconds: ``[len(kernels)]`` median seconds per launch.
        source: "measured on <device> (<model>, <arch>) <date>".
        measured: distinct launches timed in this call.
        cache_hits: distinct launches taken from the disk cache.
    """

    device: str
    kernels: tuple[int, ...]
    seconds: np.ndarray
    source: str
    measured: int = 0
    cache_hits: int = 0


def calibrate_to_total(column: ProfileColumn, total_s: float, floor_s: float = 1e-6) -> ProfileColumn:
    """Rescale a column of launches timed one by one so that they sum to ``total_s``, the measured time of the whole
    program run back to back (a CUDA graph replay of every launch in order on that device).

    A launch timed alone between two CUDA events also pays the host's launch latency while the GPU waits (tens of
    microseconds; more than a decode-sized kernel itself takes), which a graph replay does not, so launches timed
    alone can sum to several times the replayed program (docs/BENCHMARKS.md, profile calibration). The excess is
    modelled as a constant per
    launch: ``o = (sum(seconds) - total_s) / n`` is subtracted from every launch (not below ``floor_s``; what the
    floor keeps is taken from the others in proportion). If the launches sum to less than ``total_s``, they are
    scaled up uniformly.

    Args:
        column: seconds per launch, timed one by one.
        total_s: seconds of the whole program on the same device, back to back.
        floor_s: least seconds a launch keeps.

    Returns:
        a column over the same launches whose seconds sum to ``total_s`` (to rounding), with ``source`` saying so.

    Raises:
        ValueError: ``total_s`` is not positive or smaller than ``floor_s`` x launches.
    """
    sec = np.asarray(column.seconds, dtype=float)
    n = len(sec)
    if not total_s > 0 or total_s < floor_s * n:
        raise ValueError(f"total_s={total_s} must be positive and at least floor_s x launches ({floor_s * n})")
    if sec.sum() <= total_s:
        out = sec * (total_s / sec.sum())
    else:
        out = np.maximum(sec - (sec.sum() - total_s) / n, floor_s)
        for _ in range(50):  # what the floor kept, taken back from the launches above it, in proportion
            excess = out.sum() - total_s
            above = out > floor_s
            if excess <= 1e-15 * total_s or not above.any():
                break
            room = out[above] - floor_s
            out[above] -= room * min(1.0, excess / room.sum())
    source = f"{column.source}; calibrated to {total_s * 1e3:.3f} ms for the whole program back to back " \
             f"(one-by-one sum {sec.sum() * 1e3:.3f} ms)"
    return ProfileColumn(column.device, column.kernels, out, source, column.measured, column.cache_hits)


def time_graph_replay(run_all: Callable[[], None], stream: Any, warmup: int = 3, repeats: int = 20) -> float:
    """Median seconds of one replay of ``run_all`` captured once as a CUDA graph on ``stream`` (a non-default stream
    of the device ``run_all`` issues its work to): a whole program back to back, as the runtime replays it.

    The caller runs ``run_all`` once eagerly first (kernels compiled, fresh outputs bound); capture allocates from a
    private graph pool.
    """
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run_all()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            graph.replay()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    return float(statistics.median(times))


def to_cost_table(columns: Sequence[ProfileColumn]) -> CostTable:
    """Stack columns (same kernels, any devices) into a :class:`CostTable`.

    Raises:
        ValueError: the columns cover different launches.
    """
    if not columns:
        raise ValueError("to_cost_table needs at least one column")
    kernels = columns[0].kernels
    for c in columns[1:]:
        if c.kernels != kernels:
            raise ValueError(f"column {c.device} covers other launches than {columns[0].device}; profile the same set")
    return CostTable(tuple(c.device for c in columns), kernels, np.stack([c.seconds for c in columns], axis=1),
                     source="; ".join(c.source for c in columns))


def uncached_launches(program: KernelProgram, device: DeviceSpec, cache: ProfileCache,
                      kernels: Sequence[int] | None = None) -> list[int]:
    """Launch indices among ``kernels`` (default: all) whose time :func:`profile_program` would measure now: one per
    distinct launch key without a cached time. Empty: profiling reads everything from ``cache`` and runs nothing."""
    by_index = {launch.index: launch for launch in program.launches}
    missing: dict[str, int] = {}
    for k in (list(by_index) if kernels is None else kernels):
        key = launch_key(program, by_index[k], device)
        if key not in missing and cache.get(key) is None:
            missing[key] = k
    return list(missing.values())


def _progress(items: list, desc: str, enabled: bool):
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return items
    return tqdm(items, desc=desc, unit="launch")


def profile_program(program: KernelProgram, device: Device | DeviceSpec,
                    run_launch: Callable[[Launch], None], *, kernels: Sequence[int] | None = None,
                    warmup: int = 3, repeats: int = 20, rotate: Callable[[Launch, int], None] | None = None,
                    timer: Timer | None = None, cache: ProfileCache | None = None, use_cache: bool = True,
                    progress: bool = True) -> ProfileColumn:
    """Time launches of ``program`` on ``device``.

    Args:
        program: the kernel program.
        device: an open :class:`Device` (its stream is timed) or a spec (then ``timer`` is required for GPUs); not a
            simulated device.
        run_launch: runs one launch on the device (the executor's launch step, with inputs already in place).
        kernels: launch indices to time; all when ``None``.
        warmup: untimed runs per distinct launch.
        repeats: timed runs per distinct launch; the median is kept.
        rotate: called as ``rotate(launch, i)`` before every run (untimed) to swap in fresh inputs.
        timer: how to time one run; default CUDA events on the device's stream, or ``perf_counter`` on CPU devices.
        cache: the disk cache (default: :func:`cache_dir`).
        use_cache: read cached times (new measurements are always written).
        progress: show a tqdm progress bar.

    Raises:
        DeviceUnavailableError: ``device`` is simulated.
        ValueError: a GPU spec without an open device or a timer.
    """
    spec = device.spec if isinstance(device, Device) else device
    if spec.kind is DeviceKind.SIM:
        raise DeviceUnavailableError(f"{spec.name} is simulated: model it with costmodel.estimate_costs, "
                                     "profiling needs a real device")
    if timer is None:
        if not spec.is_gpu:
            timer = PerfCounterTimer()
        elif isinstance(device, Device):
            timer = CudaEventTimer(device.default_stream)
        else:
            raise ValueError(f"profiling {spec.name} needs an open Device (for its stream) or an explicit timer")
    cache = cache or ProfileCache()
    by_index = {l.index: l for l in program.launches}
    wanted = list(by_index) if kernels is None else list(kernels)
    memo: dict[str, float] = {}
    seconds = np.empty(len(wanted))
    measured = hits = 0
    for row, k in enumerate(_progress(wanted, f"profile {spec.name}", progress)):
        launch = by_index[k]
        key = launch_key(program, launch, spec)
        if key not in memo:
            cached = cache.get(key) if use_cache else None
            if cached is not None:
                memo[key], hits = cached, hits + 1
            else:
                memo[key] = _time_launch(launch, run_launch, timer, warmup, repeats, rotate)
                cache.put(key, memo[key], getattr(launch, "kernel", None) or launch.op, spec.name)
                measured += 1
        seconds[row] = memo[key]
    log.info("profiled %d launches on %s: %d timed, %d from cache, %d reused within the program", len(wanted),
             spec.name, measured, hits, len(wanted) - measured - hits)
    source = f"measured on {spec.name} ({spec.model}, {spec.arch}) {time.strftime('%Y-%m-%d')}"
    return ProfileColumn(spec.name, tuple(wanted), seconds, source, measured, hits)


def _time_launch(launch: Launch, run_launch: Callable[[Launch], None], timer: Timer, warmup: int, repeats: int,
                 rotate: Callable[[Launch, int], None] | None) -> float:
    for i in range(warmup):
        if rotate is not None:
            rotate(launch, i)
        run_launch(launch)
    times = []
    for i in range(repeats):
        if rotate is not None:
            rotate(launch, warmup + i)
        times.append(timer.time(lambda: run_launch(launch)))
    return float(statistics.median(times))
