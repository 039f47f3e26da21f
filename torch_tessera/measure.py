"""``tessera bench --measure``: every baseline and tessera RUN and TIMED on real devices, in one process.

Steps (:func:`measure_plans`):

1. **Build and compile once.** The registry LLM with random weights (bf16 on CUDA, fp32 on CPU), wrapped twice with a
   static KV cache of ``context`` positions (:class:`~torch_tessera.static_cache.StaticCacheLM`, one set of weights):
   a prefill program (1 sequence x ``prefill_tokens``) and a decode step (``decode_batch`` sequences x 1 token). Each is
   compiled ONCE with the tessera backend (``policy="home"``; CUDA graphs when every device is a GPU); plans are then
   switched with ``runner.set_placement``. The cache-length counters (``kv_length_<i>``) are reset before every call,
   so every call writes the same positions and computes the same logits.
2. **Profile.** Every launch of each program on each device (:func:`~torch_tessera.runtime.profiler.profile_program`:
   CUDA events on the device's stream, ``perf_counter`` on CPU virtual devices), in a private pool filled by one run
   of the program in order; small STATE buffers (counters, <= 4 KiB) are restored before every timed run. This is the
   MEASURED cost table.
3. **Plan** every baseline and tessera (:func:`torch_tessera.scheduler.plan`) from the measured costs and the links
   (catalog model, or measured with ``links="measured"``); the zero-communication bound is the throughput plan with
   free transfers over the same measured costs.
4. **Run and time.** Each per-program placement (``homo-*``, ``af``, ``layer``, ``tessera``) is set on both compiled
   programs, checked against eager (``assert_close`` in fp32; cosine >= 0.999 in bf16) and timed (median of
   ``repeats`` calls, devices synchronised). Plans on several devices are also run with ``micro_batches``
   independent micro-batches through ``PlacedExecutor.run_pipelined`` (2 slots), each with its own KV cache.

How each row's throughput is derived (one workload step = one request: one prefill and ``f = output_tokens /
decode_batch`` decode steps, producing ``output_tokens`` tokens; the same composition as the simulator's
:meth:`~torch_tessera.scheduler.Workload.llm`):

* executed plans: ``tok/s = output_tokens / (T_prefill + f x T_decode)`` from the measured step times; with micro-batches
  the same formula over the measured wall time per micro-batch (the headline uses the pipelined time where measured).
* ``request-dist`` (derived): a full replica per device, requests split in proportion to speed: the sum over devices
  of the measured ``homo-<g>`` throughputs.
* ``pd`` (derived): prefill on device ``a``, decode on ``b`` (the plan's choice), requests overlapped:
  ``output_tokens / max(T_prefill(homo-a), f x T_decode(homo-b), T_kv)`` where ``T_kv`` is the measured copy of one
  request's prefill K/V cache from ``a`` to ``b``.
* TTFT = the prefill step (``+ T_kv`` for pd), TPOT = the decode step, both unloaded (no queueing): estimates.

On CPU virtual devices all numbers are meaningless as performance (the Triton interpreter, one host); correctness and
plumbing are what that run tests.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from torch_tessera.errors import ConfigError, TesseraError

log = logging.getLogger(__name__)

#: STATE buffers at most this many bytes (cache-length counters) are restored before every profiled run.
SMALL_STATE_BYTES = 4096


@dataclass(frozen=True)
class MeasureSettings:
    """What :func:`measure_plans` builds, runs and how often.

    Attributes:
        model: registry LLM with a static KV cache (``llama``, ``moe``).
        devices: comma-separated device strings (``"cuda:0,cuda:1@24sm"``, ``"cpu:0,cpu:1"``).
        size: ``"full"`` or ``"tiny"``.
        layers: keep only the first ``layers`` decoder layers (``None``: all).
        prefill_tokens: prompt tokens of the prefill program (default 1024 full, 16 tiny).
        decode_batch: sequences per decode step (default 64 full, 4 tiny).
        context: KV cache positions per sequence (default ``prefill_tokens + round(output_tokens / 2)``).
        output_tokens: mean output tokens per request (conversation workload: 129).
        repeats: timed calls per plan and program (median kept).
        warmup: untimed calls before timing, after the checked call (which also captures CUDA graphs).
        profile_repeats / profile_warmup: timed / untimed runs per distinct launch when profiling.
        micro_batches: micro-batches for the pipelined timing of multi-device plans (0 or 1: skip it).
        links: ``"catalog"`` (modelled links) or ``"measured"`` (timed copies between the devices).
        cuda_graphs: capture CUDA graphs (``None``: when every device is a GPU).
        profile_cache: profile cache directory (``None``: ``$TESSERA_CACHE_DIR`` or ``~/.cache/torch_tessera``).
    """

    model: str = "llama"
    devices: str = "cpu:0,cpu:1"
    size: str = "tiny"
    layers: int | None = None
    prefill_tokens: int | None = None
    decode_batch: int | None = None
    context: int | None = None
    output_tokens: float = 129.0
    repeats: int = 10
    warmup: int = 2
    profile_repeats: int = 10
    profile_warmup: int = 2
    micro_batches: int = 4
    links: str = "catalog"
    cuda_graphs: bool | None = None
    profile_cache: str | None = None

    def __post_init__(self) -> None:
        from torch_tessera.static_cache import has_kv_cache

        if self.size not in ("full", "tiny"):
            raise ConfigError(f"size must be 'full' or 'tiny', got {self.size!r}")
        if not has_kv_cache(self.model):
            raise ConfigError(f"--measure runs LLMs with a static KV cache (llama, moe); {self.model!r} is not one: "
                              "use the predicted mode (tessera bench without --measure) for it")
        if self.links not in ("catalog", "measured"):
            raise ConfigError(f"links must be 'catalog' or 'measured', got {self.links!r}")
        if self.repeats < 1 or self.profile_repeats < 1 or self.warmup < 0 or self.profile_warmup < 0:
            raise ConfigError("repeats and profile_repeats must be >= 1, warmup and profile_warmup >= 0")
        if self.layers is not None and self.layers < 1:
            raise ConfigError(f"layers must be >= 1, got {self.layers}")
        if self.output_tokens <= 0:
            raise ConfigError(f"output_tokens must be > 0, got {self.output_tokens}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(prefill_tokens, decode_batch, context)`` with the size's defaults filled in.

        Raises:
            ConfigError: ``context < prefill_tokens``.
        """
        p = self.prefill_tokens or (1024 if self.size == "full" else 16)
        b = self.decode_batch or (64 if self.size == "full" else 4)
        c = self.context or p + int(round(self.output_tokens / 2))
        if c < p:
            raise ConfigError(f"context={c} must be >= prefill_tokens={p}")
        return p, b, c


