"""What a cut edge costs when the explicit schedule runs as ONE captured CUDA graph, per model and plan.

For each model (``--model``, default Llama, Mamba and the MMDiT at ``--layers`` layers) on ``--devices`` and each plan
(the planner's throughput plan, ``af``, a random placement, and the zero-cut plans ``homo-L``, ``homo-R`` and
``request-dist``), the modulo scheduler's schedule over ``--micro-batches`` micro-batches is replayed by the runtime
and its steady-state step (one replay: every micro-batch once) is timed in these modes:

* ``executed``: the schedule captured as one CUDA graph and replayed (:mod:`torch_tessera.runtime.captured`); results
  checked against the single-call run of the home placement, which is checked against eager PyTorch;
* ``no-wait``: every record and wait dropped (results wrong; timing only), captured;
* ``alone-D``: device D's share of the steps alone (no waits, the other device idle), captured;
* ``eager``: the same schedule issued step by step from the host (:mod:`torch_tessera.runtime.replay`), with its host
  issue time (``--no-eager`` skips it).

``request-dist`` is one replica per device with the micro-batches split between them: micro-batches ``0..k-1`` run
every launch on device 0, the others on device 1, with no waits (one memory domain only: the replicas share the
weights). Every mode after ``executed`` runs in the buffers of the executed replay, so a mode that drops steps still
reads real values. On CPU virtual devices nothing can be captured: every mode is issued from the host (plumbing only).

On a GPU, each captured mode is also timed on the device (CUDA events on the replay's home stream, queued behind a
spin kernel so the host's prelude is hidden): ``device:M`` the whole call (input copies, graph replay, output clones),
``device:M@graph`` the captured graph's replay alone, ``host-issue:M`` the host's seconds from the call's start to
its last issue (before its wait), and beside each ``alone-D`` a ``device:plain-D``: device D's
launches of that share captured as one plain CUDA graph (no runtime copies, clones or stream joins). Per model, each
device's program is timed whole as a plain graph and without events, and its per-launch costs three ways (event pair,
minimum of 3: the costs every simulation reads unless named; event pair, median; one event between launches,
median): :func:`launch_costs`. The simulations read each table, and the primary costs calibrated to the plain program
graph (``simulated_plain_s``); ``cut_diagnose.md`` puts them beside the host and device timings.

Per plan: cut edges, the executed step, the simulated step (:func:`torch_tessera.scheduler.simulate.simulate` with the
measured per-launch costs, the planner's bandwidth figures, DRAM shared by SM count, for the captured graph no host
cost and :class:`~torch_tessera.scheduler.issue.GraphIssue`'s overlap, :class:`~torch_tessera.scheduler.issue.HostIssue`
for the eager replay), executed / simulated, and the
lost time per cut edge ``(executed - max(alone)) / (cut edges x micro-batches)``, with the no-wait share of it. Modes
are timed in ``--rounds`` interleaved rounds (order reversed every round) of ``--calls`` replays (more where a step is
short: ``--min-timed-s``): per round, the calls issued back to back with one synchronisation at the end (the steady
state of a loop of calls; a call over one GPU returns before its replay ends, so the next call's host work overlaps
it), one sample per round, and the same number of calls each synchronized after (``sync:M``: the host's work before
each replay adds to the step); median per mode. On a GPU the call's host work outside its graph is measured in the same
run (:func:`measured_call`) and every plan is also simulated with it (``simulated_call_s``).

Usage (one H200 split in two green-context partitions; about 6 min for the three models)::

    python bench/gpu_cut_diagnose.py --out DIR --devices cuda:0@104sm,cuda:0@24sm --layers 8
    python bench/gpu_cut_diagnose.py --out DIR --model llama --plans tessera,af --modes captured,eager --rounds 1
    python bench/gpu_cut_diagnose.py --out DIR --devices cpu:0,cpu:1 --size tiny --layers 2 --model mlp --rounds 1 \
        --calls 1   # CPU dry run (plumbing only)

``--plans`` and ``--modes`` (``executed`` or ``captured``, ``no-wait``, ``alone``, ``eager``) run only some, to
bisect a failure in a short call. Every step is announced on stdout (``llama/tessera: executed: first call ...``) and
synchronized after, so the last line before a CUDA error names the plan, mode and stage (bind, warm-up, capture,
replay) it came from. A CUDA error poisons the process's context: the bench then stops (exit status 1) and says so
instead of running the later plans and models.

Writes ``DIR/cut_diagnose.json`` and ``DIR/cut_diagnose.md`` (rewritten after every plan) and ``DIR/cut_diagnose.log``
(every progress line and traceback, flushed as it goes; faulthandler's stack on a crash). The JSON keeps what the
simulations read (per model ``sim_inputs``: the measured per-launch costs per device, links, DRAM figures; per plan
``schedule``: its steps; :mod:`torch_tessera.scheduler.simrecord`), so they can be recomputed without the GPU::

    python bench/gpu_cut_diagnose.py --resimulate DIR/cut_diagnose.json [--overlap-us 2.0] [--call-us 680] [--out DIR2]

writes ``cut_diagnose_resimulated.json`` / ``.md``. ``simulated_s`` is the captured replay as the planner simulates
it (every measured cost whole: the figure the Must-show compares with), ``simulated_overlap_s`` the same with
:class:`~torch_tessera.scheduler.issue.GraphIssue`'s graph overlap (the measured costs are timed between CUDA events;
a launch right after another in one graph hides part of that; not used by the planner: docs/BENCHMARKS.md, graph
overlap).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("gpu_cut_diagnose")

PLANS = ("tessera", "af", "random", "homo-L", "homo-R", "request-dist")

#: largest relative L2 error of a plan's first output against the home placement's, in bf16 (another placement
#: reorders nothing inside a kernel, so anything above rounding noise is a wrong result)
TOLERANCE = 1e-2


def say(msg: str) -> None:
    """A progress line on stdout and in the log file (``DIR/cut_diagnose.log``), flushed at once: the last line
    before a failure names the model, plan, mode and stage it happened in."""
    print(msg, flush=True)
    log.info("%s", msg)


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "to_tuple"):
        x = x.to_tuple()
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    return None


def rel_error(a: Any, b: Any) -> float:
    """``|a - b| / |b|`` (L2 norms) of the first tensor of each; infinite when they cannot be compared."""
    a, b = _first_tensor(a), _first_tensor(b)
    if a is None or b is None or a.shape != b.shape:
        return float("inf")
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def build(name: str, args) -> tuple[Any, Any, tuple, list, float]:
    """The model (``--layers`` kept), its inputs, the runner of its largest program on ``--devices``, the program's
    input template, and the relative error of the compiled home placement against eager PyTorch."""
    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model

    spec = get_model(name)
    on_cuda = args.devices.startswith("cuda")
    dtype = torch.float32 if args.size == "tiny" else torch.bfloat16
    model = build_module(name, args.size, device="cuda" if on_cuda else None, dtype=dtype)
    if args.layers and hasattr(model, "model"):  # the registry's wrappers hold the transformers / diffusers module
        cut_layers(model.model, spec.family, args.layers)
    inputs = spec.example_inputs(args.size, *shape_of(name, args), device="cuda" if on_cuda else "cpu", dtype=dtype,
                                 seed=0)
    torch._dynamo.reset()
    backend = RecordingBackend(devices=args.devices, policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        got = compiled(*inputs)
        want = model(*inputs)
    equal = rel_error(got, want)
    runner = max(backend.executors, key=lambda r: len(r.program.launches))
    seen: list = []
    ex = runner.executor
    run = ex.run
    ex.run = lambda a: (seen.append(list(a)), run(a))[1]
    with torch.no_grad():
        compiled(*inputs)
    del ex.run
    return spec, runner, inputs, seen[0], equal


def shape_of(name: str, args) -> tuple[int | None, int | None]:
    """``(batch, seq)`` of ``name``'s inputs: ``--shape`` (``model=BATCHxSEQ``), else the registry's default (None)."""
    for item in (args.shape or "").split(","):
        key, _, value = item.partition("=")
        if key.strip() == name and value:
            batch, _, seq = value.lower().partition("x")
            return int(batch), int(seq)
    return None, None


def micro_batches(spec, args, template, inputs, n: int, device: str, seed: int = 100) -> list[list]:
    """``n`` micro-batches of fresh inputs (seeds ``seed``, ``seed + 1``, ...) in the program's input order (weights
    shared)."""
    out = []
    for k in range(n):
        fresh = spec.example_inputs(args.size, *shape_of(spec.name, args), device=device, seed=seed + k,
                                    dtype=torch.float32 if args.size == "tiny" else torch.bfloat16)
        batch = list(template)
        for old, new in zip(inputs, fresh):
            batch = [new if a is old else a for a in batch]
        out.append(batch)
    return out


#: host seconds of lead a spin kernel gives per launch before the timed launches (the eager issue takes ~0.12 ms per
#: launch and its two events: docs/BENCHMARKS.md, cut diagnosis)
LEAD_PER_LAUNCH_S = 400e-6


#: event-pair repeats whose minimum is the primary per-launch cost (the method of every run before session 14, kept so
#: the ``simulated`` column stays comparable); the other figures take the median of ``--cost-repeats`` runs
PAIR_MIN_OF = 3


def launch_costs(runner, batch: list, repeats: int = 5) -> tuple[Any, dict]:
    """Seconds of each launch on each device alone, timed several ways, and each device's whole program timed back
    to back. On CPU the roofline model and no variants (plumbing only).

    Per device, the program placed whole on it, every run queued behind a spin kernel so the GPU runs the launches
    back to back (otherwise each would include the host's issue gap), ``repeats`` runs of each method:

    * ``pair-min3`` (the returned table): an event pair around every launch, minimum of the first
      :data:`PAIR_MIN_OF` runs;
    * ``pair-median``: the same event pairs, median of the ``repeats`` runs;
    * ``between-median``: one event between consecutive launches (a launch's cost runs from the previous launch's
      event to its own), median of ``repeats`` runs;

    and per device (``totals``): each table's sum, ``plain_graph_s`` (the program's launches alone captured as one
    CUDA graph on a stream of that device, no input copies, no output clones, no other stream; median of ``repeats``
    replays, events around the replay) and ``no_events_s`` (the launches issued back to back without events or graph,
    events only around the whole run; median).

    Returns:
        ``(costs, extras)``: the primary :class:`~torch_tessera.target.costs.CostTable` and ``{"variants": {name:
        CostTable}, "totals": [per device dict]}`` (both empty on CPU).
    """
    from torch_tessera.backend.pipeline import estimate
    from torch_tessera.compat.torch_cuda import spin
    from torch_tessera.runtime.schedule import LaunchStep
    from torch_tessera.target.costs import CostTable

    specs = [d.spec for d in runner.devices]
    if runner.devices[0].torch_device.type != "cuda":
        return estimate(runner.program, specs)[0], {"variants": {}, "totals": []}
    n = len(runner.program.launches)
    runs = max(repeats, PAIR_MIN_OF)
    pair = np.full((runs, n, len(specs)), np.inf)
    between = np.full((runs, n, len(specs)), np.inf)
    totals: list[dict] = []
    spun = True
    for g, dev in enumerate(runner.devices):
        runner.set_placement({i: g for i in range(n)})
        ex = runner.executor
        stream = ex.streams[g]
        with torch.no_grad():
            ex.run(list(batch))  # places the weights, compiles for this device
            for r in range(runs):
                for method, out in (("pair", pair), ("between", between)):
                    ctx = ex.call_context(ex.bind_call(list(batch)), ex.streams)
                    with dev.guard(), torch.cuda.stream(stream):
                        spun = spin(LEAD_PER_LAUNCH_S * n) and spun
                    marks = []
                    last = _event(stream)
                    for item in ex.items:
                        if isinstance(item.step, LaunchStep):
                            if method == "pair":
                                last = _event(stream)
                            item.run(ctx)
                            end = _event(stream)
                            marks.append((item.step.launch, last, end))
                            last = end
                        else:
                            item.run(ctx)
                    dev.synchronize()
                    for launch, a, b in marks:
                        out[r, launch, g] = a.elapsed_time(b) / 1e3
            totals.append({"device": dev.spec.name, "launches": n,
                           "plain_graph_s": _plain_program_graph(ex, g, batch, runs),
                           "no_events_s": _guarded(lambda: _no_events(ex, g, batch, runs), f"no-events run on {g}")})
    how = "behind a spin kernel" if spun else "without a spin kernel (host gaps included)"
    names = tuple(s.name for s in specs)
    kernels = tuple(range(n))

    def table(secs, what):
        return CostTable(names, kernels, secs, source=f"cuda events {how}, {what}, gpu_cut_diagnose")

    costs = table(pair[:PAIR_MIN_OF].min(axis=0), f"event pair per launch, min of {PAIR_MIN_OF}")
    variants = {"pair-median": table(np.median(pair, axis=0), f"event pair per launch, median of {runs}"),
                "between-median": table(np.median(between, axis=0), f"one event between launches, median of {runs}")}
    for g, t in enumerate(totals):
        t["sum_pair_min3_s"] = float(costs.seconds[:, g].sum())
        for name, v in variants.items():
            t[f"sum_{name.replace('-', '_')}_s"] = float(v.seconds[:, g].sum())
    return costs, {"variants": variants, "totals": totals}


def _event(stream) -> Any:
    e = torch.cuda.Event(enable_timing=True)
    e.record(stream)
    return e


def _guarded(fn, what: str) -> Any:
    """``fn()``, or None (logged) if it raises anything but a CUDA error: a figure of the diagnosis is reported as
    missing and the rest runs; a CUDA error poisons the context, so it propagates."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - see the docstring
        if is_cuda_error(e):
            raise
        log.warning("%s failed: %s", what, e)
        return None


