"""Plan every baseline and tessera from the measured costs, and run, check and time each plan on the devices."""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.measure.programs import Compiled
from torch_tessera.measure.settings import MeasureSettings

if TYPE_CHECKING:
    from torch_tessera.benchmark import SpaceChoice

log = logging.getLogger(__name__)


def _devices_sync(runner: Any) -> None:
    for d in runner.devices:
        if d.torch_device.type == "cuda":
            torch.cuda.synchronize(d.torch_device)


def _median_seconds(fn: Callable[[], Any], before: Callable[[], None], sync: Callable[[], None], warmup: int,
                    repeats: int) -> float:
    """Median wall seconds of ``fn`` over ``repeats`` calls after ``warmup``; ``before`` runs untimed each time."""
    for _ in range(warmup):
        before()
        fn()
    sync()
    times = []
    for _ in range(repeats):
        before()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


#: bf16/fp16 models: equal when the cosine with the eager output is at least this...
COSINE_MIN = 0.999
#: ...or, failing that, when the RMSE to the fp32 reference is at most this many times eager's own RMSE to it (plus
#: ``RMSE_SLACK``): Inductor's accuracy check (``torch._dynamo.utils.same`` with ``fp64_ref``: 2x, 3x for bf16/fp16
#: results; 3x here).
RMSE_MULTIPLIER, RMSE_SLACK = 3.0, 1e-5


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).pow(2).mean().sqrt())


def close_to_eager(got: torch.Tensor, prog: Compiled) -> tuple[bool, float]:
    """Whether ``got`` (one call's output) equals ``prog``'s eager output at the model's tolerance, and the max abs
    error to it.

    fp32 model: ``assert_close``. bf16/fp16 model (judged by the model's dtype, not the output's: Mamba returns fp32
    logits from bf16 weights): cosine >= ``COSINE_MIN`` with eager; failing that, equal when ``got`` is no further
    from the fp32 reference (:meth:`Compiled.fp32_reference`) than ``RMSE_MULTIPLIER`` x eager's own distance to it.
    The second test is for models where bf16 eager is itself far from fp32, so that a compiled program (which keeps
    fp32 inside its fused kernels) cannot match eager's rounding, such as Mamba-2.8B with random weights (stock
    Inductor fails the cosine test there too; docs/BENCHMARKS.md, bf16 checks). The check is then only as sharp as
    eager's bf16 error: on such a model it cannot see errors smaller than that.
    """
    want = prog.want
    err = float((got.float() - want.float()).abs().max())
    if prog.dtype not in (torch.bfloat16, torch.float16) and want.dtype not in (torch.bfloat16, torch.float16):
        try:
            torch.testing.assert_close(got, want)
            return True, err
        except AssertionError:
            return False, err
    cos = float(torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0))
    if cos >= COSINE_MIN:
        return True, err
    ref = prog.fp32_reference()
    got_rmse, eager_rmse = _rmse(got, ref), _rmse(want, ref)
    ok = got_rmse <= RMSE_MULTIPLIER * eager_rmse + RMSE_SLACK
    log.warning("%s: cosine %.5f with eager %s (< %s); RMSE to the fp32 reference %.4g, eager's %.4g: %s", prog.name,
                cos, prog.dtype, COSINE_MIN, got_rmse, eager_rmse,
                f"equal within eager's own {prog.dtype} error" if ok else f"DIFFERENT (> {RMSE_MULTIPLIER}x eager's)")
    return ok, err


#: Micro-batches the measured bench plans with: each of its calls runs a whole program on the full batch (its
#: "micro-batches" are further calls in flight, each counted in the step), so each call pays every cut edge once;
#: that is how the per-hop charge was fitted (``bench/fit_hop_overhead.py``).
PLAN_MICRO_BATCHES = 1