@dataclass
class Compiled:
    """One program compiled once with the tessera backend.

    Attributes:
        name: ``"prefill"`` or ``"decode"`` (the workload's program names).
        module: the :class:`StaticCacheLM` (its buffers are the live KV cache).
        inputs: ``(input_ids, position_ids)``.
        tokens: new tokens per sequence (the counters are reset to ``context - tokens`` before a call).
        fn: the ``torch.compile`` result.
        runner: the backend's :class:`~torch_tessera.runtime.runner.TesseraRunner`.
        want: eager logits ``[batch, tokens, vocab]``.
        args: the graph inputs the runner received (program order), for profiling and micro-batches.
    """

    name: str
    module: Any
    inputs: tuple
    tokens: int
    fn: Any = None
    runner: Any = None
    want: torch.Tensor | None = None
    args: list = field(default_factory=list)

    def reset(self) -> None:
        """Set every cache-length counter to ``context - tokens`` (this call writes the last positions)."""
        from torch_tessera.static_cache import LENGTH_PREFIX

        for n, b in self.module.named_buffers():
            if n.startswith(LENGTH_PREFIX):
                b.fill_(self.module.context - self.tokens)

    def __call__(self) -> torch.Tensor:
        self.reset()
        return self.fn(*self.inputs)


class _ArgsRecorder:
    """Stands in for a runner's executor for one call and keeps the graph inputs it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.args = inner, []

    def __call__(self, args: list) -> list:
        self.args = list(args)
        return self.inner(args)


@dataclass(frozen=True)
class MeasuredRow:
    """One plan's measured (or derived) performance; times in seconds, throughput in output tokens/s.

    ``how`` says how the throughput was obtained: ``"run"`` (executed serially), ``"run, pipelined"`` (executed with
    micro-batches), ``"derived"`` (composed from measured ``homo-*`` steps), or why the plan has no number.
    """

    plan: str
    applies: bool
    how: str
    equal: bool | None = None
    max_abs_error: float = math.nan
    prefill_s: float = math.nan
    decode_s: float = math.nan
    prefill_pipelined_s: float = math.nan
    decode_pipelined_s: float = math.nan
    output_per_s_serial: float = math.nan
    output_per_s: float = math.nan
    predicted_output_per_s: float = math.nan
    ttft_s: float = math.nan
    tpot_s: float = math.nan
    price_per_hour: float = math.nan
    output_per_s_per_price: float = math.nan
    vs_bound: float = math.nan
    speedup_vs_best_baseline: float = math.nan
    cut_edges: int = 0


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


def _close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float]:
    """Equal at the dtype's tolerance: ``assert_close`` for fp32, cosine >= 0.999 for bf16/fp16."""
    err = float((got.float() - want.float()).abs().max())
    if want.dtype in (torch.bfloat16, torch.float16):
        cos = torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0)
        return bool(cos >= 0.999), err
    try:
        torch.testing.assert_close(got, want)
        return True, err
    except AssertionError:
        return False, err