def _device_seconds(stream, work, lead_s: float) -> float:
    """GPU seconds of what ``work()`` queues on ``stream``: events around it, queued behind a spin kernel of
    ``lead_s`` so the host's issue time is hidden (the host waits for the end)."""
    from torch_tessera.compat.torch_cuda import spin

    with torch.cuda.stream(stream):
        spin(lead_s)
        a = _event(stream)
        work()
        b = _event(stream)
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def _plain_program_graph(ex, g: int, batch: list, repeats: int) -> float | None:
    """Median seconds of the program's launches (placed whole on device ``g``) captured as one plain CUDA graph on a
    fresh stream of ``g``: no input copies, no clones, no other stream. None (logged) if the capture fails."""
    from torch_tessera.runtime.realize import CallContext
    from torch_tessera.runtime.schedule import LaunchStep

    dev = ex.devices[g]
    streams = [d.new_stream() if d.torch_device.type == "cuda" else None for d in ex.devices]
    try:
        with torch.no_grad(), dev.guard():
            ctx = CallContext(ex.bind_call(list(batch)), streams)  # nothing freed: every buffer stays bound
            torch.cuda.synchronize()  # what bind_call queued on the executor's streams has landed
            for item in ex.items:  # warm: every buffer allocated, the inputs in place
                item.run(ctx)
            dev.synchronize()
            launches = [it for it in ex.items if isinstance(it.step, LaunchStep)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=streams[g]):
                for it in launches:
                    it.run(ctx)
            dev.synchronize()
            lead = LEAD_PER_LAUNCH_S * 4
            return statistics.median(_device_seconds(streams[g], graph.replay, lead) for _ in range(repeats))
    except Exception as e:  # noqa: BLE001 - a figure of the diagnosis, not the measurement: reported as missing
        if is_cuda_error(e) and "captur" not in str(e):
            raise
        log.warning("plain graph of the program on device %d failed: %s", g, e)
        torch.cuda.synchronize()
        return None