def make_plans(wl: Any, topo: Any, n_devices: int, streams: bool = True,
               in_flight: int = 1) -> tuple[dict[str, Any], float, SpaceChoice]:
    """Every plan of :func:`~torch_tessera.benchmark.plan_names` (a ``NotApplicableError`` or
    ``InfeasiblePlanError`` in place of a plan that does not apply or fit), ``tessera`` the best plan of its space
    (:func:`~torch_tessera.benchmark.choose_tessera`: the planner's single placement, with ``streams`` one request
    stream per device, and every baseline's placement) scored by :func:`step_score` with ``in_flight`` calls in
    flight; and the zero-communication bound's cycle (seconds per workload step, over the measured costs with free
    transfers: the better of one placement's and one request stream per device's, which request-dist executes).
    Every plan, tessera and baselines, is scored by the same model: the topology's per-hop charge included
    (:attr:`Topology.hop_overhead`).

    Returns:
        ``(plans, bound_cycle_s, choice)``; ``choice`` (a :class:`~torch_tessera.benchmark.SpaceChoice`) names the
        candidate that became tessera, every candidate's score and the note for the report.
    """
    from torch_tessera.benchmark import choose_tessera, plan_names
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, plan, plan_streams

    free = topo.free_transfers()
    bound = plan(wl, None, free, policy="throughput", cache_dir=False, memory_budgets=[None] * n_devices,
                 micro_batches=PLAN_MICRO_BATCHES).cycle_seconds
    if n_devices > 1:  # the bound covers the streams plans too (request-dist runs one request stream per device)
        bound = min(bound, plan_streams(wl, free, memory_budgets=[None] * n_devices,
                                        micro_batches=PLAN_MICRO_BATCHES).cycle_seconds)
    plans: dict[str, Any] = {}
    for name in plan_names(n_devices):
        try:
            if name == "request-dist" and n_devices > 1:  # executed: one request stream per device, at once
                try:
                    plans[name] = plan_streams(wl, topo, policy="request-dist", micro_batches=PLAN_MICRO_BATCHES)
                    continue
                except InfeasiblePlanError as e:  # then the derived row (replicas), which says why
                    log.warning("request-dist cannot run as one request stream per device (%s); its row is derived "
                                "from the homo-* runs", str(e).splitlines()[0])
            plans[name] = plan(wl, None, topo, policy="throughput" if name == "tessera" else name, cache_dir=False,
                               micro_batches=PLAN_MICRO_BATCHES)
        except (NotApplicableError, InfeasiblePlanError) as e:
            plans[name] = e
    choice = choose_tessera(plans, wl, topo, streams=streams, score=lambda p: step_score(p, wl, in_flight),
                            scored=f"cycle + fill/drain with {in_flight} call(s) in flight",
                            micro_batches=PLAN_MICRO_BATCHES)
    log.warning("%s", choice.note)  # the report's reader must see which plan tessera is
    return choice.plans, bound, choice


def step_score(p: Any, wl: Any, in_flight: int) -> float:
    """Seconds per workload step the measured bench ranks tessera's candidates by: the plan's cycle plus the pipeline
    fill and drain of its programs that span devices (:func:`~torch_tessera.scheduler.evaluate.fill_drain_seconds`,
    ``in_flight`` calls in flight).

    The planner searches under the cycle model alone, where a program passing back and forth between devices costs
    only its per-hop charge; executed, such a program idles each device while a round of calls fills and drains
    (docs/BENCHMARKS.md, step model; ``tessera report step-model``).
    """
    from torch_tessera.scheduler.evaluate import fill_drain_seconds

    return p.cycle_seconds + fill_drain_seconds(p, wl, in_flight)


#: Baselines whose placement runs as tessera's executed plan when tessera takes it (not request-dist's replicas, not
#: pd: their rows are derived from the homo-* runs, and so is tessera's when it takes their placement); the step-model
#: report compares the executed ones
TAKEOVER_BASELINES = ("homo-", "af", "layer")


def program_frequencies(p: Any, s: MeasureSettings) -> dict[str, float]:
    """Runs per workload step of each program plan ``p`` places (its own ``frequencies`` for a streams plan, whose
    programs are ``<name>@<r>`` too; else the settings' composition)."""
    freq = dict(getattr(p, "frequencies", None) or {})
    return freq if any("@" in n for n in freq) else dict(s.composition.frequencies)


def program_priorities(freq: Mapping[str, float], enabled: bool = True) -> dict[str, str]:
    """Stream priority class of each program (:data:`~torch_tessera.runtime.pipelining.PRIORITY_CLASSES`): when
    programs run at different frequencies, the most frequent (an LLM's decode, on every output token's path) is
    ``"urgent"`` and the others (its prefill, bulk work) ``"background"``; otherwise, or when not ``enabled``, all
    ``"normal"``. Opt-in (:class:`~torch_tessera.measure.settings.MeasureSettings` ``priorities``): it does not help
    reliably (docs/BENCHMARKS.md, stream priorities)."""
    if not enabled or len(freq) < 2 or len(set(freq.values())) < 2:
        return {n: "normal" for n in freq}
    top = max(freq.values())
    return {n: "urgent" if f == top else "background" for n, f in freq.items()}