def build_programs(s: MeasureSettings, home: str) -> list[Compiled]:
    """The prefill and decode modules over one set of weights on ``home``, with their inputs and eager logits."""
    from torch_tessera.models import build_module, get_model
    from torch_tessera.static_cache import StaticCacheLM

    p, b, c = s.shape
    on_cuda = home.startswith("cuda")
    dtype = torch.bfloat16 if on_cuda else torch.float32
    lm = build_module(s.model, s.size, device=home, dtype=dtype).model
    if s.layers is not None:
        layers = lm.model.layers
        if s.layers > len(layers):
            raise ConfigError(f"--layers {s.layers}: {s.model} ({s.size}) has only {len(layers)} layers")
        lm.model.layers = layers[:s.layers]
        lm.config.num_hidden_layers = s.layers
        if getattr(lm.config, "layer_types", None):
            lm.config.layer_types = lm.config.layer_types[:s.layers]
    spec = get_model(s.model)
    out = []
    for name, batch, tokens in (("prefill", 1, p), ("decode", b, 1)):
        module = StaticCacheLM(lm, batch, c).eval()
        (ids,) = spec.example_inputs(s.size, batch, tokens, device=home)
        pos = torch.arange(c - tokens, c, device=home).expand(batch, tokens).contiguous()
        prog = Compiled(name, module, (ids, pos), tokens)
        with torch.no_grad():
            prog.reset()
            prog.want = module(ids, pos).clone()
        out.append(prog)
    return out


def compile_program(prog: Compiled, devices: str, cuda_graphs: bool) -> None:
    """Compile ``prog`` once with the tessera backend (home placement) and record its graph inputs.

    Raises:
        TesseraError: Dynamo split the module into several graphs (the bench needs one program per step).
    """
    from torch_tessera.backend.recording import RecordingBackend

    backend = RecordingBackend(devices=devices, policy="home", cuda_graphs=cuda_graphs)
    prog.fn = torch.compile(prog.module, backend=backend, dynamic=False)
    with torch.no_grad():
        prog()
        if len(backend.executors) != 1:
            raise TesseraError(f"{prog.name}: Dynamo produced {len(backend.executors)} graphs; the measured bench "
                               "needs one program per step (look for graph breaks with TORCH_LOGS=graph_breaks)")
        prog.runner = backend.executors[0]
        rec = _ArgsRecorder(prog.runner.executor)
        prog.runner.executor = rec
        try:
            prog()
        finally:
            prog.runner.executor = rec.inner
        prog.args = rec.args


