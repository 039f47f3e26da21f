"""The multi-device executor: runs a :class:`KernelProgram` with every launch on the device a placement gives it.

Per device: a buffer pool (its own storages; the caller's device binds the caller's tensors), kernels loaded for that
device, and a compute stream. Every cut edge is a copy of exactly the bytes the consumer needs, on a copy stream per
link, ordered by CUDA events: the producer's stream records an event, the copy stream waits on it, the consumer's
stream waits on the copy's event. Sources of in-flight copies are protected from early reuse with
``Tensor.record_stream``. On CPU virtual devices the same steps run synchronously, with real copies between separate
pools; fresh allocations are filled with NaN bytes there, so a missing copy shows up as a wrong value.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Mapping, Sequence

import torch
from torch.utils._pytree import tree_flatten

from torch_tessera.errors import DeviceOutOfMemoryError, TesseraError, TransferTimeout
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import BufferKind, ExternLaunch, KernelProgram, TensorArg
from torch_tessera.runtime.executor import (
    BufferPool,
    KernelLauncher,
    bind_input,
    fresh_extern_outputs,
    launch_buffers,
)
from torch_tessera.runtime.pipelining import PRIORITY_CLASSES
from torch_tessera.runtime.schedule import (
    STATIC_INPUTS,
    copy_hazards,
    CopyStep,
    LaunchStep,
    Schedule,
    SyncStep,
    build_schedule,
    state_owners,
)

log = logging.getLogger(__name__)

#: Byte a CPU virtual device fills fresh allocations with (0xFF bytes read as NaN in every float dtype).
POISON = 0xFF


#: where a copy inside one CUDA graph over the devices runs (see PlacedExecutor's ``graph_copies``)
from torch_tessera.options import GRAPH_COPIES  # noqa: E402  (the home is options)

#: seconds a call busy-polls its completion event before polling with sleeps (which oversleep by tens of us)
SPIN_S = 0.05


def tensor_key(t: torch.Tensor) -> tuple:
    """``(data_ptr(), _version)`` of ``t``: equal keys mean the caller passes the same tensor, not modified since by
    in-place torch ops on it or on a tensor sharing its version counter (its views made by view ops, ``detach()``).

    Writes that bypass that counter leave the key unchanged: through ``t.data`` (a tensor with a counter of its own),
    numpy or DLPack aliases of the storage, custom kernels writing it. With ``static_inputs="place"`` such a write
    leaves a placed copy stale (see :class:`PlacedExecutor`; ``static_inputs="copy"`` copies every call).

    An inference tensor (made under ``torch.inference_mode``) has no version counter: its key is
    ``(data_ptr(), None)``, which :meth:`PlacedExecutor.stale_static` always treats as stale (placed again every
    call, as the per-call copy would).
    """
    if t.is_inference():
        return (t.data_ptr(), None)
    return (t.data_ptr(), t._version)


def input_positions(program: KernelProgram, names: Any) -> tuple[tuple[int, str], ...]:
    """``(input index, buffer)`` of every graph input of ``program`` bound to one of the buffers ``names``."""
    return tuple((i, a.buffer) for i, a in enumerate(program.inputs) if isinstance(a, TensorArg) and a.buffer in names)


def static_input_keys(positions: Sequence[tuple[int, str]], inputs: Sequence[Any]) -> dict[str, tuple]:
    """Static INPUT buffer -> :func:`tensor_key` of each caller tensor bound to it (in input order), at
    ``positions`` (:func:`input_positions`): what a placed copy of it was made from. A few attribute reads per static
    input: cheap enough for every call of a replayed graph."""
    out: dict[str, tuple] = {}
    for i, name in positions:
        if isinstance(inputs[i], torch.Tensor):
            out[name] = out.get(name, ()) + (tensor_key(inputs[i]),)
    return out


class PlacedExecutor:
    """Runs a program across devices according to a placement, computing what one device would.

    Args:
        program: the kernel program.
        dag: its dependency DAG (from :func:`torch_tessera.graph.build_dependency_graph`).
        placement: launch index -> index into ``devices``.
        devices: runtime devices (:func:`torch_tessera.target.devices.open_device`); ``devices[home]`` must be where
            the caller's tensors live.
        kernel_objects: live kernel objects from lowering, usable on the home device.
        home: index of the caller's device.
        timeout_s: seconds to wait for a call's transfers before raising :class:`TransferTimeout`.
        memory_estimate: bytes per device the plan predicted (reported if a device runs out of memory).
        cuda_graphs: replay CUDA graphs (CUDA devices only). ``True`` / ``"whole"``: the whole schedule as ONE graph
            spanning the devices, copies inside it as memcpy nodes (one launch per call); if CUDA refuses that
            capture, one graph per segment. ``"segments"``: one graph per device's run of consecutive launches, the
            copies between them issued eagerly. See :mod:`torch_tessera.runtime.graphs`.
        graph_copies: where a copy inside one graph over the devices runs: ``"link"`` (default) on the link's own
            copy stream, ``"producer"`` on the producing device's stream (no copy stream, one event fewer per hop;
            see :func:`torch_tessera.runtime.graphs.order_copy`), ``"push"`` as a copy kernel on the producing GPU
            writing the consumer's memory over peer access, for cut edges of at most
            :data:`~torch_tessera.runtime.push.PUSH_MAX_BYTES` between GPUs with peer access (other copies as with
            ``"link"``; :mod:`torch_tessera.runtime.push`). Only with ``cuda_graphs`` ``True`` / ``"whole"``.
        priority_class: stream priority of this program's compute streams and pipeline lanes when programs share
            devices (:data:`~torch_tessera.runtime.pipelining.PRIORITY_CLASSES`: ``"normal"``, ``"urgent"`` for
            the per-token program, ``"background"`` for bulk work); a CUDA graph replays at its stream's priority.
        weight_cache: a dict shared by executors whose weights never change (a serving process's programs and plans
            over one model): a weight another executor already placed on a device is reused there, not copied
            again (:meth:`_place_weight`). ``None`` (default): every executor holds its own copies.
        static_inputs: ``"place"`` (default) or ``"copy"``: how static INPUTs reach other devices (below).

    Static INPUTs (``KernelProgram.static_inputs``, module buffers such as the MMDiT's 453 MB ``pos_embed``) read on
    another device are, with ``static_inputs="place"``, placed there once, like weights (setup steps of purpose
    ``"static"``, :func:`~torch_tessera.runtime.schedule.build_schedule`), and placed again, into the same storage,
    before a call whose tensor for one has another ``data_ptr()`` or ``_version`` than at its last placement
    (:func:`tensor_key`). The contract: a caller that changes a module buffer in place between calls does it with
    ordinary tensor ops (``buf.add_(1)``, ``buf.copy_(new)``), which bump ``_version``. A write that does not
    (through ``buf.data``, a numpy or DLPack alias, a custom kernel) is not seen and the other devices compute with
    the old bytes, silently: such callers need ``static_inputs="copy"``, which copies static INPUTs every call like
    any other input. An inference tensor (``torch.inference_mode``) has no ``_version``: it is placed again every
    call (with CUDA graphs between two host synchronisations: use ``"copy"`` there).

    Attributes:
        transfers: count of copies performed, by purpose (``cut``, ``input``, ``weights``, ``static``, ``gather``); a
            cut edge whose bytes span several ranges counts once per range. ``static`` copies happen at the first
            call and again only when the caller changed a static input (every call for an inference tensor); with
            ``static_inputs="copy"`` static INPUTs count as ``input``.
        cut_edges_transferred: distinct cut edges whose bytes were copied in the last call.
        bytes_moved: bytes copied, by purpose.
        launches_executed: launches run since construction.
    """

    def __init__(
        self,
        program: KernelProgram,
        dag: DependencyGraph,
        placement: Mapping[int, int],
        devices: Sequence[Any],
        kernel_objects: Mapping[str, Any] | None = None,
        home: int = 0,
        timeout_s: float = 60.0,
        memory_estimate: Sequence[int] | None = None,
        cuda_graphs: bool | str = False,
        graph_copies: str = "link",
        priority_class: str = "normal",
        weight_cache: dict | None = None,
        static_inputs: str = "place",
    ) -> None:
        if static_inputs not in STATIC_INPUTS:
            raise TesseraError(f"static_inputs={static_inputs!r}: use one of {STATIC_INPUTS}")
        self.static_inputs = static_inputs
        self.program = program
        self.devices = list(devices)
        bad = sorted({d for d in placement.values() if not 0 <= d < len(self.devices)})
        if bad:
            raise ValueError(f"placement uses device indices {bad}, but only {len(self.devices)} devices were given")
        self.home = home
        self.timeout_s = timeout_s
        self.memory_estimate = list(memory_estimate) if memory_estimate is not None else None
        # devices that share memory (SM partitions of one GPU) share one buffer pool; CPU virtual devices never do
        keys = [str(d.torch_device) if d.torch_device.type == "cuda" else f"virtual{i}" for i, d in enumerate(devices)]
        self.domains = [keys.index(k) for k in keys]
        self.dag = dag
        self.state_homes: dict[str, int] = {}
        self.schedule: Schedule = build_schedule(program, dag, placement, home, self.domains,
                                                 static_inputs=static_inputs)
        self.transfers: Counter[str] = Counter()
        self.bytes_moved: Counter[str] = Counter()
        self.launches_executed = 0
        self.calls = 0
        self.cut_edges_transferred = 0
        self._fresh = fresh_extern_outputs(program)
        self._is_cuda = [d.torch_device.type == "cuda" for d in self.devices]
        home_dev = self.devices[home].torch_device
        self.launchers = [
            KernelLauncher(program, kernel_objects if d.torch_device == home_dev else None, d.torch_device)
            for d in self.devices
        ]
        self.streams = [d.default_stream if c else None for d, c in zip(self.devices, self._is_cuda)]
        self._copy_streams: dict[tuple[int, int], Any] = {}
        self._weights: list[BufferPool] = self.make_pools()  # weights and static INPUTs placed off their home
        self._setup_done = False
        self._static_placed: dict[str, tuple] = {}  # static INPUT -> static_input_keys of what ``_weights`` holds
        self._edges_this_call = set()
        self._derive_from_schedule()
        if cuda_graphs and not all(self._is_cuda):
            raise TesseraError("cuda_graphs=True needs every device to be a CUDA device")
        if cuda_graphs not in (False, True, "whole", "segments"):
            raise TesseraError(f"cuda_graphs={cuda_graphs!r}: use False, True (= 'whole'), 'whole' or 'segments'")
        self.cuda_graphs = bool(cuda_graphs)
        # "whole": one graph over every device with the copies inside (falls back to "segments" where CUDA refuses)
        self.graph_mode = "segments" if cuda_graphs == "segments" else "whole"
        if graph_copies not in GRAPH_COPIES:
            raise TesseraError(f"graph_copies={graph_copies!r}: use one of {GRAPH_COPIES}")
        self.graph_copies = graph_copies
        if priority_class not in PRIORITY_CLASSES:
            raise TesseraError(f"priority_class={priority_class!r}: use one of {PRIORITY_CLASSES}")
        self.priority_class = priority_class
        self.weight_cache = weight_cache
        self.captures = 0
        self._graphs: Any = None

    # -- resident state ---------------------------------------------------------------------------------------------
    def state_owners(self) -> dict[str, int]:
        """STATE input buffer -> index of the device it belongs on under this placement (where its writers run; see
        :func:`torch_tessera.runtime.schedule.state_owners`)."""
        return state_owners(self.program, self.dag, self.schedule.placement, self.home)

    def set_state_homes(self, homes: Mapping[str, int]) -> None:
        """Declare that the caller keeps each named STATE buffer (KV cache, SSM state) on device ``homes[name]``
        (an index into ``devices``) instead of the home device, and passes it there from the next call on.

        State kept on its owner (:meth:`state_owners`) is neither copied in nor gathered back: the per-call
        transfers the plan's throughput model assumes do not exist (measured 2026-11-29 on two H200s: a homo-R decode
        with the KV cache on GPU 0 copied 2.3 GB in and out per call, 8 layers). Each call checks that the tensors
        passed for these buffers live on the declared devices (CUDA; CPU virtual devices cannot be told apart).

        Raises:
            TesseraError: a name that is not a STATE input of the program, a device index out of range, or a STATE
                buffer that is also a program output (its bytes must come back to the home device).
        """
        states = {a.buffer for a in self.program.inputs
                  if isinstance(a, TensorArg) and self.program.buffers[a.buffer].kind == BufferKind.STATE}
        unknown = sorted(set(homes) - states)
        if unknown:
            raise TesseraError(f"set_state_homes: {unknown[:5]} are not STATE inputs of this program "
                               f"(its STATE inputs: {sorted(states)[:8]})")
        bad = {n: d for n, d in homes.items() if not 0 <= d < len(self.devices)}
        if bad:
            raise TesseraError(f"set_state_homes: device indices {bad} out of range for {len(self.devices)} devices")
        outputs = {o.buffer for o in self.program.outputs if isinstance(o, TensorArg)}
        clash = sorted(n for n, d in homes.items() if n in outputs and self.domains[d] != self.domains[self.home])
        if clash:
            raise TesseraError(f"set_state_homes: {clash} are also outputs of the program; they must stay on the "
                               f"home device {self.devices[self.home].name}")
        self.state_homes = {n: d for n, d in homes.items() if self.domains[d] != self.domains[self.home]}
        self.schedule = build_schedule(self.program, self.dag, self.schedule.placement, self.home, self.domains,
                                       self.state_homes, self.static_inputs)
        self._derive_from_schedule()
        self._graphs = None  # captured graphs bake the old copies in
        self.__dict__.pop("_pipeline_plan", None)
        log.info("state kept on its devices: %s", {n: self.devices[d].name for n, d in self.state_homes.items()})

    def _derive_from_schedule(self) -> None:
        self._free_after = self._last_uses()
        self._static_names = frozenset(s.buffer for s in self.schedule.setup if s.purpose == "static")
        self._static_at = input_positions(self.program, self._static_names)
        hazards = copy_hazards(self.schedule, self.dag, self.domains)
        self._copy_waits = {id(self.schedule.steps[i]): h for i, h in hazards.items()}  # see copy_hazards

    def input_pool_index(self, buffer: str) -> int:
        """Index of the device whose pool binds the caller's tensor for input ``buffer``."""
        return self.state_homes.get(buffer, self.home)

    def check_state_devices(self, inputs: Sequence[Any]) -> None:
        """Raise :class:`TesseraError` if a tensor passed for a STATE buffer kept off the home device lives
        elsewhere than :meth:`set_state_homes` declared (CUDA devices only)."""
        if not self.state_homes:
            return
        for i, (spec, value) in enumerate(zip(self.program.inputs, inputs)):
            if isinstance(spec, TensorArg) and spec.buffer in self.state_homes and isinstance(value, torch.Tensor):
                want = self.devices[self.state_homes[spec.buffer]].torch_device
                if want.type == "cuda" and value.device != want:
                    raise TesseraError(f"input {i} ({spec.buffer}) is on {value.device}, but set_state_homes "
                                       f"declared it lives on {want}")

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def make_pools(self) -> list[BufferPool]:
        """One pool per device; devices of one memory domain share the same pool object."""
        by_domain: dict[int, BufferPool] = {}
        return [by_domain.setdefault(dom, BufferPool(d.torch_device)) for d, dom in zip(self.devices, self.domains)]

    def _last_uses(self) -> dict[int, list[tuple[int, str]]]:
        """Step index after which each (device, temporary buffer) is no longer needed.

        Buffers of a memory domain shared by several devices (streams) are kept to the end of the call: freeing one
        while another stream may still use it would let the allocator hand its memory out again.
        """
        shared = {dom for dom in self.domains if self.domains.count(dom) > 1}
        last: dict[tuple[int, str], int] = {}
        temps = {b.name for b in self.program.buffers.values() if b.kind == BufferKind.TEMP}
        outputs = {o.buffer for o in self.program.outputs if isinstance(o, TensorArg)}
        for i, step in enumerate(self.schedule.steps):
            if isinstance(step, LaunchStep):
                for b in launch_buffers(self.program.launches[step.launch]):
                    last[(step.device, b)] = i
            elif isinstance(step, CopyStep):
                last[(step.src, step.buffer)] = i
                last[(step.dst, step.buffer)] = i
        out: dict[int, list[tuple[int, str]]] = {}
        for (dev, b), i in last.items():
            if b in temps and not (dev == self.home and b in outputs) and self.domains[dev] not in shared:
                out.setdefault(i, []).append((dev, b))
        return out

    def _copy_stream(self, src: int, dst: int) -> Any:
        key = (src, dst)
        if key not in self._copy_streams:
            dev = self.devices[dst] if self._is_cuda[dst] else self.devices[src]
            self._copy_streams[key] = dev.new_stream(priority=-1)
        return self._copy_streams[key]

    # -- execution -------------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> list:
        inputs = list(args)
        if isinstance(args, list):
            args.clear()
        return self.run(inputs)

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the program on ``inputs`` (graph inputs, in order, on the home device) and return its outputs."""
        program = self.program
        if len(inputs) != len(program.inputs):
            raise TesseraError(f"program expects {len(program.inputs)} inputs, got {len(inputs)}")
        if self.cuda_graphs:  # joins the caller's stream itself (only the home device's: inputs live there)
            from torch_tessera.runtime.graphs import run_with_graphs

            return run_with_graphs(self, inputs)
        self._join_caller()
        pools = self._bind_call(inputs)
        home_pool = pools[self.home]
        events: list[tuple[CopyStep, Any]] = []
        self._edges_this_call: set = set()
        for i, step in enumerate(self.schedule.steps):
            if isinstance(step, LaunchStep):
                self._launch(step, pools)
            elif isinstance(step, SyncStep):
                self._sync(step)
            else:
                ev = self._copy(step, pools)
                if ev is not None:
                    events.append((step, ev))
            for dev, b in self._free_after.get(i, ()):
                pools[dev].free(b)
        self._wait(events)
        self.cut_edges_transferred = len(self._edges_this_call)  # only cut copies carry an edge
        for o in program.outputs:
            if isinstance(o, TensorArg) and o.buffer not in home_pool:
                self._ensure(home_pool, self.home, o.buffer)
        self.calls += 1
        return [home_pool.view(o) if isinstance(o, TensorArg) else o.value for o in program.outputs]

    def run_pipelined(self, batches: Sequence[Sequence[Any]], slots: int = 2) -> list[list]:
        """Run independent micro-batches through the program concurrently; see :mod:`torch_tessera.runtime.pipelining`.

        Args:
            batches: one input list per micro-batch (graph inputs in order, on the home device, as for :meth:`run`);
                weights (PARAMETER inputs) and, with ``static_inputs="place"``, static INPUTs (module buffers) must
                be the same tensors in every micro-batch: the micro-batches share one placed copy of each, placed
                (again) before the run's first wave.
            slots: micro-batches in flight at once (each with its own streams and buffers); 1 = no pipelining.

        Returns:
            the outputs of each micro-batch, in order, equal to what :meth:`run` returns for its inputs.

        Raises:
            TesseraError: wrong inputs, micro-batches with different weights or static inputs, or ``slots < 1``.
            TransferTimeout: a transfer did not complete within ``timeout_s``.
        """
        from torch_tessera.runtime.pipelining import run_pipelined

        return run_pipelined(self, batches, slots)

    def stale_static(self, inputs: Sequence[Any], placed: Mapping[str, tuple]) -> set[str]:
        """Static INPUT buffers with setup copies whose caller tensors in ``inputs`` differ from ``placed`` (their
        :func:`static_input_keys` at the last placement): moved, modified in place, never placed, or inference
        tensors (no version counter: always stale)."""
        if not self._static_at:
            return set()
        now = static_input_keys(self._static_at, inputs)
        return {b for b in self._static_names
                if now.get(b) != placed.get(b) or any(v is None for _, v in now.get(b, ()))}

    def _bind_call(self, inputs: Sequence[Any], place: bool = True) -> list[BufferPool]:
        """Fresh pools for one call: weights and static INPUTs placed on their devices (copied at the first call; a
        static INPUT again, into the same storage, when :meth:`stale_static` names it), inputs bound.

        A re-placement's copy runs on the executor's streams like the first call's, after the caller's stream
        (:meth:`_join_caller`, which :meth:`run` calls first) and before the launches that read it; every earlier
        call has finished on the host (:meth:`_wait`), so no launch still reads the storage it overwrites.

        Args:
            inputs: the call's graph inputs, in order.
            place: place (or place again) weights and static INPUTs. ``False``: the caller did, for these inputs
                (a pipelined run's micro-batches, placed once before the first wave while no slot reads them: one
                micro-batch must not copy into a storage another one's launches may be reading).
        """
        program = self.program
        pools = self.make_pools()
        for p, w in zip(pools, self._weights):
            p.storages.update(w.storages)
        self.check_state_devices(inputs)
        for i, (spec, value) in enumerate(zip(program.inputs, inputs)):
            pool = pools[self.input_pool_index(spec.buffer)] if isinstance(spec, TensorArg) else None
            if pool is not None and spec.buffer not in pool:
                bind_input(pool, spec, value, i)
        if place:
            self._place_setup(inputs, pools)
        return pools

    def _place_setup(self, inputs: Sequence[Any], pools: list[BufferPool]) -> None:
        """At the first call, every setup step (weights and static INPUTs onto their devices); later, the steps of
        the static INPUTs :meth:`stale_static` names; each into ``pools`` and kept in ``_weights``."""
        stale = self.stale_static(inputs, self._static_placed)
        if self._setup_done and not stale:
            return
        for step in self.schedule.setup:
            if self._setup_done and step.buffer not in stale:
                continue
            self._place_weight(step, pools)
            self._weights[step.dst].storages[step.buffer] = pools[step.dst].storages[step.buffer]
        self._static_placed = static_input_keys(self._static_at, inputs)
        if self.weight_cache is not None and not self._setup_done:  # other executors' streams read these
            for d, c in zip(self.devices, self._is_cuda):
                if c:
                    d.synchronize()
        if stale:
            log.debug("static inputs placed%s: %s", " again" if self._setup_done else "", sorted(stale))
        self._setup_done = True

    def _place_weight(self, step: CopyStep, pools: list[BufferPool]) -> None:
        """Run one setup copy (a weight's bytes ``[start, end)`` onto ``step.dst``), or, with a ``weight_cache``,
        reuse the storage another executor placed for the same source tensor on the same device, copying only the
        byte ranges it does not hold yet. Keyed by the source storage's address and size and the destination
        device: valid while the source weights are alive and unchanged, which is what passing a cache promises.
        Static INPUT steps (purpose ``"static"``) never use the cache: the caller may change their contents, and a
        storage shared with another executor would then change under it.

        Measured 2026-11-30 on two H200s (serve-bench, Llama-3.1-8B, 32 layers): without sharing, each (policy,
        plan, program) executor held its own copy of the weights on the 24-SM GPU and the sweep ran out of memory
        there after nine runs (148.3 GB in use).
        """
        if self.weight_cache is None or step.purpose != "weights":
            self._copy(step, pools)
            return
        src = pools[step.src].storages[step.buffer]
        # the torch device, not the runtime device: SM partitions of one GPU share its memory, and so the copy
        key = (src.data_ptr(), src.numel() * src.element_size(), str(self.devices[step.dst].torch_device))
        held = self.weight_cache.get(key)
        if held is not None:
            pools[step.dst].storages[step.buffer] = held[0]
            if (step.start, step.end) in held[1]:
                return
        self._copy(step, pools)
        if held is None:
            held = self.weight_cache[key] = (pools[step.dst].storages[step.buffer], set())
        held[1].add((step.start, step.end))

    def _ensure(self, pool: BufferPool, dev: int, name: str) -> None:
        if name in pool:
            return
        nbytes = self.program.buffers[name].nbytes
        try:
            pool.allocate(name, nbytes)
        except torch.OutOfMemoryError as e:
            raise self._oom(dev, nbytes) from e
        if not self._is_cuda[dev]:
            pool.storages[name].fill_(POISON)

    def _oom(self, dev: int, nbytes: int) -> DeviceOutOfMemoryError:
        d = self.devices[dev]
        used = torch.cuda.memory_allocated(d.torch_device) if self._is_cuda[dev] else 0
        est = f"{self.memory_estimate[dev] / 1e9:.2f} GB" if self.memory_estimate else "no estimate"
        return DeviceOutOfMemoryError(
            f"device {d.name} ran out of memory allocating {nbytes / 1e9:.3f} GB: the plan estimated {est}, "
            f"{used / 1e9:.2f} GB were in use"
        )

    def _launch(self, step: LaunchStep, pools: list[BufferPool], lane: Any = None) -> None:
        """Run one launch on its device's stream (``lane``'s stream for that device when given: a pipeline slot,
        whose buffers are then allocated on that stream too)."""
        launch = self.program.launches[step.launch]
        pool = pools[step.device]
        stream = self.streams[step.device] if lane is None else lane.streams[step.device]
        with _stream_ctx(None if lane is None else stream):
            for b in launch_buffers(launch):
                if b not in self._fresh.get(launch.index, ()):
                    self._ensure(pool, step.device, b)
        dev = self.devices[step.device]
        with dev.guard(), _stream_ctx(stream):
            try:
                result = self.launchers[step.device].launch(launch, pool, stream)
            except torch.OutOfMemoryError as e:
                raise self._oom(step.device, 0) from e
        if isinstance(launch, ExternLaunch) and launch.index in self._fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in self._fresh[launch.index]:  # rebound every run (graph capture allocates anew)
                    pool.bind(spec.buffer, t)
        self.launches_executed += 1

    def _join_caller(self) -> None:
        """Every device stream waits for the caller's current stream: the inputs (token ids, a KV cache the caller
        just wrote) may still be in flight there."""
        for dev, stream in zip(self.devices, self.streams):
            if stream is not None and dev.torch_device.type == "cuda":
                caller = torch.cuda.current_stream(dev.torch_device)
                if stream is not caller and stream.cuda_stream != caller.cuda_stream:
                    stream.wait_stream(caller)

    def _sync(self, step: SyncStep, lane: Any = None) -> None:
        """Order device ``dst``'s stream after the work queued on device ``src``'s stream (shared memory); the
        streams of pipeline slot ``lane`` when given."""
        streams = self.streams if lane is None else lane.streams
        src, dst = streams[step.src], streams[step.dst]
        if src is not None and dst is not None and src is not dst:
            dst.wait_stream(src)

    def _copy(self, step: CopyStep, pools: list[BufferPool], lane: Any = None, edges: set | None = None,
              push: bool = False) -> Any:
        """Copy one step's bytes; returns the copy's CUDA event (None on CPU, and for a push).

        With ``lane`` (a pipeline slot) the copy runs on the slot's copy stream for the link, ordered after and
        before the slot's compute streams, and the destination is allocated on the slot's consumer stream; the cut
        edge is counted in ``edges`` (default: this call's set). With ``push`` (the warm-up pass of a
        ``graph_copies="push"`` capture, whose static pools free nothing) the copy kernel runs on the producer's
        stream instead (:func:`torch_tessera.runtime.push.push_on_producer`).
        """
        src_pool, dst_pool = pools[step.src], pools[step.dst]
        if step.buffer not in src_pool:
            raise TesseraError(
                f"{step.purpose} copy of {step.buffer}[{step.start}:{step.end}] from {self.devices[step.src].name}: "
                f"the buffer does not exist there (edge {step.edge}); the schedule is inconsistent"
            )
        streams = self.streams if lane is None else lane.streams
        with _stream_ctx(None if lane is None else streams[step.dst]):
            self._ensure(dst_pool, step.dst, step.buffer)
        src = src_pool.storages[step.buffer][step.start:step.end]
        dst = dst_pool.storages[step.buffer][step.start:step.end]
        self._count_copy(step, edges)
        if push:
            from torch_tessera.runtime.push import push_on_producer

            push_on_producer(self.devices[step.src], src, dst, streams[step.src], streams[step.dst],
                              self._copy_waits.get(id(step), (False, False)))
            return None
        if not (self._is_cuda[step.src] or self._is_cuda[step.dst]):
            dst.copy_(src)
            return None
        copy_stream = self._copy_stream(step.src, step.dst) if lane is None else lane.copy_stream(step.src, step.dst)
        src_stream, dst_stream = streams[step.src], streams[step.dst]
        wait_dst, src_waits = self._copy_waits.get(id(step), (False, False))
        if src_stream is not None:
            copy_stream.wait_stream(src_stream)
        if wait_dst and dst_stream is not None:
            copy_stream.wait_stream(dst_stream)
        with _stream_ctx(copy_stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(copy_stream)
        src.record_stream(copy_stream)
        dst.record_stream(copy_stream)
        if dst_stream is not None:
            dst_stream.wait_event(done)
        if src_waits and src_stream is not None:
            src_stream.wait_event(done)
        return done

    def _count_copy(self, step: CopyStep, edges: set | None = None) -> None:
        """Count one copy step in ``transfers`` / ``bytes_moved`` and its cut edge in ``edges`` (default: this
        call's set)."""
        self.transfers[step.purpose] += 1
        if step.edge is not None:
            (self._edges_this_call if edges is None else edges).add(step.edge)
        self.bytes_moved[step.purpose] += step.nbytes

    def _wait_whole(self, copies: Sequence[CopyStep], done: Any) -> None:
        """Wait for one replay of a multi-device graph, until ``done`` (an event recorded after it) completes; if it
        does not within ``timeout_s``, name the transfers inside it (which one hangs cannot be told from outside the
        graph)."""
        if done.query():
            return
        deadline = time.monotonic() + self.timeout_s
        spin_until = time.monotonic() + SPIN_S
        while not done.query():
            if time.monotonic() < spin_until:
                continue  # a replay takes ~ms: sleeping (>= ~60 us per call on Linux) would add to every call
            if time.monotonic() > deadline:
                links = sorted({(self.devices[c.src].name, self.devices[c.dst].name) for c in copies})
                edges = sorted({c.edge for c in copies if c.edge is not None})
                where = ", ".join(f"{a}->{b}" for a, b in links) or ", ".join(d.name for d in self.devices)
                raise TransferTimeout(
                    f"one replay of the CUDA graph over {where} did not complete within {self.timeout_s} s; it holds "
                    f"{len(copies)} transfers (edges {edges[:8]}{' ...' if len(edges) > 8 else ''})"
                )
            time.sleep(20e-6)

    def _wait(self, events: list[tuple[CopyStep, Any]], streams: Sequence[Any] | None = None) -> None:
        """Wait for this call's copies and compute streams (``streams``, default the devices' streams); name the
        first transfer that does not finish in time."""
        if not any(self._is_cuda):
            return
        deadline = time.monotonic() + self.timeout_s
        spin_until = time.monotonic() + SPIN_S
        for step, ev in events:
            while not ev.query():
                if time.monotonic() < spin_until:
                    continue
                if time.monotonic() > deadline:
                    raise TransferTimeout(
                        f"{step.purpose} transfer of {step.buffer}[{step.start}:{step.end}] ({step.nbytes} bytes) "
                        f"from {self.devices[step.src].name} to {self.devices[step.dst].name}"
                        f"{f' for edge {step.edge}' if step.edge else ''} did not complete within {self.timeout_s} s"
                    )
                time.sleep(20e-6)
        for s in self.streams if streams is None else streams:
            if s is not None:
                s.synchronize()


def _stream_ctx(stream: Any) -> Any:
    import contextlib

    if stream is None or not isinstance(stream, torch.cuda.Stream):
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)