def _no_events(ex, g: int, batch: list, repeats: int) -> float:
    """Median seconds of the program's items issued back to back on device ``g``'s stream behind a spin kernel,
    events only around the whole run."""
    dev = ex.devices[g]
    n = len(ex.items)
    out = []
    with torch.no_grad(), dev.guard():
        for _ in range(repeats):
            ctx = ex.call_context(ex.bind_call(list(batch)), ex.streams)
            out.append(_device_seconds(ex.streams[g], lambda: [it.run(ctx) for it in ex.items], LEAD_PER_LAUNCH_S * n))
    return statistics.median(out)


def plans(runner, costs, topo, names) -> dict[str, dict]:
    """Placement of each plan, and for the planner's policies the plan (``request-dist`` runs on homo-L's placement
    with its own schedule)."""
    from torch_tessera.backend.pipeline import place
    from torch_tessera.runtime.runner import random_placement

    specs = [d.spec for d in runner.devices]
    n = sorted(runner.dag.graph.nodes)
    out: dict[str, dict] = {}
    for name in names:
        try:
            if name in ("tessera", "af"):
                placement, made = place(runner.program, runner.dag, specs, "throughput" if name == "tessera" else "af",
                                        costs=costs, topology=topo, cache_dir=False, micro_batches=2)
                out[name] = {"placement": dict(placement), "plan": made}
                continue
            elif name == "random":
                placement = random_placement(runner.dag, len(specs), 0)
            else:
                placement = {i: 1 if name == "homo-R" else 0 for i in n}
            out[name] = {"placement": dict(placement)}
        except Exception as e:  # noqa: BLE001 - a plan that does not apply is reported, the others still run
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    return out


def request_dist_schedule(dag, placement, m: int, k: int, domains):
    """Micro-batches ``0..k-1`` wholly on device 0, ``k..m-1`` wholly on device 1, in program order, no waits."""
    from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RunStep

    order = sorted(dag.graph.nodes)
    streams = ([RunStep(0, b, v) for b in range(k) for v in order], [RunStep(1, b, v) for b in range(k, m) for v in order])
    return PipelinedSchedule(2, m, tuple(tuple(s) for s in streams), placement, tuple(domains), (),
                             source=f"request-dist {k}:{m - k}")


def variants(sched, devices: int) -> dict[str, Any]:
    """The schedule with every wait (and record) dropped, and each device's share alone."""
    from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, WaitStep

    def make(streams, source):
        return PipelinedSchedule(sched.devices, sched.micro_batches, tuple(tuple(s) for s in streams),
                                 sched.placement, sched.domains, sched.cut_edges, source=source)

    no_wait = [[s for s in st if not isinstance(s, (WaitStep, RecordStep))] for st in sched.streams]
    out = {"no-wait": make(no_wait, "no-wait")}
    for d in range(devices):
        if no_wait[d]:
            out[f"alone-{d}"] = make([st if e == d else [] for e, st in enumerate(no_wait)], f"alone-{d}")
    return out


#: the modes ``--modes`` picks from (``captured`` also names ``executed``; ``alone`` is every ``alone-D``)
MODES = ("executed", "no-wait", "alone", "eager")


def is_cuda_error(e: BaseException) -> bool:
    """Whether ``e`` is a CUDA error that poisons the process's context (every later CUDA call fails)."""
    accel = getattr(torch, "AcceleratorError", None)
    return (accel is not None and isinstance(e, accel)) or "CUDA error" in str(e)


def time_modes(ex, sched, batches, args, checked: bool, captured: bool, where: str) -> tuple[dict, list]:
    """Median seconds of one replay per mode of ``args.modes``, modes interleaved in rounds; the host issue time of
    ``eager``. Every step is announced first (``where``: ``model/plan``) and synchronized after, so the last line
    before a CUDA error names the mode and stage it came from. Returns ``(medians, outputs)``: the executed replay's
    (the eager one's when ``executed`` is not run)."""
    replays: dict[str, Any] = {}
    if "executed" in args.modes:
        replays["executed"] = ex.replay(sched, check=checked, captured=captured)
    for k, v in variants(sched, len(ex.devices)).items():
        if ("alone" if k.startswith("alone-") else k) in args.modes:
            replays[k] = ex.replay(v, check=False, captured=captured)
    if "eager" in args.modes:
        replays["eager"] = ex.replay(sched, check=checked, captured=False)
    names = list(replays)
    on_cuda = ex.devices[0].torch_device.type == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    for r, rep in replays.items():
        if hasattr(rep, "on_step"):
            rep.on_step = lambda stage, r=r: (sync(), say(f"{where}: {r}: {stage} done"))
    times: dict[str, list[float]] = {k: [] for k in names}
    sync_times: dict[str, list[float]] = {k: [] for k in names}
    issue: list[float] = []
    host_issue: dict[str, list[float]] = {k: [] for k in names}
    base = names[0]
    with torch.no_grad():
        say(f"{where}: {base}: first call ({'bind, warm-up, capture' if hasattr(replays[base], 'on_step') else 'eager'})")
        got = replays[base].run(batches)
        sync()
        say(f"{where}: {base}: second call")
        t0 = time.perf_counter()
        got = replays[base].run(batches)
        sync()
        calls = timed_calls(args, time.perf_counter() - t0)
        pools = replays[base].last_pools  # every mode runs in these: each buffer exists and holds real values
        for r in names[1:]:
            say(f"{where}: {r}: first call in {base}'s pools")
            replays[r].run(batches, pools)  # warm-up / capture
            sync()
        for rep in replays.values():  # the timed calls: no synchronizing hook inside the timings
            if hasattr(rep, "on_step"):
                rep.on_step = None
        device = device_timers(replays, base, batches, pools) if on_cuda else {}
        for k in device:
            say(f"{where}: {k}: device-side timer ready")
        dtimes: dict[str, list[float]] = {k: [] for k in device}
        for rnd in range(args.rounds):
            for r in (names if rnd % 2 == 0 else names[::-1]):
                say(f"{where}: {r}: round {rnd}, {calls} timed calls back to back, {calls} synchronized")
                lent = None if r == base else pools
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):  # the steady state of a loop of calls: one sample per round
                    replays[r].run(batches, lent)
                    if r == "eager":
                        issue.append(replays[r].last_issue_seconds)
                    elif hasattr(replays[r], "last_issue_seconds"):
                        host_issue[r].append(replays[r].last_issue_seconds)
                sync()
                times[r].append((time.perf_counter() - t0) / calls)
                for _ in range(calls):  # one call at a time: the host's work before each replay is not hidden
                    sync()
                    t0 = time.perf_counter()
                    replays[r].run(batches, lent)
                    sync()
                    sync_times[r].append(time.perf_counter() - t0)
                mine = (r, f"{r}@graph", f"plain-{r[6:]}" if r.startswith("alone-") else None)
                for k in [k for k in device if k in mine]:
                    for _ in range(args.calls):
                        got_s = _guarded(device[k], f"{where}: device timing {k}")
                        if got_s is not None:
                            dtimes[k].append(got_s)
                sync()
    med = {k: statistics.median(v) for k, v in times.items()}
    med.update({f"sync:{k}": statistics.median(v) for k, v in sync_times.items() if v})
    med.update({f"device:{k}": statistics.median(v) for k, v in dtimes.items() if v})
    if issue:
        med["eager-host-issue"] = statistics.median(issue)
    med.update({f"host-issue:{k}": statistics.median(v) for k, v in host_issue.items() if v})
    med["captures"] = sum(getattr(r, "captures", 0) for r in replays.values())
    med["timed_calls"] = calls * args.rounds
    return med, got