def profile_on_device(prog: Compiled, g: int, s: MeasureSettings) -> Any:
    """Time every launch of ``prog`` on device ``g`` of its runner: one column of the measured cost table.

    The launches run in a private pool on that device: weights bound (copied when the device has other memory),
    other inputs and STATE copied (the caller's KV cache is not touched), the rest allocated and filled by one run of
    the whole program in order. Small STATE buffers (<= :data:`SMALL_STATE_BYTES`, the cache-length counters) are
    restored before every run, so repeated launches keep writing the same cache positions.

    Returns:
        a :class:`~torch_tessera.runtime.profiler.ProfileColumn` (seconds per launch, program order).
    """
    from torch.utils._pytree import tree_flatten

    from torch_tessera.lowering.program import BufferKind, ExternLaunch, TensorArg
    from torch_tessera.runtime.executor import BufferPool, bind_input, fresh_extern_outputs
    from torch_tessera.runtime.placed import _stream_ctx
    from torch_tessera.runtime.profiler import ProfileCache, profile_program

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

    def run_launch(launch: Any) -> None:
        with dev.guard(), _stream_ctx(stream):
            result = launcher.launch(launch, pool, stream)
        if isinstance(launch, ExternLaunch) and launch.index in fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in fresh[launch.index]:
                    pool.bind(spec.buffer, t)

    def restore(launch: Any, i: int) -> None:
        for name, saved in small.items():
            pool.storages[name].copy_(saved)

    with torch.no_grad():
        for launch in program.launches:  # one run in order: every temporary holds what the program computes
            run_launch(launch)
        restore(None, 0)
        column = profile_program(program, dev, run_launch, warmup=s.profile_warmup, repeats=s.profile_repeats,
                                 rotate=restore, cache=ProfileCache(s.profile_cache), progress=False)
    return column


def measured_workload(progs: Sequence[Compiled], s: MeasureSettings, progress: Any = None) -> tuple[Any, Any, dict]:
    """Profile both programs on every device and build the scheduler's workload and topology from the measurements.

    Returns:
        ``(workload, topology, cost_tables)`` where ``cost_tables`` maps program name -> measured ``CostTable``.
    """
    from torch_tessera.runtime.links import build_topology, measure_links
    from torch_tessera.runtime.profiler import to_cost_table
    from torch_tessera.scheduler import Workload

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
    pre, dec = progs
    _, batch, _ = s.shape
    wl = Workload.llm(pre.runner.dag, tables["prefill"], dec.runner.dag, tables["decode"], s.output_tokens / batch)
    return wl, topo, tables


def make_plans(wl: Any, topo: Any, n_devices: int) -> tuple[dict[str, Any], float]:
    """Every plan of :func:`~torch_tessera.benchmark.plan_names` (a ``NotApplicableError`` or
    ``InfeasiblePlanError`` in place of a plan that does not apply or fit) and the zero-communication bound's cycle
    (seconds per workload step, over the measured costs with free transfers)."""
    from torch_tessera.benchmark import plan_names
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.runtime.costs import Topology
    from torch_tessera.scheduler import NotApplicableError, plan

    free = Topology(topo.devices, np.full_like(topo.bandwidth, 1e30), np.zeros_like(topo.latency), topo.memory,
                    "free transfers")
    bound = plan(wl, None, free, policy="throughput", cache_dir=False, memory_budgets=[None] * n_devices)
    plans: dict[str, Any] = {}
    for name in plan_names(n_devices):
        try:
            plans[name] = plan(wl, None, topo, policy="throughput" if name == "tessera" else name, cache_dir=False)
        except (NotApplicableError, InfeasiblePlanError) as e:
            plans[name] = e
    return plans, bound.cycle_seconds


def _micro_batches(prog: Compiled, m: int) -> list[list]:
    """``m`` input lists for ``run_pipelined``: same weights and token inputs, each with its own STATE (KV cache)."""
    from torch_tessera.lowering.program import BufferKind, TensorArg

    prog.reset()
    program = prog.runner.program
    out = []
    for _ in range(m):
        args = []
        for spec, v in zip(program.inputs, prog.args):
            state = isinstance(spec, TensorArg) and program.buffers[spec.buffer].kind == BufferKind.STATE
            args.append(v.clone() if state else v)
        out.append(args)
    return out


