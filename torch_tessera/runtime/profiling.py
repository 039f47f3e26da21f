"""Time every distinct launch of a program on one open device, with the program's buffers set up there: the runtime
half of :mod:`torch_tessera.target.profiler` (which keys, times and caches), shared by the backend's measured costs
and the measured bench (:func:`torch_tessera.measure.profile_on_device`).

Entry function: :func:`profile_launches`; :func:`prepare_launches` and :func:`graph_total` are its two halves, for
callers that time launches their own way (``measure.kernel_times``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils._pytree import tree_flatten

from torch_tessera.compat.torch_inductor import real_tensors
from torch_tessera.lowering.program import BufferKind, ExternLaunch, KernelProgram, Launch, TensorArg
from torch_tessera.runtime.executor import BufferPool, KernelLauncher, bind_input, fresh_extern_outputs
from torch_tessera.runtime.streams import stream_ctx
from torch_tessera.target.devices import Device
from torch_tessera.target.profiler import (ProfileCache, ProfileColumn, calibrate_to_total, profile_program,
                                           program_key, time_graph_replay, uncached_launches)

log = logging.getLogger(__name__)

#: STATE buffers at most this many bytes (cache-length counters) are restored before every profiled run.
SMALL_STATE_BYTES = 4096


def profile_launches(program: KernelProgram, device: Device, launcher: KernelLauncher, *,
                     inputs: Sequence[Any] | None = None, cache: ProfileCache, warmup: int = 3, repeats: int = 20,
                     calibrate: bool = True, use_cache: bool = True, progress: bool = False,
                     name: str = "program") -> ProfileColumn:
    """Seconds of every launch of ``program`` on ``device``: one column of the measured cost table.

    When ``cache`` holds every distinct launch (and, on a GPU, the whole program's back-to-back time), nothing runs
    and no buffer is allocated. Otherwise the launches run as :func:`prepare_launches` sets them up (copies of
    ``inputs``, or stand-ins), the small STATE buffers restored before every run.

    On a GPU with ``calibrate``, the one-by-one times are scaled to the whole program replayed as one CUDA graph on
    ``device`` (:func:`~torch_tessera.target.profiler.calibrate_to_total`), and that total is cached too.

    Args:
        program: the kernel program.
        device: an open device (CUDA GPU, green-context partition or CPU virtual device).
        launcher: launches single kernels of ``program`` on ``device``.
        inputs: the graph's input values in ``program.inputs`` order, or ``None`` for stand-ins.
        cache: where times are read from and written to.
        warmup: untimed runs per distinct launch.
        repeats: timed runs per distinct launch (the median is kept).
        calibrate: on a GPU, calibrate to the CUDA-graph replay of the whole program.
        use_cache: read cached times (new times are always written).
        progress: show a tqdm bar over the launches.
        name: the program's name in log lines.

    Returns:
        A :class:`~torch_tessera.target.profiler.ProfileColumn` in program order; ``measured`` counts distinct
        launches timed now, ``cache_hits`` those read from ``cache``.
    """
    is_cuda = device.torch_device.type == "cuda"
    total_key = program_key(program, device.spec)
    total = cache.get(total_key) if (use_cache and is_cuda and calibrate) else None
    if use_cache and not uncached_launches(program, device.spec, cache) and (total is not None or not
                                                                                 (is_cuda and calibrate)):
        column = profile_program(program, device, _never_runs, cache=cache, progress=False)
        return _calibrated(column, total, name, device) if total is not None else column
    with real_tensors(), torch.no_grad():
        d = prepare_launches(program, device, launcher, inputs)
        column = profile_program(program, device, lambda launch: d.run(launch, d.stream), warmup=warmup,
                                 repeats=repeats, rotate=lambda launch, i: d.restore(), cache=cache,
                                 use_cache=use_cache, progress=progress)
        if is_cuda and calibrate:
            if total is None:
                try:
                    total = graph_total(d, max(5, repeats))
                except Exception as e:  # noqa: BLE001 - keep the uncalibrated column, say so
                    log.warning("%s on %s: could not time the program as one graph (%s: %s); its launch times stay "
                                "uncalibrated (they include host launch latency)", name, device.name,
                                type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                else:
                    cache.put(total_key, total, f"{name}: whole program as one CUDA graph", device.name)
            if total is not None:
                column = _calibrated(column, total, name, device)
    return column


def _calibrated(column: ProfileColumn, total: float, name: str, device: Device) -> ProfileColumn:
    """``column`` calibrated to ``total`` seconds back to back, or as it is (logged) when ``total`` is too small."""
    try:
        calibrated = calibrate_to_total(column, total)
    except ValueError as e:
        log.warning("%s on %s: launch times stay uncalibrated (%s)", name, device.name, e)
        return column
    log.info("%s on %s: launches one by one sum to %.3f ms, the program as one graph %.3f ms", name, device.name,
             float(column.seconds.sum()) * 1e3, total * 1e3)
    return calibrated


@dataclass(frozen=True)
class DeviceLaunches:
    """A program's launches ready to run one by one on one device, in a private pool.

    Attributes:
        program: the :class:`~torch_tessera.lowering.program.KernelProgram`.
        device: the open :class:`~torch_tessera.target.devices.Device`.
        stream: the device's stream (``None`` on CPU).
        run: ``run(launch, stream)`` issues one launch on ``stream`` (an extern op's fresh outputs bound in the pool).
        restore: puts the small STATE buffers back (see :func:`prepare_launches`).
    """

    program: KernelProgram
    device: Device
    stream: Any
    run: Callable[[Any, Any], None]
    restore: Callable[[], None]


def prepare_launches(program: KernelProgram, device: Device, launcher: KernelLauncher,
                     inputs: Sequence[Any] | None = None) -> DeviceLaunches:
    """Set up ``program``'s buffers in a private pool on ``device`` and run the whole program once in order.

    Inputs are bound to copies of ``inputs`` (weights bound as they are when already on the device; the caller's
    STATE, e.g. a KV cache, is never written), or to stand-ins when ``inputs`` is ``None`` (small normal values in
    floating point buffers, zeros in the others: valid token ids and cache positions, so gathers stay in bounds);
    temporaries are allocated and filled by the one run. Small STATE buffers (<= :data:`SMALL_STATE_BYTES`, the
    cache-length counters) are what ``restore`` puts back, so repeated launches keep writing the same cache
    positions; larger STATE (KV cache contents, an SSM's conv/SSM state) is not: repeated decode launches keep
    updating it, its values drift but stay bounded, and no launch's time depends on them.

    Args:
        program: the kernel program.
        device: an open device.
        launcher: launches single kernels of ``program`` on ``device``.
        inputs: the graph's input values in ``program.inputs`` order, or ``None`` for stand-ins.
    """
    stream = device.default_stream if device.torch_device.type == "cuda" else None
    with real_tensors(), torch.no_grad():
        pool, restore = _setup_pool(program, device, inputs)
        run = _launch_step(program, device, launcher, pool)
        for launch in program.launches:  # one run in order: every temporary holds what the program computes
            run(launch, stream)
        restore()
    return DeviceLaunches(program, device, stream, run, restore)


def graph_total(d: DeviceLaunches, repeats: int) -> float:
    """Seconds of the whole program captured and replayed as one CUDA graph on ``d``'s device (a new stream of it:
    capture needs a non-default stream); median of ``repeats`` replays."""
    stream = d.device.new_stream()

    def run_all() -> None:
        d.restore()
        for launch in d.program.launches:
            d.run(launch, stream)

    with real_tensors(), torch.no_grad():
        run_all()
        return time_graph_replay(run_all, stream, repeats=repeats)


def _never_runs(launch: Launch) -> None:
    raise RuntimeError(f"launch {launch.index} was to be read from the profile cache, not run")  # pragma: no cover


def _setup_pool(program: KernelProgram, device: Device,
                inputs: Sequence[Any] | None) -> tuple[BufferPool, Callable[[], None]]:
    """The pool the launches run in, and the callback restoring its small STATE buffers."""
    tdev = device.torch_device
    pool = BufferPool(tdev)
    small: dict[str, torch.Tensor] = {}
    for i, spec in enumerate(program.inputs):
        if not isinstance(spec, TensorArg) or spec.buffer in pool:
            continue
        buf = program.buffers[spec.buffer]
        if inputs is None:
            where = tdev if torch.device(buf.device).type == tdev.type else torch.device(buf.device)
            pool.bind(spec.buffer, _stand_in(buf.dtype, buf.nbytes, where))
        else:
            value = inputs[i]
            if buf.kind != BufferKind.PARAMETER or value.device != tdev:
                value = value.detach().clone() if value.device == tdev else value.detach().to(tdev, copy=True)
            bind_input(pool, spec, value, i)
        if buf.kind == BufferKind.STATE and buf.nbytes <= SMALL_STATE_BYTES:
            small[spec.buffer] = pool.storages[spec.buffer].clone()
    for name, buf in program.buffers.items():
        if name not in pool:
            pool.allocate(name, buf.nbytes)

    def restore() -> None:
        for name, saved in small.items():
            pool.storages[name].copy_(saved)

    return pool, restore


def _stand_in(dtype: torch.dtype, nbytes: int, device: torch.device) -> torch.Tensor:
    """``nbytes`` of storage for an input nobody passed: floating point buffers (weights, activations) hold small
    normal values, as trained weights do (a GEMM over zeros draws less power than over real values); every other
    dtype holds zeros: valid token ids, indices and cache positions, so gathers and scatters stay in bounds."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    if dtype.is_floating_point and itemsize >= 2 and nbytes % itemsize == 0:
        try:
            return torch.empty(nbytes // itemsize, dtype=dtype, device=device).normal_(0.0, 0.02)
        except (RuntimeError, NotImplementedError):  # a dtype without normal_ (float8): zeros
            pass
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def _launch_step(program: KernelProgram, device: Device, launcher: KernelLauncher,
                 pool: BufferPool) -> Callable[[Launch, Any], None]:
    """``run(launch, stream)``: one launch from ``pool`` on ``device`` (binding the outputs an extern launch creates)."""
    fresh = fresh_extern_outputs(program)

    def run(launch: Any, stream: Any) -> None:
        with device.guard(), stream_ctx(stream):
            result = launcher.launch(launch, pool, stream)
        if isinstance(launch, ExternLaunch) and launch.index in fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in fresh[launch.index]:
                    pool.bind(spec.buffer, t)

    return run