def timed_calls(args, step_s: float) -> int:
    """Host-timed calls per mode per round: ``--calls``, or more where a step is short, so that each mode's calls
    over all rounds take about ``--min-timed-s`` (a short step's host part is noisy), at most ``--max-calls``."""
    want = math.ceil(args.min_timed_s / max(args.rounds, 1) / max(step_s, 1e-6))
    return max(args.calls, min(args.max_calls, want))


#: seconds of spin-kernel lead before a device-timed call: more than the host's prelude to a graph replay (input
#: checks, copies, the graph launch), so the events time the GPU's work, not the host's
CALL_LEAD_S = 3e-3


def device_timers(replays: dict, base: str, batches, pools) -> dict[str, Any]:
    """Device-side timers (each a callable returning GPU seconds, events on the replay's home stream behind a spin
    kernel) of every captured mode ``r``: ``r`` (the whole call: input copies, graph replay, output clones; the end
    event is recorded when the host has waited, so it adds the host's wake-up, some microseconds),
    ``r@graph`` (the captured graph's replay alone), and for each ``alone-D`` a ``plain-D`` (device D's launches of
    that share, in its order, captured as one plain CUDA graph on D's stream: no input copies, no clones, no other
    stream, no runtime joins). Modes that did not capture (eager, CPU, a capture fallback) get none."""
    out: dict[str, Any] = {}
    for r, rep in replays.items():
        if getattr(rep, "graph", None) is None or rep.streams is None:
            continue
        main = rep.streams[rep.executor.home]
        lent = None if r == base else pools
        out[r] = lambda rep=rep, main=main, lent=lent: _device_seconds(main, lambda: rep.run(batches, lent),
                                                                        CALL_LEAD_S)
        out[f"{r}@graph"] = lambda rep=rep, main=main: _device_seconds(main, rep.graph.replay, CALL_LEAD_S)
        if r.startswith("alone-"):
            d = int(r[6:])
            try:
                graph = plain_share_graph(rep, d)
            except Exception as e:  # noqa: BLE001 - a figure of the diagnosis: reported as missing, the rest runs
                log.warning("plain graph of %s failed: %s", r, e)
                torch.cuda.synchronize()
                continue
            out[f"plain-{d}"] = lambda g=graph, s=rep.streams[d]: _device_seconds(s, g.replay, CALL_LEAD_S)
    return out


def plain_share_graph(rep, d: int) -> Any:
    """Device ``d``'s launches of the captured replay ``rep`` (every micro-batch, in its schedule order) captured as
    one plain CUDA graph on ``rep``'s stream of ``d``, in copies of ``rep``'s pools (their buffers exist and hold a
    real run's values): what the simulator's costs describe, without the runtime's copies, clones and joins."""
    from torch_tessera.runtime.executor import borrow_pools
    from torch_tessera.runtime.realize import CallContext
    from torch_tessera.runtime.replay import ReplayContext
    from torch_tessera.scheduler.pipeline_schedule import RunStep

    items = [it for it in rep.items if isinstance(it.step, RunStep) and it.step.device == d]
    flights = [CallContext(borrow_pools(s.pools), rep.streams, batch=k) for k, s in enumerate(rep.slots)]
    ctx = ReplayContext(flights, rep.streams)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.no_grad(), rep.executor.devices[d].guard(), torch.cuda.graph(graph, stream=rep.streams[d]):
        for it in items:
            it.run(ctx)
    torch.cuda.synchronize()
    return graph


def sim_inputs(runner, costs, topo, extras: dict | None = None) -> dict:
    """What the simulator reads besides a schedule, as JSON (:mod:`torch_tessera.scheduler.simrecord`): the measured
    per-launch costs (per device, this program), the links, the planner's DRAM figures (a shared GPU split by SM
    count, partitions co-running at the planner's rate) and the wait cost; with ``extras``
    (:func:`launch_costs`'), the other cost tables (``cost_variants``) and each device's totals (``device_totals``:
    the plain graph of its program, the sums)."""
    from torch_tessera.scheduler.modulo import WAIT_SECONDS
    from torch_tessera.scheduler.pipeline_plan import PipelineModel
    from torch_tessera.scheduler.simrecord import costs_to_json, links_to_json, memory_to_json

    mem = PipelineModel.from_specs([d.spec for d in runner.devices]).memory_share(runner.dag)
    out = {"costs": costs_to_json(costs), "links": links_to_json(topo), "memory": memory_to_json(mem),
           "wait_seconds": WAIT_SECONDS}
    if extras and extras.get("variants"):
        out["cost_variants"] = {k: costs_to_json(v) for k, v in extras["variants"].items()}
        out["device_totals"] = extras["totals"]
    return out


#: the simulations of each plan: key -> issue model (``whole``: one CUDA graph, each cost whole, as the planner
#: simulates it; ``graph``: one CUDA graph, event-timed costs less the graph overlap; ``eager``: host-issued replay)
SIMULATIONS = {"simulated_s": "whole", "simulated_overlap_s": "graph", "eager_simulated_s": "eager"}