def _logits(outputs: Sequence[Any], want: torch.Tensor) -> torch.Tensor:
    """The logits among a program's outputs (the one tensor output of the eager logits' shape)."""
    hits = [o for o in outputs if isinstance(o, torch.Tensor) and tuple(o.shape) == tuple(want.shape)]
    if len(hits) != 1:
        raise TesseraError(f"expected one output of shape {tuple(want.shape)}, found {len(hits)}")
    return hits[0]


def run_plan(progs: Sequence[Compiled], p: Any, s: MeasureSettings) -> dict:
    """Set plan ``p``'s placement on both compiled programs, check each against eager, time it.

    Returns:
        ``equal``, ``max_abs_error``, ``prefill_s``/``decode_s`` (median seconds per call) and, for a plan on several
        devices with ``micro_batches >= 2``, ``prefill_pipelined_s``/``decode_pipelined_s`` (wall seconds per
        micro-batch), ``cut_edges`` (distinct cut edges copied in one call of each program, summed).
    """
    out: dict[str, Any] = {"equal": True, "max_abs_error": 0.0, "cut_edges": 0}
    for prog in progs:
        runner = prog.runner
        runner.set_placement(p.placements[prog.name], p)
        sync = lambda: _devices_sync(runner)  # noqa: E731
        with torch.no_grad():
            ok, err = _close(prog(), prog.want)
            t = _median_seconds(lambda: prog.fn(*prog.inputs), prog.reset, sync, s.warmup, s.repeats)
            out["cut_edges"] += runner.executor.cut_edges_transferred
            out["equal"] &= ok
            out["max_abs_error"] = max(out["max_abs_error"], err)
            out[f"{prog.name}_s"] = t
            used = {d for d in p.placements[prog.name].values()}
            if s.micro_batches >= 2 and len(used) > 1:
                batches = _micro_batches(prog, s.micro_batches)
                results = runner.executor.run_pipelined(batches, slots=2)  # also the warm-up (graph capture)
                for res in results:
                    ok, err = _close(_logits(res, prog.want), prog.want)
                    out["equal"] &= ok
                    out["max_abs_error"] = max(out["max_abs_error"], err)
                batches = _micro_batches(prog, s.micro_batches)
                sync()
                t0 = time.perf_counter()
                runner.executor.run_pipelined(batches, slots=2)
                sync()
                out[f"{prog.name}_pipelined_s"] = (time.perf_counter() - t0) / s.micro_batches
    return out


def kv_handover_seconds(progs: Sequence[Compiled], src: int, dst: int, repeats: int) -> float:
    """Measured seconds to copy one request's prefill KV cache (the prefill module's ``kv_key_*``/``kv_value_*``
    buffers) from device ``src`` to device ``dst`` of the runner (median of ``repeats`` copies); 0 between SM
    partitions of one GPU."""
    from torch_tessera.static_cache import KEY_PREFIX, VALUE_PREFIX

    pre = progs[0]
    devices = pre.runner.devices
    a, b = devices[src].torch_device, devices[dst].torch_device
    if a.type == "cuda" and a == b:
        return 0.0  # SM partitions of one GPU share memory: the executor waits on an event, it copies nothing
    bufs = [t for n, t in pre.module.named_buffers() if n.startswith((KEY_PREFIX, VALUE_PREFIX))]
    srcs = [t.to(a) for t in bufs]
    dsts = [torch.empty_like(t, device=b) for t in bufs]

    def copy() -> None:
        for x, y in zip(srcs, dsts):
            y.copy_(x, non_blocking=True)

    return _median_seconds(copy, lambda: None, lambda: _devices_sync(pre.runner), 1, repeats)


def _per_s(out_tokens: float, f: float, prefill_s: float, decode_s: float) -> float:
    step = prefill_s + f * decode_s
    return out_tokens / step if step > 0 else math.nan


