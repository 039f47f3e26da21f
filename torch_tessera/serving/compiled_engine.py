"""The real engine: a registry LLM compiled once with the tessera backend, served under each policy's placements.

``tessera serve-bench --engine real`` builds one :class:`CompiledModel` (weights, programs, profiles, plans) and,
per run, a light :class:`CompiledEngine` over it (:func:`make_compiled_engine`). What is built, once:

1. **Programs.** The model (random weights, seeded; fp32 on CPU, bf16 on CUDA) wrapped in
   :class:`~torch_tessera.serving.row_cache.RowCacheLM` (each cache row one request at its own positions): a prefill
   program of ``1 x prompt_tokens`` tokens and one decode program of ``bucket x 1`` tokens per batch bucket, each
   with its own cache of ``context`` positions per row; each compiled ONCE with the tessera backend
   (:func:`torch_tessera.measure.compile_program`, home placement).
2. **Plans.** Per bucket, both programs are profiled on every device
   (:func:`torch_tessera.measure.measured_workload`) and :func:`torch_tessera.scheduler.plan` places them for each
   policy (``tessera``: a ``"latency"`` and a ``"throughput"`` plan; a baseline: one plan ``"main"``). The prefill
   placement comes from the largest bucket's plan; each bucket's decode program gets its own plan's placement. An
   executor per (program, plan) is built up front (``runner.set_placement``), so a switch swaps executors.

Per step (the four calls of :class:`~torch_tessera.serving.engine.Engine`):

* ``prefill(batch)``: each request's prompt is ``batch.input_tokens[i]`` ids drawn from
  ``torch.Generator().manual_seed(request_id)``, right-padded to ``prompt_tokens`` (see ``row_cache`` for why the
  padding is never seen) and run through the prefill program, one request at a time; its first ``input_tokens``
  positions of K/V are copied out of the prefill cache and held; the first token is the greedy argmax at the last
  prompt position.
* ``decode(batch)``: each request gets a row of the bucket's cache (kept while it stays in that bucket); a request
  that comes from prefill or from another bucket has its K/V rows copied in first (so a change of bucket copies the
  live requests' caches: an honest cost of separate per-bucket caches). Padding rows run token 0 at position
  ``context - 1``, a slot that any live row writes before it reads it. Greedy argmax of each row's logits.
* Calls go to the program's current executor directly (the graph inputs recorded at compile time, with the new
  token ids and positions), with each cache buffer kept on the device whose launches write it under that plan
  (``PlacedExecutor.set_state_homes``): no executor copies a cache in or gathers it back per step (with the cache
  at home a homo-R decode moved the whole cache both ways per call, measured in the bench: 2 x 2.3 GB for 8 layers).
* ``switch_plan(plan)``: sets the plan's pre-built executors on every compiled program and moves each cache whose
  owner changes (the live rows, into one tensor kept per device, so captured graphs stay valid); on CPU virtual
  devices (one host memory) the tensors stay, only the pools that bind them change.
* ``release(ids)``: drops the requests' rows.

Step seconds are ``time.perf_counter`` around the step with the devices synchronised, so a run belongs on
:class:`~torch_tessera.serving.clock.WallClock`. Tokens do not depend on the plan: every plan computes what eager
computes (tests check it token for token against eager greedy decoding).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_tessera.errors import ConfigError, EngineProtocolError
from torch_tessera.serving.engine import DECODE, PREFILL, Batch, Engine, StepResult, check_batch

log = logging.getLogger(__name__)

#: Policies the compiled engine serves (``request-dist`` needs one engine per replica: not served here).
SERVED_POLICIES = ("homo-L", "homo-R", "pd", "af", "layer", "tessera")


def _plan_summary(p: Any, placement: Any) -> dict[str, Any]:
    """What the serving report keeps of one plan for one program: its prediction, cuts and kernels per device."""
    devs = [0] * len(p.devices)
    for d in (placement.values() if hasattr(placement, "values") else placement):
        devs[int(d)] += 1
    return {"policy": p.policy, "objective": p.objective, "predicted_seconds": p.predicted_seconds,
            "cycle_seconds": p.cycle_seconds, "latency_seconds": p.latency_seconds, "cut_edges": len(p.cut_edges),
            "launches_per_device": devs, "solver": str(getattr(p.solver, "method", p.solver))}


def plans_of(policy: str) -> tuple[str, ...]:
    """Plan names a real engine prepares for ``policy``: the monitored ``tessera`` has two, the baselines one."""
    return ("latency", "throughput") if policy == "tessera" else ("main",)


@dataclass(frozen=True)
class EngineSettings:
    """What :class:`CompiledModel` builds.

    Attributes:
        model: registry LLM with a KV cache (``llama``, ``moe``).
        devices: comma-separated device strings (``"cuda:0,cuda:1"``, ``"cpu:0,cpu:1"``), all GPUs or all CPU.
        buckets: decode batch sizes, ascending (one decode program each).
        policies: the policies to plan (see :data:`SERVED_POLICIES`).
        size: ``"tiny"`` or ``"full"``.
        layers: keep the first ``layers`` decoder layers (``None``: all).
        prompt_tokens: longest prompt, tokens (the prefill program's length).
        context: KV positions per request (prompt + output - 1 must fit).
        output_tokens: mean output tokens per request, for the planner's prefill/decode mix.
        profile_repeats / profile_warmup: timed / untimed runs per launch when profiling.
        cuda_graphs: capture CUDA graphs (``None``: when every device is a GPU).
    """

    model: str = "llama"
    devices: str = "cpu:0,cpu:1"
    buckets: tuple[int, ...] = (1, 2, 4)
    policies: tuple[str, ...] = SERVED_POLICIES
    size: str = "tiny"
    layers: int | None = None
    prompt_tokens: int = 16
    context: int = 32
    output_tokens: float = 8.0
    profile_repeats: int = 3
    profile_warmup: int = 1
    cuda_graphs: bool | None = None

    def __post_init__(self) -> None:
        from torch_tessera.static_cache import has_kv_cache

        if not has_kv_cache(self.model):  # UnsupportedModelError for an unknown name
            raise ConfigError(f"the compiled engine serves LLMs with a KV cache (llama, moe); {self.model!r} has "
                              "none: use --engine sim for it")
        b = tuple(int(x) for x in self.buckets)
        if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
            raise ConfigError(f"buckets={self.buckets} must be distinct positive batch sizes, ascending")
        object.__setattr__(self, "buckets", b)
        bad = sorted(set(self.policies) - set(SERVED_POLICIES))
        if bad:
            raise ConfigError(f"policies {bad} are not served by the compiled engine; served: {SERVED_POLICIES}")
        if not 1 <= self.prompt_tokens <= self.context:
            raise ConfigError(f"prompt_tokens={self.prompt_tokens} must be in 1..context={self.context}")


def _sync(devices: Sequence[Any]) -> None:
    for d in devices:
        if d.torch_device.type == "cuda":
            torch.cuda.synchronize(d.torch_device)


class CompiledModel:
    """Weights, compiled programs, profiles and every policy's executors (see the module docstring), built once.

    Args:
        s: the settings.

    Raises:
        ConfigError: fewer than two devices, or a mix of GPUs and CPU devices.
        UnsupportedModelError: an unknown model name.
        TesseraError: a program that Dynamo splits into several graphs.
    """

    def __init__(self, s: EngineSettings) -> None:
        from torch_tessera.measure import Compiled, compile_program
        from torch_tessera.models import build_module
        from torch_tessera.target.devices import parse_run_devices
        from torch_tessera.serving.row_cache import RowCacheLM

        specs, on_cuda, self.home = parse_run_devices(s.devices, "the compiled engine")
        self.settings = s
        graphs = on_cuda if s.cuda_graphs is None else s.cuda_graphs
        lm = build_module(s.model, s.size, device=self.home,
                          dtype=torch.bfloat16 if on_cuda else torch.float32).model.eval()
        if s.layers is not None:
            lm.model.layers = lm.model.layers[:s.layers]
            lm.config.num_hidden_layers = len(lm.model.layers)
        self.lm, self.vocab = lm, lm.config.vocab_size
        limit = 1 + len(s.buckets)  # one RowCacheLM.forward graph per program: Dynamo counts them as recompiles
        if torch._dynamo.config.recompile_limit < limit:
            torch._dynamo.config.recompile_limit = limit
        t0 = time.perf_counter()
        self.programs: dict[Any, Any] = {}  # "prefill" or bucket -> measure.Compiled
        for key, rows, tokens in (("prefill", 1, s.prompt_tokens), *((b, b, 1) for b in s.buckets)):
            module = RowCacheLM(lm, rows, s.context).eval()
            ids = torch.zeros(rows, tokens, dtype=torch.long, device=self.home)
            pos = torch.arange(tokens, device=self.home).expand(rows, tokens).contiguous()
            prog = Compiled("prefill" if key == "prefill" else "decode", module, (ids, pos), tokens)
            compile_program(prog, s.devices, graphs)
            self.programs[key] = prog
        self.compile_s = time.perf_counter() - t0
        self.devices = self.programs["prefill"].runner.devices
        t0 = time.perf_counter()
        self._index_state()
        self.executors = self._plan_all()
        self.plan_s = time.perf_counter() - t0
        log.info("compiled engine: %d programs compiled in %.1f s, plans and executors in %.1f s",
                 len(self.programs), self.compile_s, self.plan_s)

    def _plan_all(self) -> dict[tuple[str, str], dict[Any, Any]]:
        """(policy, plan name) -> program key -> executor, from measured costs per bucket."""
        from torch_tessera.measure import MeasureSettings, measured_workload
        from torch_tessera.measure.execute import PLAN_MICRO_BATCHES  # one call per step: each pays every cut once
        from torch_tessera.scheduler import plan

        s = self.settings
        pre = self.programs["prefill"]
        placements: dict[tuple[str, str], dict[Any, Any]] = {}
        for b in s.buckets:
            ms = MeasureSettings(model=s.model, devices=s.devices, size=s.size, prefill_tokens=s.prompt_tokens,
                                 decode_batch=b, context=s.context, output_tokens=s.output_tokens,
                                 profile_repeats=s.profile_repeats, profile_warmup=s.profile_warmup)
            wl, topo, _ = measured_workload([pre, self.programs[b]], ms)
            for policy in s.policies:
                for name in plans_of(policy):
                    how = name if policy == "tessera" else policy
                    p = plan(wl, None, topo, policy=how, cache_dir=False, micro_batches=PLAN_MICRO_BATCHES)
                    per = placements.setdefault((policy, name), {})
                    per[b] = (p.placements["decode"], p)
                    if b == s.buckets[-1]:
                        per["prefill"] = (p.placements["prefill"], p)
        self.plan_summaries = {f"{policy}/{name}": {str(k): _plan_summary(p, pl) for k, (pl, p) in per.items()}
                               for (policy, name), per in placements.items()}  # policy/plan -> program -> summary
        executors: dict[tuple[str, str], dict[Any, Any]] = {}
        shared: dict = {}  # one copy of each weight per device for every executor (the weights never change)
        for prog in self.programs.values():
            prog.runner.weight_cache = shared
        for key, per in placements.items():
            executors[key] = {}
            for prog_key, (placement, p) in per.items():
                runner = self.programs[prog_key].runner
                runner.set_placement(placement, p)
                ex = runner.executor
                if prog_key in self._direct:  # the cache lives where the plan's launches write it
                    homes = {n: d for n, d in ex.state_owners().items() if ex.domains[d] != ex.domains[ex.home]}
                    if homes:
                        ex.set_state_homes(homes)
                executors[key][prog_key] = ex
        return executors

    def _index_state(self) -> None:
        """Per program: where its graph inputs take the token ids, the positions and each STATE buffer (the
        row cache's K/V), so that calls go to the executor directly with the cache on the devices that own it.

        A program whose recorded inputs cannot be matched to its forward's arguments is called through Dynamo
        (state at home) instead, with a logged reason."""
        from torch_tessera.lowering.program import BufferKind, TensorArg

        self._direct: dict[Any, dict[str, Any]] = {}
        self._live: dict[Any, dict[str, torch.Tensor]] = {}  # program -> STATE buffer -> its tensor now
        self._per_device: dict[tuple[Any, str, str], torch.Tensor] = {}  # a tensor per (program, buffer, device)
        for key, prog in self.programs.items():
            program = prog.runner.program
            state, fwd = {}, []
            for k, (spec, v) in enumerate(zip(program.inputs, prog.args)):
                if not isinstance(spec, TensorArg) or not isinstance(v, torch.Tensor):
                    continue
                kind = program.buffers[spec.buffer].kind
                if kind == BufferKind.STATE:
                    state.setdefault(spec.buffer, (k, v))
                elif kind == BufferKind.INPUT:
                    fwd.append((k, v))
            pos = {j: k for j, x in enumerate(prog.inputs) for k, v in fwd if v.data_ptr() == x.data_ptr()}
            kv_names = [next((n for n, (_, v) in state.items() if v.data_ptr() == t.data_ptr()), None)
                        for t in prog.module.kv()]
            if len(pos) != len(prog.inputs) or None in kv_names:
                log.info("program %s: inputs not matched to its forward; called through Dynamo, cache at home", key)
                continue
            self._direct[key] = {"ids": pos[0], "pos": pos[1], "state": {n: k for n, (k, _) in state.items()},
                                 "kv": kv_names}
            self._live[key] = {n: v for n, (_, v) in state.items()}
            for n, (_, v) in state.items():
                self._per_device[(key, n, str(v.device))] = v

    def kv(self, key: Any) -> list[torch.Tensor]:
        """The live K/V tensors of program ``key`` (as ``RowCacheLM.kv()`` orders them), wherever they live now."""
        d = self._direct.get(key)
        if d is None:
            return self.programs[key].module.kv()
        return [self._live[key][n] for n in d["kv"]]

    def call(self, key: Any, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, tokens, vocab]`` of program ``key`` on token ids / positions ``[rows, tokens]``."""
        prog = self.programs[key]
        d = self._direct.get(key)
        if d is None:
            return prog.fn(ids.to(self.home), pos.to(self.home))
        args = list(prog.args)
        args[d["ids"]], args[d["pos"]] = ids.to(self.home), pos.to(self.home)
        for n, k in d["state"].items():
            args[k] = self._live[key][n]
        shape = (ids.shape[0], ids.shape[1], self.vocab)
        outs = [o for o in prog.runner.executor.run(args) if isinstance(o, torch.Tensor) and tuple(o.shape) == shape]
        if len(outs) != 1:
            raise EngineProtocolError(f"program {key}: expected one logits output of shape {shape}, got {len(outs)}")
        return outs[0]

    def _move_state(self) -> None:
        """Put every program's cache on the devices its current executor keeps it on (a plan switch may change
        them: the live rows are copied, into one tensor kept per device so that captured graphs stay valid)."""
        for key, live in self._live.items():
            ex = self.programs[key].runner.executor
            for n, t in live.items():
                dev = ex.devices[ex.input_pool_index(n)].torch_device
                if t.device == dev:
                    continue
                dst = self._per_device.get((key, n, str(dev)))
                if dst is None:
                    dst = self._per_device[(key, n, str(dev))] = torch.empty_like(t, device=dev)
                dst.copy_(t)
                live[n] = dst

    def use(self, policy: str, plan: str) -> None:
        """Make ``(policy, plan)``'s executors current on every compiled program.

        Raises:
            ConfigError: a plan that was not prepared.
        """
        per = self.executors.get((policy, plan))
        if per is None:
            raise ConfigError(f"plan {plan!r} of policy {policy!r} was not prepared; prepared: "
                              f"{sorted(self.executors)}")
        for key, executor in per.items():
            self.programs[key].runner.executor = executor
        self._move_state()
        _sync(self.devices)

    def prompt(self, request_id: int, tokens: int) -> torch.Tensor:
        """Prompt token ids of a request: ``tokens`` ids drawn from a generator seeded by the id, int64 ``[tokens]``."""
        g = torch.Generator().manual_seed(int(request_id))
        return torch.randint(0, self.vocab, (tokens,), generator=g)


class CompiledEngine:
    """An :class:`~torch_tessera.serving.engine.Engine` of one policy over a shared :class:`CompiledModel`.

    Args:
        model: the compiled model (built once, shared by every run and policy).
        policy: one of the model's planned policies.

    Raises:
        ConfigError: ``policy`` was not planned.
    """

    def __init__(self, model: CompiledModel, policy: str) -> None:
        if policy not in model.settings.policies:
            raise ConfigError(f"policy {policy!r} was not planned; planned: {model.settings.policies}")
        self.model, self.policy = model, policy
        self.plan = plans_of(policy)[0]
        self.switches = 0
        self._held: dict[int, list[torch.Tensor]] = {}  # request id -> its prompt K/V (after prefill)
        self._rows: dict[int, tuple[int, int]] = {}  # request id -> (bucket, row) holding its K/V
        self._next: dict[int, int] = {}  # live request id -> position its next step produces

    def switch_plan(self, plan: str) -> float:
        if plan not in plans_of(self.policy):
            raise ConfigError(f"policy {self.policy!r} has plans {plans_of(self.policy)}, not {plan!r}")
        t0 = time.perf_counter()
        self.model.use(self.policy, plan)
        if plan != self.plan:
            self.switches += 1
        self.plan = plan
        return time.perf_counter() - t0

    def prefill(self, batch: Batch) -> StepResult:
        self._check(batch, PREFILL)
        m, s = self.model, self.model.settings
        prog = m.programs["prefill"]
        _sync(m.devices)
        t0 = time.perf_counter()
        tokens = []
        for rid, n in zip(batch.request_ids, batch.input_tokens):
            if rid in self._next:
                raise EngineProtocolError(f"prefill: request {rid} was prefilled before")
            if n > s.prompt_tokens:
                raise ConfigError(f"request {rid}: prompt of {n} tokens exceeds the engine's prompt_tokens="
                                  f"{s.prompt_tokens}")
            ids = torch.zeros(1, s.prompt_tokens, dtype=torch.long)
            ids[0, :n] = m.prompt(rid, n)
            with torch.no_grad():
                logits = m.call("prefill", ids, prog.inputs[1])
            tokens.append(int(logits[0, n - 1].argmax()))
            self._held[rid] = [t[0, :, :n].clone() for t in m.kv("prefill")]
            self._next[rid] = 1
        _sync(m.devices)
        return StepResult(tuple(tokens), time.perf_counter() - t0)

    def decode(self, batch: Batch) -> StepResult:
        self._check(batch, DECODE)
        m, s = self.model, self.model.settings
        if batch.bucket not in m.programs:
            raise ConfigError(f"decode bucket {batch.bucket} has no program; the engine's buckets: {s.buckets}")
        for rid, pos in zip(batch.request_ids, batch.positions):
            if self._next.get(rid) != pos:
                raise EngineProtocolError(f"decode: request {rid} asked for token {pos}, expected "
                                          f"{self._next.get(rid, 'none (not prefilled or released)')}")
        _sync(m.devices)
        t0 = time.perf_counter()
        rows = self._place(batch)
        ids = torch.zeros(batch.bucket, 1, dtype=torch.long)
        pos = torch.full((batch.bucket, 1), s.context - 1, dtype=torch.long)  # padding rows: see module docstring
        for row, n, k, last in zip(rows, batch.input_tokens, batch.positions, batch.last_tokens):
            if n + k - 1 >= s.context:
                raise ConfigError(f"decode: position {n + k - 1} is beyond the engine's context={s.context}")
            ids[row, 0], pos[row, 0] = last, n + k - 1
        with torch.no_grad():
            logits = m.call(batch.bucket, ids, pos)
        tokens = tuple(int(logits[row, 0].argmax()) for row in rows)
        for rid in batch.request_ids:
            self._next[rid] += 1
        _sync(m.devices)
        return StepResult(tokens, time.perf_counter() - t0)

    def release(self, request_ids: Sequence[int]) -> None:
        for rid in request_ids:
            if self._next.pop(rid, None) is None:
                raise EngineProtocolError(f"release: request {rid} is not live")
            self._held.pop(rid, None)
            self._rows.pop(rid, None)

    def _place(self, batch: Batch) -> list[int]:
        """Rows of ``batch``'s requests in its bucket's cache, copying in the K/V of requests that are elsewhere."""
        b = batch.bucket
        kv = self.model.kv(b)
        taken = {row for bb, row in self._rows.values() if bb == b}
        free = [r for r in range(b) if r not in taken]
        moves = []
        for rid in batch.request_ids:
            where = self._rows.get(rid)
            if where is not None and where[0] == b:
                continue
            if not free:
                raise EngineProtocolError(f"decode: no free row in bucket {b} for request {rid}; live requests "
                                          "must all be in every decode step")
            row = free.pop(0)
            if rid in self._held:
                src = self._held.pop(rid)
            else:  # from another bucket's cache: read it before any row of this step is written
                bb, rr = where
                src = [t[rr].clone() for t in self.model.kv(bb)]
            moves.append((rid, row, src))
        for rid, row, src in moves:
            for dst, t in zip(kv, src):
                dst[row, :, :t.shape[1]].copy_(t)
            self._rows[rid] = (b, row)
        return [self._rows[rid][1] for rid in batch.request_ids]

    def _check(self, batch: Batch, kind: str) -> None:
        check_batch(batch, kind, self.plan)


def make_compiled_engine(model: str | CompiledModel, devices: Sequence[str], policy: str,
                         buckets: Sequence[int], **settings: Any) -> Engine:
    """The real engine of ``policy`` for ``model`` on ``devices`` (see the module docstring).

    Args:
        model: a registry model name (a :class:`CompiledModel` is then built: minutes on CPU) or a built
            :class:`CompiledModel` to share (its devices and buckets must match).
        devices: device strings, e.g. ``("cuda:0", "cuda:1")``.
        policy: one of :data:`SERVED_POLICIES`; ``"tessera"`` prepares a ``"latency"`` and a ``"throughput"``
            plan, the others one plan named ``"main"``.
        buckets: the decode batch sizes, ascending.
        settings: further :class:`EngineSettings` fields (``size``, ``prompt_tokens``, ``context``...).

    Raises:
        ConfigError: bad settings, a model without a KV cache, a policy not served, a shared model built for other
            devices or buckets. UnsupportedModelError: an unknown model name.
    """
    if isinstance(model, CompiledModel):
        s = model.settings
        if tuple(buckets) != s.buckets or ",".join(devices) != s.devices:
            raise ConfigError(f"the shared compiled model was built for devices {s.devices!r} and buckets "
                              f"{s.buckets}, not {','.join(devices)!r} and {tuple(buckets)}")
        return CompiledEngine(model, policy)
    s = EngineSettings(model=model, devices=",".join(devices), buckets=tuple(buckets),
                       policies=settings.pop("policies", (policy,)), **settings)
    return CompiledEngine(CompiledModel(s), policy)