def simulations(schedule: dict, inputs: dict, overlap_s: float | None = None) -> dict[str, float]:
    """Seconds of one replay of the recorded ``schedule`` under each issue model of :data:`SIMULATIONS`;
    ``overlap_s`` replaces :class:`~torch_tessera.scheduler.issue.GraphIssue`'s default overlap. Where ``inputs``
    holds them (runs since session 14), also the captured replay with each cost table of ``cost_variants`` taken
    whole (``simulated_<variant>_s``) and with the primary costs calibrated to each device's plain program graph
    (``simulated_plain_s``: :func:`calibrated_inputs`, what the planner does with costs measured at compile time)."""
    from torch_tessera.scheduler.issue import GraphIssue, HostIssue
    from torch_tessera.scheduler.simrecord import resimulate

    graph = GraphIssue() if overlap_s is None else GraphIssue(overlap=overlap_s, source="--overlap-us")
    issue = {"graph": {"graph": graph}, "whole": {}, "eager": {"host": HostIssue()}}
    out = {key: resimulate(schedule, inputs, **issue[how]) for key, how in SIMULATIONS.items()}
    for name, table in (inputs.get("cost_variants") or {}).items():
        out[f"simulated_{name.replace('-', '_')}_s"] = resimulate(schedule, {**inputs, "costs": table})
    plain = calibrated_inputs(inputs)
    if plain is not None:
        out["simulated_plain_s"] = resimulate(schedule, plain)
    return out


def calibrated_inputs(inputs: dict) -> dict | None:
    """``inputs`` with each device's primary per-launch costs calibrated to its program's plain-graph time
    (``device_totals[d]["plain_graph_s"]``, :func:`torch_tessera.target.profiler.calibrate_to_total`: the excess over
    the graph taken off every launch alike); None where a device has no such time."""
    from torch_tessera.target.profiler import ProfileColumn, calibrate_to_total

    totals = inputs.get("device_totals") or []
    costs = inputs["costs"]
    if len(totals) != len(costs["devices"]) or any(t.get("plain_graph_s") is None for t in totals):
        return None
    sec = np.asarray(costs["seconds"], dtype=np.float64)
    for d, t in enumerate(totals):
        col = ProfileColumn(costs["devices"][d], tuple(costs["kernels"]), sec[:, d], costs["source"])
        sec[:, d] = calibrate_to_total(col, float(t["plain_graph_s"])).seconds
    return {**inputs, "costs": {**costs, "seconds": sec.tolist(),
                                "source": costs["source"] + ", calibrated to the plain program graph"}}


def split(med: dict, devices: int, cuts: int, m: int) -> dict[str, float | None]:
    """The lost time, per step and per cut edge: ``executed - max(alone)`` and the no-wait share of it (None where
    ``--modes`` left a mode out)."""
    alones = [med[f"alone-{d}"] for d in range(devices) if f"alone-{d}" in med]
    alone = max(alones) if alones else None
    ex, nw = med.get("executed"), med.get("no-wait")
    lost = ex - alone if ex is not None and alone is not None else None
    waits = ex - nw if ex is not None and nw is not None else None
    per = cuts * m
    return {"alone_max_s": alone, "lost_s": lost, "waits_s": waits,
            "per_cut_edge_us": lost / per * 1e6 if per and lost is not None else None,
            "waits_per_cut_edge_us": waits / per * 1e6 if per and waits is not None else None}


class Poisoned(RuntimeError):
    """A CUDA error left this process's context unusable: nothing more can run in it."""