def compose_rows(progs: Sequence[Compiled], plans: dict[str, Any], runs: dict[str, dict], bound_cycle: float,
                 s: MeasureSettings) -> tuple[list[MeasuredRow], float]:
    """Rows for every plan from the executed runs (see the module docstring for each formula), and the bound in
    output tokens/s."""
    from torch_tessera.scheduler import Plan

    _, batch, _ = s.shape
    f = s.output_tokens / batch
    specs = [d.spec for d in progs[0].runner.devices]
    homo = {i: n for i, n in enumerate(n for n in plans if n.startswith("homo-"))}
    rows: dict[str, dict] = {}
    for name, p in plans.items():
        if not isinstance(p, Plan):
            why = str(p).split("\n")[0][:120]
            rows[name] = dict(plan=name, applies=False, how=("does not fit: " if "fit" in why else "n/a: ") + why)
            continue
        used = sorted({d for pl in p.placements.values() for d in pl.values()} | set(p.replicas))
        price = sum(float(specs[g].price_per_hour) for g in used)
        base = dict(plan=name, applies=True, price_per_hour=price,
                    predicted_output_per_s=s.output_tokens / p.cycle_seconds if p.cycle_seconds else math.nan)
        if name in runs:
            r = runs[name]
            if "error" in r:
                rows[name] = dict(plan=name, applies=False, how=r["error"])
                continue
            serial = _per_s(s.output_tokens, f, r["prefill_s"], r["decode_s"])
            pipe_p, pipe_d = r.get("prefill_pipelined_s", math.nan), r.get("decode_pipelined_s", math.nan)
            piped = _per_s(s.output_tokens, f, pipe_p if pipe_p == pipe_p else r["prefill_s"],
                           pipe_d if pipe_d == pipe_d else r["decode_s"])
            best = max(serial, piped) if piped == piped else serial
            rows[name] = dict(base, how="run, pipelined" if piped == piped and piped > serial else "run",
                              equal=r["equal"], max_abs_error=r["max_abs_error"], prefill_s=r["prefill_s"],
                              decode_s=r["decode_s"], prefill_pipelined_s=pipe_p, decode_pipelined_s=pipe_d,
                              output_per_s_serial=serial, output_per_s=best, ttft_s=r["prefill_s"],
                              tpot_s=r["decode_s"], cut_edges=r["cut_edges"])
        elif name == "request-dist":
            runs_h = [runs.get(homo[g]) for g in p.replicas]
            if any(h is None or "error" in h for h in runs_h):
                rows[name] = dict(plan=name, applies=False, how="n/a: a replica's homo-* run is missing")
                continue
            tps = [_per_s(s.output_tokens, f, h["prefill_s"], h["decode_s"]) for h in runs_h]
            rows[name] = dict(base, how="derived: sum of homo-* replicas", output_per_s=sum(tps),
                              output_per_s_serial=sum(tps), ttft_s=max(h["prefill_s"] for h in runs_h),
                              tpot_s=max(h["decode_s"] for h in runs_h))
        elif name == "pd":
            a = next(iter(p.placements["prefill"].values()))
            b = next(iter(p.placements["decode"].values()))
            ha, hb = runs.get(homo[a]), runs.get(homo[b])
            if ha is None or hb is None or "error" in ha or "error" in hb:
                rows[name] = dict(plan=name, applies=False, how="n/a: a homo-* run is missing")
                continue
            t_kv = kv_handover_seconds(progs, a, b, s.repeats)
            cycle = max(ha["prefill_s"], f * hb["decode_s"], t_kv)
            rows[name] = dict(base, how=f"derived: prefill {specs[a].name}, decode {specs[b].name}, KV copy "
                              f"{t_kv * 1e3:.3g} ms", output_per_s=s.output_tokens / cycle,
                              output_per_s_serial=s.output_tokens / cycle, ttft_s=ha["prefill_s"] + t_kv,
                              tpot_s=hb["decode_s"])
        else:
            rows[name] = dict(plan=name, applies=False, how="n/a: not run")
    bound = s.output_tokens / bound_cycle if bound_cycle > 0 else math.nan
    best_base = max((r.get("output_per_s", math.nan) for n, r in rows.items() if n != "tessera" and r["applies"]),
                    default=math.nan)
    out = []
    for name in plans:
        r = rows[name]
        if r["applies"]:
            t = r["output_per_s"]
            r.update(output_per_s_per_price=t / r["price_per_hour"] if r["price_per_hour"] else math.nan,
                     vs_bound=t / bound, speedup_vs_best_baseline=t / best_base)
        out.append(MeasuredRow(**r))
    return out, bound


