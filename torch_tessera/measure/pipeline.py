"""The measured bench's stages in order: build and compile, profile, plan, run, compose (:func:`measure_plans`)."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any, Callable

from torch_tessera.errors import DeviceOutOfMemoryError
from torch_tessera.measure.estimate import planned_calls, remaining_line
from torch_tessera.measure.execute import make_plans, run_plan
from torch_tessera.measure.profile import measured_workload
from torch_tessera.measure.programs import Compiled, build_programs, compile_program
from torch_tessera.measure.rows import MeasuredRow, compose_rows
from torch_tessera.measure.settings import MeasureSettings

log = logging.getLogger("torch_tessera.measure")


def measure_plans(s: MeasureSettings, progress: Any = None,
                  say: Callable[[str], None] | None = None) -> tuple[list[MeasuredRow], dict]:
    """Build, compile, profile, plan, run and time every plan (see :mod:`torch_tessera.measure`).

    Args:
        s: the settings.
        progress: a tqdm-like bar (``update(n)``, ``set_description(str)``); :func:`total_steps` steps.
        say: receives a line once the plans are made (the calls left and the time they should take, from the
            profiled launch times) and after each executed plan (its calls and time, the estimate of the rest); every
            line is also logged at INFO under ``torch_tessera.measure``.

    Returns:
        ``(rows, meta)``; ``meta`` holds the bound, unit, shapes, devices, prices, the measured cost tables' totals
        and how long each phase took.

    Raises:
        ConfigError: bad settings. DeviceUnavailableError: a device string that is not available here.
    """
    from torch_tessera.benchmark import plan_names
    from torch_tessera.target.devices import parse_run_devices
    from torch_tessera.scheduler import Plan

    specs, on_cuda, home = parse_run_devices(s.devices, "--measure")
    graphs = on_cuda if s.cuda_graphs is None else s.cuda_graphs
    seconds: dict[str, float] = {}

    def step(desc: str, n: int = 1) -> None:
        if progress is not None:
            progress.set_description(desc)
            progress.update(n)

    t0 = time.perf_counter()
    progs = build_programs(s, home)
    seconds["build"] = time.perf_counter() - t0
    for prog in progs:
        t1 = time.perf_counter()
        compile_program(prog, s.devices, graphs)
        seconds[f"compile_{prog.name}"] = time.perf_counter() - t1
        step(f"compiled {prog.name}")
    t0 = time.perf_counter()
    wl, topo, tables = measured_workload(progs, s, progress)
    seconds["profile"] = time.perf_counter() - t0
    # one call ~ its launches on the home device, as profiled (the executor's own time comes on top)
    per_call = sum(float(t.seconds[:, 0].sum()) for t in tables.values()) / max(1, len(tables))
    t0 = time.perf_counter()
    plans, bound_cycle, choice = make_plans(wl, topo, len(specs), s.streams,
                                            in_flight=s.micro_batches if s.micro_batches >= 2 else 1)
    # pd's row is derived (its placement run as one program pair would not pay the state hand-over); so is
    # tessera's when it takes pd's placement. Plans with replicas (request-dist that could not run as streams) too.
    derived = {"pd"} | ({"tessera"} if choice.chosen == "pd" else set())
    if progress is not None and len(plans) > len(plan_names(len(specs))):
        progress.total += len(plans) - len(plan_names(len(specs)))  # tessera-single beside a streams plan
    step("planned")
    seconds["plan"] = time.perf_counter() - t0
    on_cpu = not on_cuda
    calls = planned_calls(s, plans, derived, on_cpu)
    _say(say, f"planned: {len(calls)} plans to run and time ({', '.join(calls)}); "
              + remaining_line(sum(calls.values()), per_call, "each program's launches as profiled"))
    t0 = time.perf_counter()
    runs: dict[str, dict] = {}
    streams: dict[int, list[Compiled]] = {}  # request stream -> its own programs (streams plans)

    def programs_of(p: Plan) -> list[Compiled]:
        """``progs``, and for a streams plan every further stream's programs (built and compiled once)."""
        extra = []
        for r in sorted({int(n.rsplit("@", 1)[1]) for n in p.placements if "@" in n}):
            if r not in streams:
                t1 = time.perf_counter()
                streams[r] = build_programs(s, home)  # the model again: its own weights and state
                for prog in streams[r]:
                    prog.name = f"{prog.name}@{r}"
                    compile_program(prog, s.devices, graphs)
                seconds[f"compile_stream_{r}"] = time.perf_counter() - t1
            extra += streams[r]
        return list(progs) + extra

    done, t_runs = 0, time.perf_counter()
    for name, p in plans.items():
        if isinstance(p, Plan) and name not in derived and not p.replicas:
            if progress is not None:
                progress.set_description(f"running {name} ({calls.get(name, 0):,} calls)")
            t1 = time.perf_counter()
            try:
                runs[name] = run_plan(programs_of(p), p, s)
            except DeviceOutOfMemoryError as e:
                runs[name] = {"error": f"does not fit (at run time): {str(e)[:100]}"}
            done += calls.get(name, 0)
            rate = (time.perf_counter() - t_runs) / max(1, done)
            left = sum(calls.values()) - done
            _say(say, f"ran {name}: {calls.get(name, 0):,} calls in {time.perf_counter() - t1:.0f} s"
                      + (f"; {remaining_line(left, rate, 'the calls so far')}" if left > 0 else ""))
        step(f"ran {name}")
    rows, bound = compose_rows(progs, plans, runs, bound_cycle, s, tessera_from=choice.chosen)
    seconds["run"] = time.perf_counter() - t0
    comp = s.composition
    p_tok, batch, context = s.shape
    label, factor = comp.display
    meta = {"model": s.model, "family": s.family, "size": s.size, "layers": s.kept_layers,
            "devices": [sp.name for sp in specs], "unit": comp.unit, "display_unit": label, "display_factor": factor,
            "programs": {p.name: {"frequency": comp.frequencies[p.name], "launches": len(p.runner.program.launches)}
                         for p in progs},
            "output_per_step": comp.output_per_step, "output_tokens": s.output_tokens, "prefill_tokens": p_tok,
            "batch": batch, "decode_batch": batch if p_tok is not None else None, "context": context,
            "cuda_graphs": graphs, "links": topo.source, "micro_batches": s.micro_batches,
            "hop_overhead_s": topo.hop_overhead.tolist(), "copy_exposure": topo.copy_exposure.tolist(),
            "hop_overhead_source": topo.overhead_source,
            # per launch, per device (seconds, calibrated): enough to re-plan and re-fit offline
            "kernel_seconds": {n: t.seconds.T.tolist() for n, t in tables.items()},
            "zero_communication_bound_cycle_s": bound_cycle, "zero_communication_bound_output_per_s": bound,
            "tessera_choice": choice.note, "tessera_from": choice.chosen, "tessera_space": choice.scores,
            "measured_kernel_seconds": {n: [float(x) for x in t.seconds.sum(axis=0)] for n, t in tables.items()},
            "cost_sources": {n: t.source for n, t in tables.items()},
            "prices": {sp.name: (sp.price_per_hour, sp.price_source) for sp in specs}, "seconds": seconds,
            "settings": asdict(s), "timings_meaningful": on_cuda,
            "runs": {n: {k: v for k, v in r.items() if k in RUN_DETAILS} for n, r in runs.items()},
            "plans": {n: {"placements": {pr: [int(pl[i]) for i in sorted(pl)] for pr, pl in p.placements.items()},
                          "frequencies": dict(p.frequencies), "solver_notes": list(p.solver.notes),
                          "cycle_seconds": p.cycle_seconds, "device_seconds": list(p.device_seconds),
                          "cut_edges": {pr: sum(1 for e in p.cut_edges if e.program == pr and e.kind != "STATE")
                                        for pr in p.placements}}
                      for n, p in plans.items() if isinstance(p, Plan)},
            "launch_names": {p.name: [getattr(l, "kernel", None) or getattr(l, "op", "?")
                                      for l in p.runner.program.launches] for p in progs}}
    return rows, meta


#: what each executed plan's run reports beside its row (per program): bytes copied by purpose in one call, GPU
#: busy time of one call (:func:`~torch_tessera.measure.execute.device_busy`), call times
RUN_DETAILS = ("seconds", "pipelined_seconds", "concurrent_step_seconds", "concurrent_threads", "bytes_per_call",
               "device_busy", "pipelined_busy", "cut_edges", "priority_classes", "error")


def _say(say: Callable[[str], None] | None, line: str) -> None:
    log.info("%s", line)
    if say is not None:
        say(line)


def total_steps(n_devices: int, n_programs: int = 2) -> int:
    """Progress steps :func:`measure_plans` reports: a compile and ``n_devices`` profiles per program, 1 plan, one
    per plan."""
    from torch_tessera.benchmark import plan_names

    return n_programs * (1 + n_devices) + 1 + len(plan_names(n_devices))