class PlacedCall:
    """One program called on its executor directly, its STATE inputs (KV cache, SSM state) kept on the devices
    that own them under the current placement (:meth:`PlacedExecutor.set_state_homes`), as a deployment of the plan
    would keep them: no per-call copy of the state in or out, which the plans' throughput model does not charge.

    The state is copied from the module's state after :meth:`Compiled.reset` (a saved copy stays beside it on the
    same device; with ``save_large=False`` only of the small buffers, <= ``SMALL_STATE_BYTES``: the cache-length
    counters, enough to keep positions inside the cache); :meth:`restore` puts it back, so that every call computes
    :attr:`Compiled.want`. Micro-batches are one ``PlacedCall`` each (its own state; ``args`` go to
    ``run_pipelined``).
    """

    def __init__(self, prog: Compiled, save_large: bool = True) -> None:
        from torch_tessera.measure.profile import SMALL_STATE_BYTES
        from torch_tessera.lowering.program import BufferKind, TensorArg

        ex = prog.runner.executor
        homes = ex.state_owners()
        if not getattr(ex, "state_homes", None) and any(ex.domains[d] != ex.domains[ex.home] for d in homes.values()):
            ex.set_state_homes(homes)
        prog.reset()
        program = prog.runner.program
        self.executor, self.args, self.saved = ex, [], []
        for spec, v in zip(program.inputs, prog.args):
            if isinstance(spec, TensorArg) and program.buffers[spec.buffer].kind == BufferKind.STATE:
                dev = ex.devices[homes.get(spec.buffer, ex.home)].torch_device
                live = v.to(dev, copy=True)
                if save_large or live.numel() * live.element_size() <= SMALL_STATE_BYTES:
                    self.saved.append((live, live.clone()))
                v = live
            self.args.append(v)

    def restore(self, small_only: bool = False) -> None:
        """Every STATE input back to its value after :meth:`Compiled.reset`; with ``small_only`` only the small ones
        (<= ``SMALL_STATE_BYTES``: cache-length counters, enough to keep positions inside the cache)."""
        from torch_tessera.measure.profile import SMALL_STATE_BYTES

        for live, saved in self.saved:
            if not small_only or live.numel() * live.element_size() <= SMALL_STATE_BYTES:
                live.copy_(saved)

    def __call__(self) -> list:
        return self.executor.run(self.args)


def _output(outputs: Sequence[Any], want: torch.Tensor) -> torch.Tensor:
    """The program's result among its outputs (the one tensor output of the eager output's shape)."""
    hits = [o for o in outputs if isinstance(o, torch.Tensor) and tuple(o.shape) == tuple(want.shape)]
    if len(hits) != 1:
        raise TesseraError(f"expected one output of shape {tuple(want.shape)}, found {len(hits)}")
    return hits[0]