def measure_plans(s: MeasureSettings, progress: Any = None) -> tuple[list[MeasuredRow], dict]:
    """Build, compile, profile, plan, run and time every plan (see the module docstring).

    Args:
        s: the settings.
        progress: a tqdm-like bar (``update(n)``, ``set_description(str)``); :func:`total_steps` steps.

    Returns:
        ``(rows, meta)``; ``meta`` holds the bound, shapes, devices, prices, the measured cost tables' totals and
        how long each phase took.

    Raises:
        ConfigError: bad settings. DeviceUnavailableError: a device string that is not available here.
    """
    from torch_tessera.runtime.devices import parse_devices
    from torch_tessera.scheduler import Plan

    specs = parse_devices(s.devices)
    if len(specs) < 2:
        raise ConfigError(f"--measure compares plans over several devices; got {s.devices!r}")
    on_cuda = all(sp.is_gpu for sp in specs)
    if any(sp.is_gpu for sp in specs) != on_cuda:
        raise ConfigError("--measure needs all GPUs or all CPU virtual devices, not a mix")
    graphs = on_cuda if s.cuda_graphs is None else s.cuda_graphs
    home = f"cuda:{specs[0].index}" if on_cuda else "cpu"
    seconds: dict[str, float] = {}

    def step(desc: str, n: int = 1) -> None:
        if progress is not None:
            progress.set_description(desc)
            progress.update(n)

    t0 = time.perf_counter()
    progs = build_programs(s, home)
    for prog in progs:
        compile_program(prog, s.devices, graphs)
        step(f"compiled {prog.name}")
    seconds["build_compile"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    wl, topo, tables = measured_workload(progs, s, progress)
    seconds["profile"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plans, bound_cycle = make_plans(wl, topo, len(specs))
    step("planned")
    seconds["plan"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    runs: dict[str, dict] = {}
    from torch_tessera.errors import DeviceOutOfMemoryError

    for name, p in plans.items():
        if isinstance(p, Plan) and name not in ("request-dist", "pd"):
            try:
                runs[name] = run_plan(progs, p, s)
            except DeviceOutOfMemoryError as e:
                runs[name] = {"error": f"does not fit (at run time): {str(e)[:100]}"}
        step(f"ran {name}")
    rows, bound = compose_rows(progs, plans, runs, bound_cycle, s)
    seconds["run"] = time.perf_counter() - t0
    p_tok, batch, context = s.shape
    meta = {"model": s.model, "size": s.size, "layers": s.layers, "devices": [sp.name for sp in specs],
            "unit": "tokens", "output_tokens": s.output_tokens, "prefill_tokens": p_tok, "decode_batch": batch,
            "context": context, "cuda_graphs": graphs, "links": topo.source, "micro_batches": s.micro_batches,
            "zero_communication_bound_cycle_s": bound_cycle, "zero_communication_bound_output_per_s": bound,
            "measured_kernel_seconds": {n: [float(x) for x in t.seconds.sum(axis=0)] for n, t in tables.items()},
            "prices": {sp.name: (sp.price_per_hour, sp.price_source) for sp in specs}, "seconds": seconds,
            "settings": asdict(s), "timings_meaningful": on_cuda}
    return rows, meta


def total_steps(n_devices: int) -> int:
    """Progress steps :func:`measure_plans` reports: 2 compiles, 2 x devices profiles, 1 plan, one per plan."""
    from torch_tessera.benchmark import plan_names

    return 2 + 2 * n_devices + 1 + len(plan_names(n_devices))
