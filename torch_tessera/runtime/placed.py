"""The multi-device executor: runs a :class:`KernelProgram` with every launch on the device a placement gives it.

Per device: a buffer pool (its own storages; the caller's device binds the caller's tensors), kernels loaded for that
device, and a compute stream. The schedule (:func:`~torch_tessera.runtime.schedule.build_schedule`) is lowered once
to exec items (:mod:`torch_tessera.runtime.realize`) and every call runs them with :func:`run_schedule`: a cut edge
is a copy of exactly the bytes the consumer needs, on a copy stream per link, ordered by CUDA events (the producer's
stream records, the copy stream waits, the consumer's stream waits on the copy's event). On CPU virtual devices the
same steps run synchronously, with real copies between separate pools; fresh allocations are filled with NaN bytes
there, so a missing copy shows up as a wrong value. Micro-batches (:meth:`PlacedExecutor.run_pipelined`) and CUDA
graphs (:mod:`torch_tessera.runtime.graphs`) run the same items.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import torch

from torch_tessera.errors import TesseraError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import BufferKind, KernelProgram, TensorArg
from torch_tessera.runtime import pipelining
from torch_tessera.runtime.executor import BufferPool, KernelLauncher, bind_input, launch_buffers
from torch_tessera.runtime.graphs import CUDAGraphWrapper
from torch_tessera.runtime.inputs import input_positions, static_input_keys, tensor_key
from torch_tessera.runtime.realize import (
    POISON,
    CallContext,
    CopyRunner,
    Machine,
    eager_runners,
    lower,
    report_transfers,
    run_schedule,
    wait_events,
)
from torch_tessera.runtime.captured import CapturedReplay
from torch_tessera.runtime.replay import ScheduleReplay
from torch_tessera.runtime.schedule import (
    STATIC_INPUTS,
    CopyStep,
    LaunchStep,
    Schedule,
    build_schedule,
    copy_hazards,
    state_owners,
)
from torch_tessera.runtime.streams import PRIORITY_CLASSES

log = logging.getLogger(__name__)

__all__ = ["GRAPH_COPIES", "POISON", "PlacedExecutor", "input_positions", "static_input_keys", "tensor_key"]

#: where a copy inside one CUDA graph over the devices runs (see PlacedExecutor's ``graph_copies``)
from torch_tessera.options import GRAPH_COPIES  # noqa: E402  (the home is options)


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
            see :func:`torch_tessera.runtime.streams.order_copy`), ``"push"`` as a copy kernel on the producing GPU
            writing the consumer's memory over peer access, for cut edges of at most
            :data:`~torch_tessera.runtime.push.PUSH_MAX_BYTES` between GPUs with peer access (other copies as with
            ``"link"``; :mod:`torch_tessera.runtime.push`). Only with ``cuda_graphs`` ``True`` / ``"whole"``.
        priority_class: stream priority of this program's compute streams and pipeline lanes when programs share
            devices (:data:`~torch_tessera.runtime.streams.PRIORITY_CLASSES`: ``"normal"``, ``"urgent"`` for
            the per-token program, ``"background"`` for bulk work); a CUDA graph replays at its stream's priority.
        weight_cache: a dict shared by executors whose weights never change (a serving process's programs and plans
            over one model): a weight another executor already placed on a device is reused there, not copied
            again (:meth:`place_weight`). ``None`` (default): every executor holds its own copies.
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
        graphs: the :class:`~torch_tessera.runtime.graphs.CUDAGraphWrapper` around this executor (``cuda_graphs``),
            else ``None``.
        machine: what the runners act on (:class:`~torch_tessera.runtime.realize.Machine`).
        trace: set to a list to record every step run, as ``(kind, step, micro-batch)`` (tests, debugging).
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
        # devices that share memory (SM partitions of one GPU) share one buffer pool; CPU virtual devices never do
        keys = [str(d.torch_device) if d.torch_device.type == "cuda" else f"virtual{i}" for i, d in enumerate(devices)]
        self.domains = [keys.index(k) for k in keys]
        self.dag = dag
        self.state_homes: dict[str, int] = {}
        self.schedule: Schedule = build_schedule(program, dag, placement, home, self.domains,
                                                 static_inputs=static_inputs)
        home_dev = self.devices[home].torch_device
        launchers = [KernelLauncher(program, kernel_objects if d.torch_device == home_dev else None, d.torch_device)
                     for d in self.devices]
        self.machine = Machine(program, self.devices, launchers, self.domains, memory_estimate)
        self.launchers = launchers
        self.calls = 0
        self.cut_edges_transferred = 0
        self.cut_edges_per_batch: list[int] = []
        self.trace: list | None = None
        is_cuda = self.machine.is_cuda
        self.streams = [d.default_stream if c else None for d, c in zip(self.devices, is_cuda)]
        self.placed_pools: list[BufferPool] = self.make_pools()  # weights and static INPUTs placed off their home
        self.setup_done = False
        self.static_placed: dict[str, tuple] = {}  # static INPUT -> static_input_keys of what placed_pools holds
        self.derive_from_schedule()
        if cuda_graphs and not all(is_cuda):
            raise TesseraError("cuda_graphs=True needs every device to be a CUDA device")
        if cuda_graphs not in (False, True, "whole", "segments"):
            raise TesseraError(f"cuda_graphs={cuda_graphs!r}: use False, True (= 'whole'), 'whole' or 'segments'")
        if graph_copies not in GRAPH_COPIES:
            raise TesseraError(f"graph_copies={graph_copies!r}: use one of {GRAPH_COPIES}")
        self.graph_copies = graph_copies
        if priority_class not in PRIORITY_CLASSES:
            raise TesseraError(f"priority_class={priority_class!r}: use one of {PRIORITY_CLASSES}")
        self.priority_class = priority_class
        self.weight_cache = weight_cache
        self.graphs: CUDAGraphWrapper | None = None
        self.set_cuda_graphs(cuda_graphs)

    def set_cuda_graphs(self, cuda_graphs: bool | str) -> None:
        """Replay CUDA graphs from the next call on (``True`` / ``"whole"`` / ``"segments"``), or not (``False``);
        drops every captured graph. The constructor checks the devices; this does not (a test stand-in on CPU)."""
        self.cuda_graphs = bool(cuda_graphs)
        # "whole": one graph over every device with the copies inside (falls back to "segments" where CUDA refuses)
        self.graph_mode = "segments" if cuda_graphs == "segments" else "whole"
        self.graphs = CUDAGraphWrapper(self) if cuda_graphs else None

    # -- counters (kept by the machine the runners act on) --------------------------------------------------------
    @property
    def transfers(self):
        """Copies performed since construction, by purpose (a cut edge spanning several ranges counts per range)."""
        return self.machine.counters.transfers

    @property
    def bytes_moved(self):
        """Bytes copied since construction, by purpose."""
        return self.machine.counters.bytes_moved

    @property
    def launches_executed(self) -> int:
        """Launches run since construction (a CUDA-graph capture records launches, it runs none)."""
        return self.machine.counters.launches

    @property
    def captures(self) -> int:
        """CUDA-graph captures so far (0 without ``cuda_graphs``)."""
        return 0 if self.graphs is None else self.graphs.captures

    # -- resident state ---------------------------------------------------------------------------------------------
    def state_owners(self) -> dict[str, int]:
        """STATE input buffer -> index of the device it belongs on under this placement (where its writers run; see
        :func:`torch_tessera.runtime.schedule.state_owners`)."""
        return state_owners(self.program, self.dag, self.schedule.placement, self.home)

    def set_state_homes(self, homes: Mapping[str, int]) -> None:
        """Declare that the caller keeps each named STATE buffer (KV cache, SSM state) on device ``homes[name]``
        (an index into ``devices``) instead of the home device, and passes it there from the next call on.

        State kept on its owner (:meth:`state_owners`) is neither copied in nor gathered back, so the per-call
        transfers of a KV cache kept elsewhere disappear. Each call checks that the tensors passed for these
        buffers live on the declared devices (CUDA; CPU virtual devices cannot be told apart).

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
        self.derive_from_schedule()
        if self.graphs is not None:
            self.graphs.reset()  # captured graphs bake the old copies in
        log.info("state kept on its devices: %s", {n: self.devices[d].name for n, d in self.state_homes.items()})

    def derive_from_schedule(self) -> None:
        """Recompute what follows from :attr:`schedule` (frees, static inputs, copy hazards, exec items, the
        pipeline's chunks); call after replacing the schedule or the memory domains."""
        self.free_after = self._last_uses()
        self.static_names = frozenset(s.buffer for s in self.schedule.setup if s.purpose == "static")
        self.static_positions = input_positions(self.program, self.static_names)
        hazards = copy_hazards(self.schedule, self.dag, self.domains)
        self.machine.copy_waits = {id(self.schedule.steps[i]): h for i, h in hazards.items()}  # see copy_hazards
        self.items = lower(self.schedule.steps, eager_runners(self.machine))
        self._replays: dict = {}  # (id(schedule), check, host_order, move_bytes) -> ScheduleReplay
        self.pipeline = pipelining.InProcessPipeline(self)

    @property
    def copy_waits(self) -> dict[int, tuple[bool, bool]]:
        """``id(copy step) -> (wait_for_dst, src_waits_for_copy)`` of the schedule's copies (see
        :func:`~torch_tessera.runtime.schedule.copy_hazards`)."""
        return self.machine.copy_waits

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

    def ensure(self, pool: BufferPool, dev: int, name: str) -> None:
        """Allocate buffer ``name`` on device ``dev`` in ``pool`` unless present (see :meth:`Machine.ensure`)."""
        self.machine.ensure(pool, dev, name)

    def outputs(self, pool: BufferPool) -> list:
        """The program's outputs as views of ``pool`` (the home device's); outputs never written are allocated."""
        for o in self.program.outputs:
            if isinstance(o, TensorArg) and o.buffer not in pool:
                self.ensure(pool, self.home, o.buffer)
        return [pool.view(o) if isinstance(o, TensorArg) else o.value for o in self.program.outputs]

    # -- execution -------------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> list:
        inputs = list(args)
        if isinstance(args, list):
            args.clear()
        return self.run(inputs)

    def run(self, inputs: Sequence[Any]) -> list:
        """Run the program on ``inputs`` (graph inputs, in order, on the home device) and return its outputs.

        Raises:
            TesseraError: wrong inputs.
            TransferTimeout: a transfer did not complete within ``timeout_s``.
        """
        if len(inputs) != len(self.program.inputs):
            raise TesseraError(f"program expects {len(self.program.inputs)} inputs, got {len(inputs)}")
        if self.graphs is not None:  # joins the caller's stream itself (only the home device's: inputs live there)
            return self.graphs(inputs)
        self.join_caller()
        ctx = self.call_context(self.bind_call(inputs), self.streams)
        run_schedule(self.items, ctx)
        self.wait(ctx.events, self.streams)
        report_transfers(self.machine, ctx)
        self.cut_edges_transferred = len(ctx.edges)  # only cut copies carry an edge
        self.calls += 1
        return self.outputs(ctx.pools[self.home])

    def call_context(self, pools: list[BufferPool], streams: Sequence[Any], lane: Any = None,
                     batch: int | None = None) -> CallContext:
        """A fresh :class:`CallContext` for one call (or micro-batch) over ``pools`` on ``streams``; it frees
        temporaries as :attr:`free_after` says and records into :attr:`trace` when that is a list."""
        return CallContext(pools, streams, lane=lane, batch=batch, free_after=self.free_after, trace=self.trace)

    def run_pipelined(self, batches: Sequence[Sequence[Any]], slots: int = 2, schedule: Any = None) -> list[list]:
        """Run independent micro-batches through the program concurrently; see :mod:`torch_tessera.runtime.pipelining`
        (``slots`` in flight, waves) or, with ``schedule``, :mod:`torch_tessera.runtime.replay` (exactly that
        explicit pipelined schedule, checked before its first run).

        Args:
            batches: one input list per micro-batch (graph inputs in order, on the home device, as for :meth:`run`);
                weights (PARAMETER inputs) and, with ``static_inputs="place"``, static INPUTs (module buffers) must
                be the same tensors in every micro-batch: the micro-batches share one placed copy of each, placed
                (again) before the run's first wave.
            slots: micro-batches in flight at once (each with its own streams and buffers); 1 = no pipelining.
                Ignored with ``schedule``.
            schedule: a :class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule` of this placement
                (``len(batches)`` a multiple of its micro-batches), or ``None``. With ``cuda_graphs`` it is captured
                as one CUDA graph at the first call and that graph replays per call (:meth:`replay`).

        Returns:
            the outputs of each micro-batch, in order, equal to what :meth:`run` returns for its inputs.

        Raises:
            TesseraError: wrong inputs, micro-batches with different weights or static inputs, or ``slots < 1``.
            ScheduleError: ``schedule`` does not cover every RAW/WAR/WAW edge (names the edge and micro-batch).
            TransferTimeout: a transfer (or a wait of ``schedule``) did not complete within ``timeout_s``.
        """
        if schedule is not None:
            return self.replay(schedule).run(batches)
        return self.pipeline.run(batches, slots)

    def replay(self, schedule: Any, check: bool = True, host_order: str = "round-robin",
               move_bytes: bool = True, captured: bool | None = None) -> ScheduleReplay | CapturedReplay:
        """The replay of ``schedule`` on this executor, checked and lowered once per schedule: a
        :class:`~torch_tessera.runtime.replay.ScheduleReplay` (see there for ``check``, ``host_order`` and
        ``move_bytes``), or with ``captured`` that replay captured as ONE CUDA graph
        (:class:`~torch_tessera.runtime.captured.CapturedReplay`).

        Args:
            captured: ``None`` (default): captured when this executor replays CUDA graphs (``cuda_graphs``), else
                issued step by step from the host (CPU virtual devices, ``cuda_graphs=False``).

        Raises:
            TesseraError: ``captured=True`` on devices that are not all CUDA devices; see ``ScheduleReplay``.
        """
        captured = self.cuda_graphs if captured is None else bool(captured)
        if captured and not self.cuda_graphs and not all(self.machine.is_cuda):
            raise TesseraError("captured=True replays a CUDA graph: every device must be a CUDA device")
        key = (id(schedule), check, host_order, move_bytes, captured)
        cached = self._replays.get(key)
        if cached is None or cached.schedule is not schedule:
            eager = ScheduleReplay(self, schedule, check, host_order, move_bytes)
            cached = self._replays[key] = CapturedReplay(eager) if captured else eager
        return cached

    def stale_static(self, inputs: Sequence[Any], placed: Mapping[str, tuple]) -> set[str]:
        """Static INPUT buffers with setup copies whose caller tensors in ``inputs`` differ from ``placed`` (their
        :func:`static_input_keys` at the last placement): moved, modified in place, never placed, or inference
        tensors (no version counter: always stale)."""
        if not self.static_positions:
            return set()
        now = static_input_keys(self.static_positions, inputs)
        return {b for b in self.static_names
                if now.get(b) != placed.get(b) or any(v is None for _, v in now.get(b, ()))}

    def bind_call(self, inputs: Sequence[Any], place: bool = True) -> list[BufferPool]:
        """Fresh pools for one call: weights and static INPUTs placed on their devices (copied at the first call; a
        static INPUT again, into the same storage, when :meth:`stale_static` names it), inputs bound.

        A re-placement's copy runs on the executor's streams like the first call's, after the caller's stream
        (:meth:`join_caller`, which :meth:`run` calls first) and before the launches that read it; every earlier
        call has finished on the host (:meth:`wait`), so no launch still reads the storage it overwrites.

        Args:
            inputs: the call's graph inputs, in order.
            place: place (or place again) weights and static INPUTs. ``False``: the caller did, for these inputs
                (a pipelined run's micro-batches, placed once before the first wave while no slot reads them: one
                micro-batch must not copy into a storage another one's launches may be reading).
        """
        program = self.program
        pools = self.make_pools()
        for p, w in zip(pools, self.placed_pools):
            p.storages.update(w.storages)
        self.check_state_devices(inputs)
        for i, (spec, value) in enumerate(zip(program.inputs, inputs)):
            pool = pools[self.input_pool_index(spec.buffer)] if isinstance(spec, TensorArg) else None
            if pool is not None and spec.buffer not in pool:
                bind_input(pool, spec, value, i)
        if place:
            self.place_setup(inputs, pools)
        return pools

    def place_setup(self, inputs: Sequence[Any], pools: list[BufferPool]) -> None:
        """At the first call, every setup step (weights and static INPUTs onto their devices); later, the steps of
        the static INPUTs :meth:`stale_static` names; each into ``pools`` and kept in :attr:`placed_pools`."""
        stale = self.stale_static(inputs, self.static_placed)
        if self.setup_done and not stale:
            return
        ctx = CallContext(pools, self.streams)
        for step in self.schedule.setup:
            if self.setup_done and step.buffer not in stale:
                continue
            self.place_weight(step, ctx)
            self.placed_pools[step.dst].storages[step.buffer] = pools[step.dst].storages[step.buffer]
        self.static_placed = static_input_keys(self.static_positions, inputs)
        if self.weight_cache is not None and not self.setup_done:  # other executors' streams read these
            for d, c in zip(self.devices, self.machine.is_cuda):
                if c:
                    d.synchronize()
        if stale:
            log.debug("static inputs placed%s: %s", " again" if self.setup_done else "", sorted(stale))
        self.setup_done = True

    def place_weight(self, step: CopyStep, ctx: CallContext) -> None:
        """Run one setup copy (a weight's bytes ``[start, end)`` onto ``step.dst``) in ``ctx``'s pools and streams,
        or, with a ``weight_cache``, reuse the storage another executor placed for the same source tensor on the
        same device, copying only the byte ranges it does not hold yet. Keyed by the source storage's address and
        size and the destination device: valid while the source weights are alive and unchanged, which is what
        passing a cache promises (a serving process's executors then hold one copy of each weight per device).
        Static INPUT steps (purpose ``"static"``) never use the cache: the caller may change their contents, and a
        storage shared with another executor would then change under it.
        """
        copy = CopyRunner(self.machine)
        pools = ctx.pools
        if self.weight_cache is None or step.purpose != "weights":
            copy(step, ctx)
            return
        src = pools[step.src].storages[step.buffer]
        # the torch device, not the runtime device: SM partitions of one GPU share its memory, and so the copy
        key = (src.data_ptr(), src.numel() * src.element_size(), str(self.devices[step.dst].torch_device))
        held = self.weight_cache.get(key)
        if held is not None:
            pools[step.dst].storages[step.buffer] = held[0]
            if (step.start, step.end) in held[1]:
                return
        copy(step, ctx)
        if held is None:
            held = self.weight_cache[key] = (pools[step.dst].storages[step.buffer], set())
        held[1].add((step.start, step.end))

    def join_caller(self, streams: Sequence[Any] | None = None) -> None:
        """Every device stream (``streams``, default the executor's) waits for the caller's current stream: the
        inputs (token ids, a KV cache the caller just wrote) may still be in flight there."""
        for dev, stream in zip(self.devices, self.streams if streams is None else streams):
            if stream is not None and dev.torch_device.type == "cuda":
                caller = torch.cuda.current_stream(dev.torch_device)
                if stream is not caller and stream.cuda_stream != caller.cuda_stream:
                    stream.wait_stream(caller)

    def wait(self, events: Sequence[tuple[CopyStep, Any, Any]], streams: Sequence[Any] | None = None) -> None:
        """Wait on the host for a call's copies and compute streams (``streams``, default the devices' streams).

        Raises:
            TransferTimeout: naming the first transfer (and its micro-batch) not finished within ``timeout_s``.
        """
        wait_events(self.machine, events, self.streams if streams is None else streams, self.timeout_s)