def run_plan(progs: Sequence[Compiled], p: Any, s: MeasureSettings) -> dict:
    """Set plan ``p``'s placement on every compiled program, check each against eager, time it.

    Returns:
        ``equal``, ``max_abs_error``, ``seconds`` (program name -> median seconds per call), ``pipelined_seconds``
        (program name -> wall seconds per micro-batch, for programs the plan spreads over several devices when
        ``micro_batches >= 2``), ``cut_edges`` (distinct cut edges copied in one call of each program, summed).
    """
    out: dict[str, Any] = {"equal": True, "max_abs_error": 0.0, "cut_edges": 0, "seconds": {},
                           "pipelined_seconds": {}}
    calls: dict[str, PlacedCall] = {}
    pipes: dict[str, list[PlacedCall]] = {}  # program -> its micro-batches, for the concurrent timing
    classes = program_priorities(program_frequencies(p, s), s.priorities)
    out["priority_classes"] = classes
    for prog in progs:
        runner = prog.runner
        runner.priority_class = classes.get(prog.name, "normal")
        runner.set_placement(p.placements[prog.name], p)
        sync = lambda: _devices_sync(runner)  # noqa: E731
        with torch.no_grad():
            call = calls[prog.name] = PlacedCall(prog)
            moved = dict(runner.executor.bytes_moved)
            call.restore()
            ok, err = close_to_eager(_output(call(), prog.want), prog)
            out.setdefault("bytes_per_call", {})[prog.name] = {
                k: v - moved.get(k, 0) for k, v in runner.executor.bytes_moved.items()
                if k not in ("weights", "static")}  # placed once, at this first call: not per call
            t = _median_seconds(call, call.restore, sync, s.warmup, s.repeats)
            if all(d.torch_device.type == "cuda" for d in runner.devices):
                out.setdefault("device_busy", {})[prog.name] = device_busy(call, call.restore, sync)
            out["cut_edges"] += runner.executor.cut_edges_transferred
            out["equal"] &= ok
            out["max_abs_error"] = max(out["max_abs_error"], err)
            out["seconds"][prog.name] = t
            used = {d for d in p.placements[prog.name].values()}
            # several calls in flight for every program that leaves its home device (split over devices, or wholly on
            # another, as request-dist's and homo-R's): one call at a time there waits out each call's copies in and
            # out and its host wait, which a program kept at home (replayed on the caller's stream) does not
            if s.micro_batches >= 2 and used != {runner.executor.home}:
                # one slot per micro-batch: each slot always sees the same micro-batch's state tensors, so with CUDA
                # graphs it captures once (a slot fed another micro-batch's state re-captures, and the timing
                # would measure captures, several times the replay's time)
                slots = s.micro_batches
                mbs = pipes[prog.name] = [PlacedCall(prog, save_large=False) for _ in range(s.micro_batches)]
                batches = [c.args for c in mbs]
                restore_small = lambda: [c.restore(small_only=True) for c in mbs]  # noqa: E731
                results = runner.executor.run_pipelined(batches, slots=slots)  # also the warm-up (graph capture)
                for res in results:
                    ok, err = close_to_eager(_output(res, prog.want), prog)
                    out["equal"] &= ok
                    out["max_abs_error"] = max(out["max_abs_error"], err)
                times = []
                for _ in range(max(1, s.repeats // 2)):
                    restore_small()  # cache-length counters back, so positions stay inside the cache
                    sync()
                    t0 = time.perf_counter()
                    runner.executor.run_pipelined(batches, slots=slots)
                    sync()
                    times.append((time.perf_counter() - t0) / s.micro_batches)
                out["pipelined_seconds"][prog.name] = statistics.median(times)
                if all(d.torch_device.type == "cuda" for d in runner.devices):  # do the slots overlap on the GPUs?
                    out.setdefault("pipelined_busy", {})[prog.name] = device_busy(
                        lambda: runner.executor.run_pipelined(batches, slots=slots), restore_small, sync)
    if s.concurrent_steps and len(progs) > 1 and len({d for pl in p.placements.values() for d in pl.values()}) > 1:
        out["concurrent_threads"] = {}
        out["concurrent_step_seconds"] = concurrent_step_seconds(progs, s, calls, pipes, program_frequencies(p, s),
                                                                 threads_out=out["concurrent_threads"])
    return out


def device_busy(fn: Callable[[], Any], before: Callable[[], None], sync: Callable[[], None]) -> dict:
    """Where one call's time goes on the GPUs: one call of ``fn`` traced with ``torch.profiler`` (CUPTI sees the
    kernels and copies inside CUDA graphs), per GPU index: ``kernels`` (count), ``kernel_ms`` (union of the kernels'
    busy intervals: concurrent kernels count once), ``copy_ms`` (same for memcpy/memset), and ``wall_ms`` (first start
    to last end over all GPUs). A plan whose ``wall_ms`` is far above every GPU's ``kernel_ms`` waits (on hops,
    events, the host) rather than computes. Returns ``{"error": ...}`` if the profiler fails (never raises)."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        before()
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
        counts: dict[int, int] = {}
        for e in prof.events():
            if e.device_type != DeviceType.CUDA:
                continue
            kind = "copy" if e.name.startswith(("Memcpy", "Memset")) else "kernel"
            spans.setdefault((e.device_index, kind), []).append((e.time_range.start, e.time_range.end))
            if kind == "kernel":
                counts[e.device_index] = counts.get(e.device_index, 0) + 1
        if not spans:
            return {"error": "the profiler recorded no GPU activity"}

        def union_ms(iv: list[tuple[float, float]]) -> float:
            total, end = 0.0, -math.inf
            for a, b in sorted(iv):
                if a > end:
                    total += b - a
                    end = b
                elif b > end:
                    total += b - end
                    end = b
            return total / 1e3

        everything = [x for iv in spans.values() for x in iv]
        out: dict[str, Any] = {"wall_ms": (max(b for _, b in everything) - min(a for a, _ in everything)) / 1e3}
        for dev in sorted({d for d, _ in spans}):
            out[f"gpu{dev}"] = {"kernels": counts.get(dev, 0), "kernel_ms": union_ms(spans.get((dev, "kernel"), [])),
                                "copy_ms": union_ms(spans.get((dev, "copy"), []))}
        return out
    except Exception as e:  # noqa: BLE001 - a diagnostic must not end the bench
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def _own_streams(runner: Any, priority_class: str = "normal") -> Any:
    """A fresh current stream on every CUDA device of ``runner`` for the calling thread (a context manager).

    The executor orders each call after the caller's current stream on every device it uses (the inputs and the
    state may still be in flight there) and a home-only graph replays on it. Threads that share the default streams
    therefore wait for each other's calls, as if one after another (docs/BENCHMARKS.md, request streams). A serving
    process gives each request stream its own CUDA streams; so does this timing. They have the priority of the
    program's ``priority_class`` (a graph kept on one device replays on them, at their priority)."""
    import contextlib

    from torch_tessera.runtime.streams import greatest_priority, single_priority

    prio = single_priority(priority_class, greatest_priority(runner.devices))
    stack = contextlib.ExitStack()
    seen = set()
    for d in runner.devices:
        dev = d.torch_device
        if dev.type == "cuda" and dev.index not in seen:
            seen.add(dev.index)
            stack.enter_context(torch.cuda.stream(torch.cuda.Stream(device=dev, priority=prio)))
    return stack


#: Fewest calls any program makes in the concurrent timing on GPUs. With a fixed number of workload steps a rare
#: program rounds to one or two calls and the step count is off by up to half a call (docs/BENCHMARKS.md, request
#: streams). 16 keeps the rounding under 1/32 of a call count.
MIN_CONCURRENT_CALLS = 16


#: Most workload steps the concurrent timing raises ``concurrent_steps`` to (a program with a tiny share would
#: otherwise make the others run for very long)
MAX_CONCURRENT_STEPS = 256


def concurrent_counts(frequencies: Mapping[str, float], steps: int, min_calls: int = 1) -> dict[str, int]:
    """Calls of each program for the concurrent timing: ``frequency x S`` rounded (at least 1), with ``S`` =
    ``steps`` raised until the least frequent program makes ``min_calls`` calls, but not above
    :data:`MAX_CONCURRENT_STEPS` (frequencies: runs per workload step; programs at frequency 0 are ignored for
    ``S``)."""
    rare = min((f for f in frequencies.values() if f > 0), default=1.0)
    s = max(float(steps), min(min_calls / rare, float(MAX_CONCURRENT_STEPS)))
    return {name: max(1, round(f * s)) for name, f in frequencies.items()}


def concurrent_step_seconds(progs: Sequence[Compiled], s: MeasureSettings, calls: dict[str, PlacedCall],
                            pipes: dict[str, list[PlacedCall]] | None = None,
                            frequencies: Mapping[str, float] | None = None,
                            threads_out: dict | None = None) -> float:
    """Wall seconds per workload step with the programs running AT THE SAME TIME, each from its own host thread
    (its own executor streams): ``concurrent_steps`` steps' worth of calls (``frequency x steps`` of each program;
    on GPUs at least :data:`MIN_CONCURRENT_CALLS` of the least frequent, :func:`concurrent_counts`).

    This is what a throughput plan's model assumes for a workload of several programs (a prefill for one request
    while the decode of others runs elsewhere) and what the serial composition ``sum_p frequency_p x T_p`` cannot
    show (docs/BENCHMARKS.md, concurrent steps). The programs
    share STATE (the KV cache): ``calls`` (program name -> :class:`PlacedCall`) runs each on its executor with its
    state on its owner; each call restores the small counters first, so positions stay inside the cache; values
    written concurrently are not checked here (each plan's result is checked alone). A program in ``pipes``
    (program name -> its micro-batches' :class:`PlacedCall`) runs them through ``run_pipelined`` instead, so
    that besides the two programs overlapping, several calls of one program are in flight, as the throughput model
    assumes (one call at a time leaves a thread waiting out each call's latency). ``frequencies``: runs per
    workload step per program (default the settings' composition; a streams plan's own, one thread per program of
    every stream). ``threads_out``, when given, receives per program ``{"calls": n, "seconds": s}``: the calls its
    thread made and the seconds from the common start until that thread's work had finished on its streams (which
    thread bounds the step, and how far each is from ``calls`` x its call time alone).
    """
    import threading

    from torch_tessera.runtime import realize

    import contextlib

    freq = s.composition.frequencies if frequencies is None else frequencies
    on_cpu = progs[0].runner.devices[0].torch_device.type == "cpu"
    counts = concurrent_counts({p.name: freq[p.name] for p in progs}, s.concurrent_steps,
                               1 if on_cpu else MIN_CONCURRENT_CALLS)
    start = threading.Barrier(len(progs) + 1)
    done = {p.name: 0 for p in progs}
    ends: dict[str, float] = {}
    errors: list[BaseException] = []
    # the Triton interpreter (CPU devices) keeps global state: there the threads take turns (plumbing only)
    turn = threading.Lock() if on_cpu else contextlib.nullcontext()

    def worker(prog: Compiled) -> None:
        start.wait()
        try:
            with torch.no_grad(), _own_streams(prog.runner, getattr(prog.runner, "priority_class", "normal")):
                call, pipe = calls[prog.name], (pipes or {}).get(prog.name)
                if pipe is not None:
                    batches = [c.args for c in pipe]
                    for _ in range(math.ceil(counts[prog.name] / len(batches))):
                        with turn:
                            for c in pipe:
                                c.restore(small_only=True)
                            prog.runner.executor.run_pipelined(batches, slots=len(batches))
                            done[prog.name] += len(batches)
                    ends[prog.name] = time.perf_counter()
                    return
                for _ in range(counts[prog.name]):
                    with turn:
                        call.restore(small_only=True)
                        call()
                        done[prog.name] += 1
                if not on_cpu:  # this thread's work done on its own streams (a home-only graph returns at once)
                    for d in prog.runner.devices:
                        torch.cuda.current_stream(d.torch_device).synchronize()
                ends[prog.name] = time.perf_counter()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    spin, realize.SPIN_S = realize.SPIN_S, 0.0  # busy-polling one thread's completion would hold the other's GIL
    try:
        threads = [threading.Thread(target=worker, args=(prog,), daemon=True) for prog in progs]
        for t in threads:
            t.start()
        _devices_sync(progs[0].runner)
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        _devices_sync(progs[0].runner)
        wall = time.perf_counter() - t0
    finally:
        realize.SPIN_S = spin
    if errors:
        raise errors[0]
    if threads_out is not None:
        threads_out.update({n: {"calls": done[n], "seconds": ends[n] - t0} for n in ends})
    steps = min(done[p.name] / freq[p.name] for p in progs)
    return wall / steps


def handover_seconds(prog: Compiled, src: int, dst: int, repeats: int) -> float:
    """Measured seconds to copy one request's state that ``prog`` hands to the next program (its ``handover``
    buffers: the prefill's KV cache or SSM state) from device ``src`` to device ``dst`` of its runner (median of
    ``repeats`` copies); 0 between SM partitions of one GPU, and when there is nothing to hand over."""
    devices = prog.runner.devices
    a, b = devices[src].torch_device, devices[dst].torch_device
    if a.type == "cuda" and a == b:
        return 0.0  # SM partitions of one GPU share memory: the executor waits on an event, it copies nothing
    bufs = [t for n, t in prog.module.named_buffers() if prog.handover and n.startswith(prog.handover)]
    if not bufs:
        return 0.0
    srcs = [t.to(a) for t in bufs]
    dsts = [torch.empty_like(t, device=b) for t in bufs]

    def copy() -> None:
        for x, y in zip(srcs, dsts):
            y.copy_(x, non_blocking=True)

    return _median_seconds(copy, lambda: None, lambda: _devices_sync(prog.runner), 1, repeats)
