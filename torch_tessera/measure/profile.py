"""Profile every launch of each compiled program on each device: the MEASURED cost tables, and the scheduler's
workload and topology built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import logging

import torch

from torch_tessera.measure.programs import Compiled
from torch_tessera.measure.settings import MeasureSettings

log = logging.getLogger(__name__)

#: STATE buffers at most this many bytes (cache-length counters) are restored before every profiled run.
SMALL_STATE_BYTES = 4096


@dataclass(frozen=True)
class DeviceLaunches:
    """A compiled program's launches ready to run one by one on device ``g`` of its runner, in a private pool.

    Attributes:
        program: the runner's :class:`~torch_tessera.lowering.program.KernelProgram`.
        device: the runtime :class:`~torch_tessera.target.devices.Device`.
        stream: the device's stream (``None`` on CPU).
        run: ``run(launch, stream)`` issues one launch on ``stream`` (an extern op's fresh outputs bound in the pool).
        restore: puts the small STATE buffers back (see :func:`prepare_launches`).
    """

    program: Any
    device: Any
    stream: Any
    run: Callable[[Any, Any], None]
    restore: Callable[[], None]


def prepare_launches(prog: Compiled, g: int) -> DeviceLaunches:
    """Bind ``prog``'s inputs in a private pool on device ``g`` of its runner and run the whole program once in order.

    Weights are bound (copied when the device has other memory), other inputs and STATE copied (the caller's KV cache
    is not touched), the rest allocated and filled by one run of the whole program in order. Small STATE buffers
    (<= :data:`SMALL_STATE_BYTES`, the cache-length counters) are what ``restore`` puts back, so repeated launches
    keep writing the same cache positions; larger STATE (KV cache contents, an SSM's conv/SSM state) is not:
    repeated decode launches keep updating the SSM state, whose values drift but stay bounded (the recurrence
    decays), and no launch's time depends on them.
    """
    from torch.utils._pytree import tree_flatten

    from torch_tessera.lowering.program import BufferKind, ExternLaunch, TensorArg
    from torch_tessera.runtime.executor import BufferPool, bind_input, fresh_extern_outputs
    from torch_tessera.runtime.streams import stream_ctx as _stream_ctx

    runner = prog.runner
    program = runner.program
    dev = runner.devices[g]
    tdev = dev.torch_device
    launcher = runner.executor.launchers[g]
    stream = dev.default_stream if tdev.type == "cuda" else None
    pool = BufferPool(tdev)
    small: dict[str, torch.Tensor] = {}
    prog.reset()
    for i, (spec, value) in enumerate(zip(program.inputs, prog.args)):
        if not isinstance(spec, TensorArg) or spec.buffer in pool:
            continue
        kind = program.buffers[spec.buffer].kind
        if kind != BufferKind.PARAMETER or value.device != tdev:
            value = value.detach().clone().to(tdev) if value.device == tdev else value.detach().to(tdev, copy=True)
        bind_input(pool, spec, value, i)
        if kind == BufferKind.STATE and program.buffers[spec.buffer].nbytes <= SMALL_STATE_BYTES:
            small[spec.buffer] = pool.storages[spec.buffer].clone()
    for name, buf in program.buffers.items():
        if name not in pool:
            pool.allocate(name, buf.nbytes)
    fresh = fresh_extern_outputs(program)

    def run_launch(launch: Any, on: Any) -> None:
        with dev.guard(), _stream_ctx(on):
            result = launcher.launch(launch, pool, on)
        if isinstance(launch, ExternLaunch) and launch.index in fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in fresh[launch.index]:
                    pool.bind(spec.buffer, t)

    def restore() -> None:
        for name, saved in small.items():
            pool.storages[name].copy_(saved)

    with torch.no_grad():
        for launch in program.launches:  # one run in order: every temporary holds what the program computes
            run_launch(launch, stream)
        restore()
    return DeviceLaunches(program, dev, stream, run_launch, restore)


def profile_on_device(prog: Compiled, g: int, s: MeasureSettings) -> Any:
    """Time every launch of ``prog`` on device ``g`` of its runner: one column of the measured cost table.

    The launches run as :func:`prepare_launches` sets them up, each distinct launch timed one by one
    (:func:`~torch_tessera.target.profiler.profile_program`); on a GPU the column is then calibrated to the whole
    program replayed back to back as one CUDA graph.

    Returns:
        a :class:`~torch_tessera.target.profiler.ProfileColumn` (seconds per launch, program order).
    """
    from torch_tessera.target.profiler import ProfileCache, profile_program

    d = prepare_launches(prog, g)
    program, dev = d.program, d.device
    stream = d.stream

    def run_launch(launch: Any) -> None:
        d.run(launch, stream)

    def restore(launch: Any, i: int) -> None:
        d.restore()

    with torch.no_grad():
        column = profile_program(program, dev, run_launch, warmup=s.profile_warmup, repeats=s.profile_repeats,
                                 rotate=restore, cache=ProfileCache(s.profile_cache), progress=False)
        if dev.torch_device.type == "cuda":
            # one-by-one times include the host's launch latency; calibrate them to the whole program replayed
            # back to back as one CUDA graph on this device (see target.profiler.calibrate_to_total)
            from torch_tessera.target.profiler import calibrate_to_total

            try:
                total = graph_total(d, max(5, s.profile_repeats))
            except Exception as e:  # noqa: BLE001 - keep the uncalibrated column, say so
                log.warning("%s on %s: could not time the program as one graph (%s: %s); its launch times stay "
                            "uncalibrated (they include host launch latency)", prog.name, dev.name,
                            type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            else:
                one_by_one = float(column.seconds.sum())
                column = calibrate_to_total(column, total)
                log.info("%s on %s: launches one by one sum to %.3f ms, the program as one graph %.3f ms",
                         prog.name, dev.name, one_by_one * 1e3, total * 1e3)
    return column


def graph_total(d: DeviceLaunches, repeats: int) -> float:
    """Seconds of the whole program captured and replayed as one CUDA graph on ``d``'s device (a new stream of it:
    capture needs a non-default stream); median of ``repeats`` replays."""
    from torch_tessera.target.profiler import time_graph_replay

    stream = d.device.new_stream()

    def run_all() -> None:
        d.restore()
        for launch in d.program.launches:
            d.run(launch, stream)

    with torch.no_grad():
        run_all()
        return time_graph_replay(run_all, stream, repeats=repeats)


def measured_workload(progs: Sequence[Compiled], s: MeasureSettings, progress: Any = None,
                      frequencies: Mapping[str, float] | None = None) -> tuple[Any, Any, dict]:
    """Profile every program on every device and build the scheduler's workload and topology from the measurements.

    Args:
        progs: the compiled programs, in the order a workload step runs them.
        s: the settings (profile repeats, links; the composition when ``frequencies`` is not given).
        progress: a tqdm-like bar, advanced once per (program, device).
        frequencies: program name -> runs per workload step (default: ``s.composition.frequencies``).

    Returns:
        ``(workload, topology, cost_tables)`` where ``cost_tables`` maps program name -> measured ``CostTable``.
    """
    from torch_tessera.target.links import build_topology, measure_links
    from torch_tessera.target.profiler import to_cost_table
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.types import WorkloadProgram

    tables = {}
    for prog in progs:
        cols = []
        for g in range(len(prog.runner.devices)):
            cols.append(profile_on_device(prog, g, s))
            if progress is not None:
                progress.set_description(f"profiled {prog.name} on {prog.runner.devices[g].name}")
                progress.update(1)
        tables[prog.name] = to_cost_table(cols)
    devices = progs[0].runner.devices
    measured = measure_links(devices, progress=False) if s.links == "measured" else ()
    topo = build_topology([d.spec for d in devices], measured)
    freq = s.composition.frequencies if frequencies is None else frequencies
    wl = Workload(tuple(WorkloadProgram(p.name, p.runner.dag, tables[p.name], float(freq[p.name]),
                                        p.name if p.name in ("prefill", "decode") else "") for p in progs))
    return wl, topo, tables