def diagnose_model(name: str, args, res: dict, deadline: float) -> None:
    """Every plan of ``name`` into ``res["models"][name]`` (written out after each plan).

    Raises:
        Poisoned: a plan hit a CUDA error (the later plans and models cannot run in this process).
    """
    from torch_tessera.target.links import build_topology

    t0 = time.perf_counter()
    say(f"{name}: build (compile, home placement against eager)")
    spec, runner, inputs, template, home_error = build(name, args)
    device = "cuda" if args.devices.startswith("cuda") else "cpu"
    batches = micro_batches(spec, args, template, inputs, args.micro_batches, device)
    say(f"{name}: per-launch costs")
    costs, extras = launch_costs(runner, batches[0], args.cost_repeats)
    topo = build_topology([d.spec for d in runner.devices])
    on_gpu = all(d.torch_device.type == "cuda" for d in runner.devices)
    out = res["models"][name] = {"launches": len(runner.program.launches), "home_rel_error": home_error,
                                 "cost_source": costs.source, "replay": "captured" if on_gpu else "eager (CPU)",
                                 "build_s": time.perf_counter() - t0, "device_totals": extras["totals"],
                                 "sim_inputs": sim_inputs(runner, costs, topo, extras),
                                 "plans": {}}
    say(f"{name}: home placement, reference outputs")
    runner.set_placement({i: 0 for i in sorted(runner.dag.graph.nodes)})
    with torch.no_grad():
        want = [[o.clone() if isinstance(o, torch.Tensor) else o for o in runner.executor.run(list(b))] for b in batches]
    out["output_bytes"] = sum(o.numel() * o.element_size() for o in want[0] if isinstance(o, torch.Tensor))
    out["input_bytes"] = sum(a.numel() * a.element_size() for a in inputs if isinstance(a, torch.Tensor))
    say(f"{name}: plans {args.plans}")
    chosen = plans(runner, costs, topo, args.plans)
    for plan_name, p in chosen.items():
        if time.perf_counter() > deadline:
            out["plans"][plan_name] = {"error": "skipped: --budget-s spent"}
            continue
        if "error" in p:
            out["plans"][plan_name] = p
            continue
        try:
            out["plans"][plan_name] = run_plan(plan_name, p["placement"], p.get("plan"), runner, batches, want, costs,
                                               topo, args, on_gpu, f"{name}/{plan_name}", out["sim_inputs"])
        except Exception as e:  # noqa: BLE001 - one plan failing is reported, the others still run
            log.exception("plan %s of %s failed", plan_name, name)
            out["plans"][plan_name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            if on_gpu and is_cuda_error(e):
                write(res, args.out)
                raise Poisoned(f"{name}/{plan_name}: {out['plans'][plan_name]['error']}") from e
        write(res, args.out)
        gc.collect()  # the executor and its replays refer to each other: free the captured graphs' memory now
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    measured_call(out, args.micro_batches)
    write(res, args.out)
    out["seconds"] = time.perf_counter() - t0


def measured_call(m: dict, micro_batches: int) -> None:
    """The host seconds of a captured call outside its graph, measured in this run, and each plan simulated with it.

    Per plan with device timings, ``call_host_s`` = host wall time of the executed call - the captured graph's device
    time - the call's copies in and out (:class:`~torch_tessera.scheduler.issue.CallCost`'s copy term at the home
    device's DRAM bandwidth); the model's ``call_host_s`` is their median over its plans (one constant for every
    plan), and each plan gets ``simulated_call_s`` (graph overlap + that CallCost) and ``executed_over_call``.
    Nothing where no plan has device timings (CPU runs)."""
    from torch_tessera.scheduler.issue import CallCost

    inputs = m.get("sim_inputs") or {}
    mem = inputs.get("memory")
    nbytes = micro_batches * (m.get("output_bytes", 0) + m.get("input_bytes", 0))
    copies = CallCost(copy_bytes=nbytes, bandwidth=mem["device_bandwidth"][0]).seconds if mem else 0.0
    got = []
    for r in m["plans"].values():
        sec = r.get("seconds", {})
        if "error" in r or sec.get("executed") is None or sec.get("device:executed@graph") is None:
            continue
        r["call_host_s"] = sec["executed"] - sec["device:executed@graph"] - copies
        got.append(r["call_host_s"])
    if not got:
        return
    m["call_host_s"] = call_s = max(0.0, statistics.median(got))
    m["call_source"] = f"median over {len(got)} plans of this run: host - graph - copies"
    for r in m["plans"].values():
        if "error" in r or "schedule" not in r:
            continue
        try:
            r["simulated_call_s"] = call_simulation(r["schedule"], inputs, m, micro_batches, call_s)
        except Exception as e:  # noqa: BLE001 - the prediction is context, not the measurement
            r["simulated_call_s_error"] = str(e)[:200]
            continue
        executed = r.get("seconds", {}).get("executed")
        if executed is not None:
            r["executed_over_call"] = executed / r["simulated_call_s"]


def run_plan(plan_name, placement, made, runner, batches, want, costs, topo, args, on_gpu, where, inputs) -> dict:
    """Replay ``placement``'s schedule over ``--micro-batches``: the plan's own (``made.schedule_of()``, the one its
    simulator scored) when it is over that many micro-batches and the executor's memory domains, else one built from
    the placement (row ``schedule_source`` says which)."""
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.simrecord import schedule_to_json

    runner.set_placement(placement)
    ex = runner.executor
    M = args.micro_batches
    if plan_name == "request-dist":
        if len(set(ex.domains)) != 1:
            return {"error": "request-dist here needs one memory domain (the replicas share the weights)"}
        sched, checked = request_dist_schedule(runner.dag, placement, M, max(1, M // 2), ex.domains), False
        source = "request-dist (micro-batches split between the devices)"
    else:
        own = made.schedule_of() if made is not None and made.schedules else None
        if own is not None and own.micro_batches == M and tuple(own.domains) == tuple(ex.domains):
            sched, checked, source = own, True, "plan"
        else:
            sched, checked = build_pipelined_schedule(runner.dag, placement, M, costs=costs, topology=topo,
                                                      domains=ex.domains, devices=len(ex.devices)), True
            source = f"built from the placement ({M} micro-batches; the plan's: " + (
                f"{own.micro_batches}, domains {own.domains})" if own is not None else "none)")
    say(f"{where}: schedule of {M} micro-batches: {len(sched.cut_edges)} cut edges, {sched.num_waits} waits")
    med, got = time_modes(ex, sched, batches, args, checked, on_gpu, where)
    err = max(rel_error(g, w) for g, w in zip(got, want))
    ok = err <= (TOLERANCE if args.size == "full" else 1e-4)
    cuts = len(sched.cut_edges)
    row = {"schedule_source": source, "cut_edges": cuts, "waits": sched.num_waits,
           "transfer_bytes": sched.transfer_bytes,
           "launches_per_device": [sum(1 for st in sched.streams[d] if type(st).__name__ == "RunStep") // M
                                   for d in range(len(ex.devices))],
           "correct": ok, "rel_error": err, "seconds": med, "split": split(med, len(ex.devices), cuts, M),
           "schedule": schedule_to_json(sched)}
    try:
        row.update(simulations(row["schedule"], inputs))
    except Exception as e:  # noqa: BLE001 - the prediction is context, not the measurement
        row["simulated_s_error"] = str(e)[:200]
    if "simulated_s" in row and "executed" in med:
        row["executed_over_simulated"] = med["executed"] / row["simulated_s"]
    if "eager" in med and "eager_simulated_s" in row:
        row["eager_over_simulated"] = med["eager"] / row["eager_simulated_s"]
    per = row["split"]["per_cut_edge_us"]
    say(f"{where}: {cuts} cut edges, step {_ms(med.get('executed'))} ms (simulated {_ms(row.get('simulated_s'))}), "
        f"lost {_ms(row['split']['lost_s'])} ms{f', {per:.1f} us per cut edge' if per is not None else ''}; eager "
        f"{_ms(med.get('eager'))} ms (simulated {_ms(row.get('eager_simulated_s'))}); results {'ok' if ok else 'WRONG'}")
    return row


def _more_calls(res: dict) -> str:
    if "min_timed_s" not in res:  # files before session 15
        return ""
    return (f" at least (more where a step is short: about {res['min_timed_s']:g} s of calls per mode, at most "
            f"{res['max_calls']} per round)")


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def markdown(res: dict) -> str:
    lines = [f"# Cut cost with the captured schedule: {res['layers']} layers on {res['devices']}", "",
             f"{res['micro_batches']} micro-batches per step; torch {res['torch']}; {res['rounds']} rounds x "
             f"{res['calls']} calls per mode{_more_calls(res)}. Modes and definitions: bench/gpu_cut_diagnose.py.", ""]
    if "resimulated" in res:
        lines += [f"Simulations recomputed offline: {res['resimulated']}.", ""]
    if "stopped" in res:
        lines += [f"**Stopped: {res['stopped']}.**", ""]
    for name, m in res["models"].items():
        if "error" in m:
            lines += [f"## {name}", "", f"failed: {m['error']}", ""]
            continue
        if "stopped" in m:
            lines += [f"**{name} stopped {m['stopped']}** (traceback: cut_diagnose.log)", ""]
        lines += [f"## {name} ({m['launches']} launches; replay {m['replay']}; home placement against eager: "
                  f"relative error {m['home_rel_error']:.2e}; costs: {m['cost_source']})", "",
                  "| plan | cut edges | waits | executed ms | simulated ms | executed / simulated | simulated with "
                  "graph overlap ms | alone max ms | lost us per cut edge | waits us per cut edge | eager ms | eager simulated "
                  "ms | eager host issue ms | correct |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for plan_name, r in m["plans"].items():
            if "error" in r:
                lines.append(f"| {plan_name} | {r['error']} |" + " |" * 12)
                continue
            s, x = r["seconds"], r["split"]
            ratio = f"{r['executed_over_simulated']:.3f}" if "executed_over_simulated" in r else "-"
            per = "-" if x["per_cut_edge_us"] is None else f"{x['per_cut_edge_us']:.1f}"
            wper = "-" if x["waits_per_cut_edge_us"] is None else f"{x['waits_per_cut_edge_us']:.1f}"
            lines.append(f"| {plan_name} | {r['cut_edges']} | {r['waits']} | {_ms(s.get('executed'))} | "
                         f"{_ms(r.get('simulated_s'))} | {ratio} | {_ms(r.get('simulated_overlap_s'))} | "
                         f"{_ms(x['alone_max_s'])} | {per} | {wper} | "
                         f"{_ms(s.get('eager'))} | {_ms(r.get('eager_simulated_s'))} | {_ms(s.get('eager-host-issue'))} "
                         f"| {r['correct']} |")
        lines.append("")
        lines += call_markdown(m)
        lines += device_markdown(m)
    return "\n".join(lines) + "\n"


def call_markdown(m: dict) -> list[str]:
    """Executed against the captured-call model (``--resimulate --call-us``), where computed."""
    got = [(k, r) for k, r in m["plans"].items() if "simulated_call_s" in r]
    if not got:
        return []
    lines = []
    if "call_host_s" in m:
        lines += [f"The call's host work outside its graph: {m['call_host_s'] * 1e6:.0f} us ({m['call_source']}).", ""]
    lines += ["| plan | executed ms (back to back) | each call synchronized ms | timed calls | call host us (this plan) | "
              "simulated ms | executed / simulated | "
              "simulated with overlap ms | executed / that | simulated (overlap + call) ms | executed / that |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k, r in got:
        sec = r.get("seconds", {})
        ex = sec.get("executed")
        own = "-" if r.get("call_host_s") is None else f"{r['call_host_s'] * 1e6:.0f}"
        lines.append(f"| {k} | {_ms(ex)} | {_ms(sec.get('sync:executed'))} | {sec.get('timed_calls', '-')} | {own} | "
                     f"{_ms(r.get('simulated_s'))} | "
                     f"{_ratio(ex, r.get('simulated_s'))} | {_ms(r.get('simulated_overlap_s'))} | "
                     f"{_ratio(ex, r.get('simulated_overlap_s'))} | {_ms(r['simulated_call_s'])} | "
                     f"{_ratio(ex, r['simulated_call_s'])} |")
    return lines + [""]


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def device_markdown(m: dict) -> list[str]:
    """The device-side tables of one model (runs since session 14; nothing for older files): each device's program
    timed four ways, and per plan the host and device timings beside each simulation."""
    totals = m.get("device_totals") or []
    plans_ = {k: r for k, r in m["plans"].items() if "error" not in r}
    if not totals and not any(any(k.startswith("device:") for k in r.get("seconds", {})) for r in plans_.values()):
        return []
    lines = []
    if totals:
        lines += ["Each device's program (one micro-batch) alone: sums of the per-launch costs by method, its launches "
                  "as one plain CUDA graph, issued back to back without events; overlap = (pair-min3 sum - plain "
                  "graph) / (launches - 1).", "",
                  "| device | launches | sum pair-min3 ms | sum pair-median ms | sum between-median ms | "
                  "plain graph ms | no events ms | overlap us per launch |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for t in totals:
            pg, n = t.get("plain_graph_s"), t["launches"]
            ov = "-" if pg is None or n < 2 else f"{(t['sum_pair_min3_s'] - pg) / (n - 1) * 1e6:.2f}"
            lines.append(f"| {t['device']} | {n} | {_ms(t.get('sum_pair_min3_s'))} | {_ms(t.get('sum_pair_median_s'))} "
                         f"| {_ms(t.get('sum_between_median_s'))} | {_ms(pg)} | {_ms(t.get('no_events_s'))} | {ov} |")
        lines.append("")
    lines += ["Per plan, host wall time of a call against device time (events behind a spin kernel: `device` = the "
              "whole call, `graph` = the captured graph's replay alone; `plain` = each device's launches as one "
              "plain graph, max over devices) and the simulations (`sim` = pair-min3 costs whole; `plain-cal` = "
              "costs calibrated to the plain program graph; `median` / `between` = those cost tables whole).", "",
              "| plan | executed host ms | executed host issue ms | executed device ms | executed graph ms | "
              "alone host max ms | "
              "alone graph max ms | plain max ms | sim ms | sim plain-cal ms | sim median ms | sim between ms | "
              "host / sim | device / sim | host / plain-cal | device / plain-cal | graph / plain-cal | "
              "plain / plain-cal |",
              "| --- |" + " ---: |" * 17]
    for name, r in plans_.items():
        sec = r.get("seconds", {})
        alone = [v for k, v in sec.items() if k.startswith("alone-")]
        agraph = [v for k, v in sec.items() if k.startswith("device:alone-") and k.endswith("@graph")]
        plain = [v for k, v in sec.items() if k.startswith("device:plain-")]
        host, dev, gr = sec.get("executed"), sec.get("device:executed"), sec.get("device:executed@graph")
        sim, cal = r.get("simulated_s"), r.get("simulated_plain_s")
        pmax = max(plain) if plain else None
        lines.append(f"| {name} | {_ms(host)} | {_ms(sec.get('host-issue:executed'))} | {_ms(dev)} | {_ms(gr)} | "
                     f"{_ms(max(alone) if alone else None)} | "
                     f"{_ms(max(agraph) if agraph else None)} | {_ms(pmax)} | {_ms(sim)} | {_ms(cal)} | "
                     f"{_ms(r.get('simulated_pair_median_s'))} | {_ms(r.get('simulated_between_median_s'))} | "
                     f"{_ratio(host, sim)} | {_ratio(dev, sim)} | {_ratio(host, cal)} | {_ratio(dev, cal)} | "
                     f"{_ratio(gr, cal)} | {_ratio(pmax, cal)} |")
    return lines + [""]


def write(res: dict, out: Path) -> None:
    (out / "cut_diagnose.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cut_diagnose.md").write_text(markdown(res))


def setup_log(out: Path) -> Path:
    """Everything logged (every traceback, each progress line) into ``out/cut_diagnose.log``, flushed per record;
    faulthandler writes a crash's Python stack there too."""
    import faulthandler

    path = out / "cut_diagnose.log"
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(handler)
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.WARNING)  # progress goes to stdout through say(); warnings and tracebacks here
    stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(stderr)
    root.setLevel(logging.INFO)
    faulthandler.enable(file=handler.stream, all_threads=True)
    return path


def call_simulation(schedule: dict, inputs: dict, model: dict, micro_batches: int, call_s: float,
                    overlap_s: float | None = None) -> float:
    """Seconds of one captured call: the schedule with the graph overlap plus
    :class:`~torch_tessera.scheduler.issue.CallCost` (``call_s`` host seconds per call; the model's saved output and
    input bytes per micro-batch, none in files before session 14, copied at the home device's DRAM bandwidth)."""
    from torch_tessera.scheduler.issue import CallCost, GraphIssue
    from torch_tessera.scheduler.simrecord import resimulate

    nbytes = micro_batches * (model.get("output_bytes", 0) + model.get("input_bytes", 0))
    mem = inputs.get("memory")
    bw = mem["device_bandwidth"][0] if mem else 1.0
    call = CallCost(host=call_s, copy_bytes=nbytes if mem else 0.0, bandwidth=bw, source="--call-us")
    kw = {} if overlap_s is None else {"overlap": overlap_s, "source": "--overlap-us"}
    return resimulate(schedule, inputs, graph=GraphIssue(call=call, **kw))


def resimulate_file(path: Path, out: Path | None, overlap_us: float | None, call_us: float | None = None) -> dict:
    """Every plan's simulations of a saved ``cut_diagnose.json`` recomputed from its saved costs and schedules
    (:func:`simulations`), with the executed / simulated ratios; written to ``out`` (default: ``path``'s folder) as
    ``cut_diagnose_resimulated.json`` / ``.md``.

    Raises:
        SystemExit: the file does not exist or was written before costs and schedules were saved (the message says
            which model and plan).
    """
    if not path.is_file():
        raise SystemExit(f"--resimulate {path}: no such file (give a cut_diagnose.json written by this bench)")
    res = json.loads(path.read_text())
    how = "the default graph overlap" if overlap_us is None else f"a graph overlap of {overlap_us:g} us"
    res["resimulated"] = f"from {path.name} with {how} (bench/gpu_cut_diagnose.py --resimulate)"
    for name, m in res.get("models", {}).items():
        if call_us is not None:
            m["call_host_s"], m["call_source"] = call_us * 1e-6, "--call-us"
        for plan_name, r in m.get("plans", {}).items():
            if "error" in r:
                continue
            if "sim_inputs" not in m or "schedule" not in r:
                raise SystemExit(f"--resimulate {path}: {name}/{plan_name} has no saved costs and schedule (written "
                                 "before they were saved); rerun the bench on the GPU to get a file that can be "
                                 "re-simulated")
            r.update(simulations(r["schedule"], m["sim_inputs"], None if overlap_us is None else overlap_us * 1e-6))
            executed = r.get("seconds", {}).get("executed")
            if executed is not None:
                r["executed_over_simulated"] = executed / r["simulated_s"]
            if "eager" in r.get("seconds", {}):
                r["eager_over_simulated"] = r["seconds"]["eager"] / r["eager_simulated_s"]
            if call_us is not None:
                overlap_s = None if overlap_us is None else overlap_us * 1e-6
                r["simulated_call_s"] = call_simulation(r["schedule"], m["sim_inputs"], m, res["micro_batches"],
                                                        call_us * 1e-6, overlap_s)
                if executed is not None:
                    r["executed_over_call"] = executed / r["simulated_call_s"]
    if call_us is not None:
        res["resimulated"] += f"; simulated_call_s: the graph overlap plus {call_us:g} us of host per call and the " \
                              "copies in and out"
    out = out or path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "cut_diagnose_resimulated.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cut_diagnose_resimulated.md").write_text(markdown(res))
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for cut_diagnose.json / .md / .log (with --resimulate: for "
                    "cut_diagnose_resimulated.json / .md, default beside the file)")
    ap.add_argument("--resimulate", type=Path, metavar="JSON",
                    help="no GPU: recompute every plan's simulations of a saved cut_diagnose.json from its saved costs "
                         "and schedules")
    ap.add_argument("--overlap-us", type=float, default=None,
                    help="with --resimulate: microseconds of graph overlap per launch instead of GraphIssue's default")
    ap.add_argument("--call-us", type=float, default=None,
                    help="with --resimulate: also simulate each plan's captured call (simulated_call_s): the graph "
                         "overlap plus this many microseconds of host work per call and the call's copies in and out "
                         "(scheduler.issue.CallCost)")
    ap.add_argument("--model", default="llama,mamba,dit", help="comma-separated registry models")
    ap.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, of {PLANS}")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, of {MODES} ('captured' = executed; 'alone' = every alone-D); no-wait "
                         "and alone run in the executed replay's buffers, so they bring executed with them")
    ap.add_argument("--size", default="full", choices=("tiny", "full"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--devices", default="cuda:0@104sm,cuda:0@24sm")
    ap.add_argument("--shape", default="mamba=8x16",
                    help="per-model input shape BATCHxSEQ, e.g. 'mamba=8x16' (Mamba's registry default, 1x1024, "
                         "unrolls its torch scan over 1024 steps: the build alone takes minutes); others: registry")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5, help="replays timed per mode per round (at least)")
    ap.add_argument("--min-timed-s", type=float, default=0.3,
                    help="more host-timed calls per mode where a step is short: each mode's calls over all rounds "
                         "take about this many seconds (median over all of them)")
    ap.add_argument("--max-calls", type=int, default=200, help="at most this many timed calls per mode per round")
    ap.add_argument("--cost-repeats", type=int, default=5,
                    help="runs per per-launch timing method (event pair, one event between) and plain-graph replays "
                         "per device; the primary costs stay the minimum of the first 3 event-pair runs")
    ap.add_argument("--no-eager", dest="eager", action="store_false", help="skip the eager (host-issued) replay")
    ap.add_argument("--budget-s", type=float, default=330.0, help="skip the plans left after this many seconds")
    ap.add_argument("--launch-blocking", action="store_true",
                    help="CUDA_LAUNCH_BLOCKING=1 (set before CUDA starts): an eager kernel's error is raised at its "
                         "launch; slow, for bisecting only")
    args = ap.parse_args(argv)
    if args.resimulate is None and args.out is None:
        ap.error("--out DIR is required (or --resimulate JSON for an offline re-simulation)")
    if args.overlap_us is not None and (args.resimulate is None or args.overlap_us < 0):
        ap.error("--overlap-us takes microseconds >= 0 and goes with --resimulate")
    if args.call_us is not None and (args.resimulate is None or not args.call_us >= 0):
        ap.error("--call-us takes microseconds >= 0 and goes with --resimulate")
    if args.launch_blocking:
        import os

        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    args.plans = [p for p in args.plans.split(",") if p]
    bad = sorted(set(args.plans) - set(PLANS))
    if bad:
        ap.error(f"unknown plans {bad}: use {PLANS}")
    modes = ["executed" if m == "captured" else m for m in args.modes.split(",") if m]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        ap.error(f"unknown modes {bad}: use {MODES} (or captured)")
    if not args.eager:
        modes = [m for m in modes if m != "eager"]
    if not modes:
        ap.error("--modes (with --no-eager) leaves no mode to run")
    if {"no-wait", "alone"} & set(modes) and "executed" not in modes:
        modes.insert(0, "executed")
    args.modes = [m for m in MODES if m in modes]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.resimulate is not None:
        print(markdown(resimulate_file(args.resimulate, args.out, args.overlap_us, args.call_us)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = setup_log(args.out)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    res = {"layers": args.layers, "devices": args.devices, "micro_batches": args.micro_batches, "rounds": args.rounds,
           "calls": args.calls, "min_timed_s": args.min_timed_s, "max_calls": args.max_calls, "torch": torch.__version__, "plans": args.plans, "modes": args.modes, "models": {}}
    say(f"gpu_cut_diagnose: models {args.model}, plans {args.plans}, modes {args.modes}; log {log_path}")
    names = [m for m in args.model.split(",") if m]
    for i, name in enumerate(names):
        if time.perf_counter() > deadline:
            res["models"][name] = {"error": "skipped: --budget-s spent"}
            continue
        say(f"== {name}")
        try:
            diagnose_model(name, args, res, deadline)
        except Poisoned as e:
            res["models"][name]["stopped"] = f"after a CUDA error in {e}"
            _stop(res, names[i + 1:], str(e), args)
            return 1
        except Exception as e:  # noqa: BLE001 - one model failing (e.g. diffusers missing) leaves the others
            log.exception("model %s failed", name)
            res["models"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            if args.devices.startswith("cuda") and is_cuda_error(e):
                _stop(res, names[i + 1:], f"{name} (outside a plan): {res['models'][name]['error']}", args)
                return 1
        write(res, args.out)
    res["seconds_total"] = time.perf_counter() - t0
    write(res, args.out)
    print(markdown(res))
    return 0


def _stop(res: dict, left: list[str], what: str, args) -> None:
    """After a CUDA error: the context is poisoned, so the models left are not run; say so everywhere."""
    for name in left:
        res["models"][name] = {"error": "not run: an earlier CUDA error poisoned this process's context"}
    res["stopped"] = f"CUDA error in {what}; the models after it were not run (the CUDA context is unusable)"
    write(res, args.out)
    say(f"STOPPED: {res['stopped']}. The traceback is in {args.out / 'cut_diagnose.log'}; rerun the models left "
        f"({','.join(left) or 'none'}) in a fresh process")
    print(markdown(res))


if __name__ == "__main__":
    raise SystemExit(main())
