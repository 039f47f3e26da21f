"""One CUDA graph per explicit schedule: :class:`CapturedReplay` captures a whole
:class:`~torch_tessera.runtime.replay.ScheduleReplay` (every device's steps, every micro-batch, the cross-stream event
waits, the per-call input copies and gathers) as ONE graph and replays that graph per call, so no per-step host issue
is left.

The capture order is the replay order: the capture runs the replay's own exec items, in its host issue order
(:func:`~torch_tessera.scheduler.issue.issue_order`), with the runners swapped for capture runners:

* a :class:`~torch_tessera.scheduler.pipeline_schedule.RunStep` is its launch, recorded on its device's stream;
* a :class:`~torch_tessera.scheduler.pipeline_schedule.TransferStep` is a memcpy node per byte range on the
  producer's stream (:func:`~torch_tessera.runtime.graphs.capture_transfer`), ordered only by the schedule's waits;
* a record step records an event on its device's stream, a wait step makes its device's stream wait on it: inside
  the capture these become the graph's edges between the partitions' streams;
* the executor's per-call input copies and gathers are memcpy nodes ordered as in a single call
  (:func:`~torch_tessera.runtime.graphs.capture_copy`).

Every other stream joins the capture from the home device's stream through an event and is joined back at its end
(:func:`~torch_tessera.runtime.graphs.capture_graph`). Per call:

1. First call (and again when a weight or state input arrives at another address): the executor's weights and
   static INPUTs are placed; each micro-batch gets static pools (its INPUT-kind inputs copied into static storages,
   weights and state bound where the caller keeps them); one eager replay runs in those pools on the capture's
   streams (this *is* the call: kernels compile and autotune, every buffer is allocated, in-place state updates
   happen once); then the capture. If CUDA refuses it, a :class:`~torch_tessera.errors.TesseraFallbackWarning`
   says so and later calls replay the schedule step by step from the host.
2. Every later call: the home stream waits for the callers' current streams, each micro-batch's INPUT-kind inputs
   are copied into its static storages, the graph replays, the outputs are cloned (the next replay rewrites the
   static storages) and an event is recorded after them. Where the executor's devices span more than one memory
   domain (whole GPUs: the graph holds transfers over a link), the host waits for that event, bounded by the
   executor's ``timeout_s`` (:class:`~torch_tessera.errors.TransferTimeout` names the transfers inside the graph).
   Where they share one domain (partitions of one GPU: a cut is an event wait inside the graph, no transfer that
   could hang), the call returns at once and the callers' current streams wait on that event, as after any CUDA
   kernel: the outputs are ordered on the caller's stream, and the next call's host work (its input checks and
   copies, the graph launch) runs while this replay is still on the GPU.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.runtime import graphs
from torch_tessera.runtime.executor import BufferPool, borrow_pools
from torch_tessera.runtime.inputcheck import CheckedInputs, check_input_shapes, input_specs
from torch_tessera.runtime.pipelining import check_disjoint_state
from torch_tessera.runtime.realize import CallContext, ExecItem, Runner, report_transfers, run_schedule, \
    wait_replay
from torch_tessera.runtime.replay import RecordRunner, ReplayContext, RunRunner, ScheduleReplay, TransferRunner, \
    WaitRunner, note_cut_edges
from torch_tessera.runtime.schedule import CopyStep
from torch_tessera.runtime.streams import greatest_priority, single_priority, stream_ctx
from torch_tessera.scheduler.pipeline_schedule import RecordStep, RunStep, TransferStep, WaitStep

log = logging.getLogger("torch_tessera.runtime")


@dataclass
class Slot:
    """One micro-batch's static buffers in the captured graph.

    Attributes:
        pools: its buffer pool per device (devices of one memory domain share one).
        bound_list: ``(input index, address)`` of the inputs bound where the caller keeps them (weights, state).
        copy_list: ``(input index, static view)`` of the INPUT-kind inputs copied in before each replay.
        fast_check: cache of :func:`~torch_tessera.runtime.graphs.bound_inputs_unmoved`.
    """

    pools: list[BufferPool]
    bound_list: list[tuple[int, int]]
    copy_list: list[tuple[int, torch.Tensor]]
    fast_check: Any = None


class CaptureTransferRunner(TransferRunner):
    """Inside the capture: a cut edge's byte ranges as memcpy nodes on the producer's stream (nothing with
    ``move=False``, the null-hop diagnosis), into the consumer's storage of the micro-batch."""

    def __call__(self, step: TransferStep, ctx: ReplayContext) -> None:
        m = self.machine
        pools = ctx.flights[step.micro_batch].pools
        if self.move:
            with m.devices[step.src].guard():
                for buffer, start, end in step.ranges:
                    copy = CopyStep(step.src, step.dst, buffer, start, end, step.purpose, step.edge)
                    graphs.capture_transfer(m, copy, pools, ctx.streams[step.src])
        ctx.note(self.kind, step)


class CaptureCopyRunner(Runner):
    """Inside the capture: one of the executor's per-call copies (inputs onto other devices, gathers home), as in
    a single call's graph: on the producer's stream, the consumer's stream waiting for it."""

    kind = "copy"

    def __call__(self, step: CopyStep, ctx: CallContext) -> None:
        graphs.capture_copy(self.machine, step, ctx.pools, ctx.streams, None)
        ctx.note(self.kind, step)


class CapturedReplay:
    """A :class:`ScheduleReplay` captured as one CUDA graph (the module docstring), replayed once per call.

    Args:
        replay: the eager replay of the schedule (its checked schedule and exec items; it also serves the calls
            where the capture failed).

    Attributes:
        captures: captures so far (a replay must not capture again unless a bound input moved).
        replays: graph replays so far.
        captured_steps: what the last capture issued, in order, as ``(kind, step, micro-batch)``: the schedule's
            steps in the host issue order, between each micro-batch's input copies and gathers.
        last_issue_seconds: host seconds the last call took to issue its work (without the final wait).
        last_pools: each micro-batch's pools of the captured graph.
        fallback: the capture failed; calls replay the schedule step by step.
        on_step: None, or called as ``on_step(stage)`` after each stage of a call (``"bind"``: static pools made;
            ``"warm-up"``: the eager replay in them done; ``"capture"``; ``"replay"``: a graph replay waited for),
            never inside the capture: a diagnosis may synchronize there to learn which stage a CUDA error came from.
    """

    def __init__(self, replay: ScheduleReplay) -> None:
        self.replay = replay
        self.executor = ex = replay.executor
        self.schedule = replay.schedule
        m = ex.machine
        runners = {RunStep: RunRunner(m, count=False), TransferStep: CaptureTransferRunner(m, replay.move_bytes),
                   RecordStep: RecordRunner(m), WaitStep: WaitRunner(m)}
        self.items = [ExecItem(runners[type(it.step)], it.step, it.index) for it in replay.items]
        copy = CaptureCopyRunner(m)
        self.inputs = [ExecItem(copy, it.step, it.index) for it in replay.inputs]
        self.gathers = [ExecItem(copy, it.step, it.index) for it in replay.gathers]
        self.copies = [*self.schedule.steps(TransferStep), *(it.step for it in replay.inputs),
                       *(it.step for it in replay.gathers)]
        self.graph: Any = None
        self.keep_alive: list = []
        self.slots: list[Slot] = []
        self.streams: list[Any] | None = None
        self.captures = self.replays = 0
        self.captured_steps: list = []
        self.last_issue_seconds = 0.0
        self.last_pools: list | None = None
        self.fallback = False
        self.on_step: Callable[[str], None] | None = None
        #: the call waits for its replay on the host (devices in more than one memory domain; the module docstring)
        self.host_wait = len(set(ex.domains)) > 1
        self._per_call: tuple = (0, Counter(), Counter())  # launches, transfers, bytes one call adds to the counters
        self._edges: list[int] = []
        placed = frozenset(step.buffer for step in ex.schedule.setup)
        program = ex.program
        static = set(getattr(program, "static_inputs", ()))
        fresh = [i for i, s in enumerate(program.inputs) if isinstance(s, TensorArg)
                 and program.buffers[s.buffer].kind == BufferKind.INPUT and s.buffer not in static]
        self._has_state = any(isinstance(s, TensorArg) and program.buffers[s.buffer].kind == BufferKind.STATE
                              for s in program.inputs)
        self._specs = input_specs(program, placed)
        self._fresh_specs = input_specs(program, placed, fresh)
        self.checked = CheckedInputs(self._check, fresh, self._check_fresh)

    def _check(self, batches: list[list]) -> list[list]:
        """The full check of a call's inputs: :meth:`ScheduleReplay.check_batches` and every tensor input's shape and
        strides (:func:`~torch_tessera.runtime.inputcheck.check_input_shapes`; a replay binds nothing)."""
        batches = self.replay.check_batches(batches)
        check_input_shapes(self._specs, batches)
        return batches

    def _check_fresh(self, batches: list[list]) -> None:
        """The checks of the inputs a call may pass new tensors for (the others matched the last full check):
        their shapes and strides, and where the program has state, the micro-batches' state storages against
        them (as :meth:`ScheduleReplay.check_batches`)."""
        check_input_shapes(self._fresh_specs, batches)
        if self._has_state:
            check_disjoint_state(self.executor.program, batches, self.schedule.micro_batches,
                                 "use run_pipelined without a schedule (waves in order)")

    def run(self, batches: Sequence[Sequence[Any]], pools: Sequence[Any] | None = None) -> list[list]:
        """Run ``batches`` (a multiple of the schedule's micro-batches), one graph replay per group of them.

        Args:
            batches: one input list per micro-batch, as for the executor's ``run``.
            pools: capture in these pools (another replay's ``last_pools``: every buffer exists and holds that run's
                values) instead of static pools of its own, borrowed
                (:func:`~torch_tessera.runtime.executor.borrow_pools`: the warm-up and the capture re-bind extern
                kernels' fresh outputs in this replay's own pools, never in the lender's, whose graph holds those
                addresses); the inputs are then read where those pools bind them, and a later call's inputs are not
                copied in. For diagnosis modes that drop steps.

        Returns:
            the outputs of each micro-batch, in order (clones: later calls do not overwrite them).

        Raises:
            TesseraError: as :meth:`ScheduleReplay.run`.
            TransferTimeout: the replay did not complete within the executor's ``timeout_s`` (where the call waits
                for it on the host: :attr:`host_wait`).
        """
        batches, fast = self.checked(batches)
        M = self.schedule.micro_batches
        outputs: list[list] = []
        per_batch: list[int] = []
        for g in range(0, len(batches), M):
            outputs += self._call(batches[g:g + M], g, pools, fast)
            per_batch += self.executor.cut_edges_per_batch
        if not fast and len(batches) == M:  # several groups may bind different state: each is checked in full
            self.checked.confirm(batches)
        note_cut_edges(self.executor, per_batch)
        self.executor.calls += len(batches)
        return outputs

    def _call(self, group: list[list], first: int, pools: Sequence[Any] | None, fast: bool = False) -> list[list]:
        """One call of ``group`` (checked in full, or ``fast``: the very inputs of the last fully checked call, at the
        same addresses, sizes and strides (:class:`~torch_tessera.runtime.inputcheck.CheckedInputs`), so the inputs
        bound at capture have not moved)."""
        ex = self.executor
        if self.fallback:
            return self.replay.replay_group(group, first)
        t0 = time.perf_counter()
        if self.graph is None or not (fast or all(graphs.bound_inputs_unmoved(s, b)
                                                  for s, b in zip(self.slots, group))):
            if self.graph is not None:
                log.info("an input bound at capture (weights, state) moved; capturing the schedule again")
            return self._capture(group, first, pools)
        if ex.stale_static(group[0], ex.static_placed):  # a module buffer changed in place: placed again, in place
            self._synchronize()
            ex.bind_call(group[0])
            self._synchronize()
        home = ex.home
        main = self.streams[home]
        callers = self._caller_streams(main)
        for caller in callers:  # inputs and state in flight on the callers' streams
            main.wait_stream(caller)
        outs = []
        with ex.devices[home].guard(), stream_ctx(main):
            for slot, batch in zip(self.slots, group):
                for k, static in slot.copy_list:
                    static.copy_(batch[k], non_blocking=True)
            self.graph.replay()
            for slot in self.slots:
                outs.append([o.clone() if isinstance(o, torch.Tensor) else o for o in ex.outputs(slot.pools[home])])
            done = main.record_event()
        self.last_issue_seconds = time.perf_counter() - t0
        self.replays += 1
        launches, transfers, nbytes = self._per_call
        counters = ex.machine.counters
        counters.launches += launches
        counters.transfers.update(transfers)
        counters.bytes_moved.update(nbytes)
        ex.cut_edges_per_batch = list(self._edges)
        ex.cut_edges_transferred = sum(self._edges)
        if self.host_wait:
            wait_replay(ex.machine, self.copies, done, ex.timeout_s)
        else:
            for caller in callers:  # what the caller issues next, and memory it frees, come after the call
                caller.wait_event(done)
        self._stage("replay")
        return outs

    def _stage(self, name: str) -> None:
        if self.on_step is not None:
            self.on_step(name)

    def _caller_streams(self, main: Any) -> list[Any]:
        """The callers' current stream on every GPU the executor uses, where it is not ``main``: ``main`` waits for
        them before a replay; where the host does not wait (:attr:`host_wait`), they wait for the replay after it."""
        out, seen = [], set()
        for d in self.executor.devices:
            dev = d.torch_device
            if dev.type == "cuda" and dev not in seen:
                seen.add(dev)
                caller = torch.cuda.current_stream(dev)
                if caller.cuda_stream != main.cuda_stream:
                    out.append(caller)
        return out

    def _synchronize(self) -> None:
        for d in self.executor.devices:
            d.synchronize()

    def _slots(self, group: list[list], pools: Sequence[Any] | None) -> list[Slot]:
        """Static pools per micro-batch (or the given ones), with weights and state bound, INPUTs copied in."""
        ex = self.executor
        if pools is not None:
            return [Slot(borrow_pools(p), [], []) for p in pools]  # the lender's graph keeps its bindings
        out = []
        for batch in group:
            p = ex.make_pools()
            for mine, placed in zip(p, ex.placed_pools):
                mine.storages.update(placed.storages)
            static_inputs, bound = graphs.bind_static(ex, batch, p)
            bound_list, copy_list, seen = [], [], set()
            for k, (spec, value) in enumerate(zip(ex.program.inputs, batch)):
                if isinstance(spec, TensorArg) and spec.buffer in bound and spec.buffer not in seen:
                    seen.add(spec.buffer)
                    bound_list.append((k, value.data_ptr()))
                elif isinstance(spec, TensorArg) and spec.buffer in static_inputs:
                    copy_list.append((k, p[ex.home].view(spec)))
            out.append(Slot(p, bound_list, copy_list))
        return out

    def _capture(self, group: list[list], first: int, pools: Sequence[Any] | None) -> list[list]:
        """Static pools, the warm-up replay (this call), the capture. Returns the warm-up's outputs."""
        ex = self.executor
        m = ex.machine
        self._synchronize()  # earlier replays may still read the old static storages
        self.graph, self.keep_alive = None, []
        self.checked.forget()
        ex.join_caller()
        if not ex.setup_done or ex.stale_static(group[0], ex.static_placed):
            ex.bind_call(group[0])  # weights and static inputs placed once, on the executor's streams
        if self.streams is None:
            prio = single_priority(ex.priority_class, greatest_priority(ex.devices))
            self.streams = [d.new_stream(priority=prio) for d in ex.devices]  # capture needs non-default streams
        self.slots = self._slots(group, pools)
        self.last_pools = [s.pools for s in self.slots]
        self._synchronize()  # the static inputs and placed weights have landed before other streams read them
        self._stage("bind")
        warm = [s if c else None for s, c in zip(self.streams, m.is_cuda)]
        counters = m.counters
        before = (counters.launches, Counter(counters.transfers), Counter(counters.bytes_moved))
        flights = [CallContext(s.pools, warm, batch=first + k, trace=ex.trace) for k, s in enumerate(self.slots)]
        for f in flights:
            run_schedule(self.replay.inputs, f)
        ctx = ReplayContext(flights, warm, trace=ex.trace)
        run_schedule(self.replay.items, ctx)
        for f in flights:
            run_schedule(self.replay.gathers, f)
        self.replay.wait_host(ctx, first)
        ex.wait([e for f in flights for e in f.events], [s for s in warm if s is not None])
        outs = [[o.clone() if isinstance(o, torch.Tensor) else o for o in ex.outputs(s.pools[ex.home])]
                for s in self.slots]
        for f in flights:
            report_transfers(m, f)
        self._per_call = (counters.launches - before[0], counters.transfers - before[1],
                          counters.bytes_moved - before[2])
        self._edges = [len(f.edges) for f in flights]
        ex.cut_edges_per_batch = list(self._edges)
        ex.cut_edges_transferred = sum(self._edges)
        self._synchronize()
        self._stage("warm-up")
        self.captured_steps = []
        cap = [CallContext(s.pools, self.streams, batch=first + k, trace=self.captured_steps)
               for k, s in enumerate(self.slots)]
        cctx = ReplayContext(cap, self.streams, trace=self.captured_steps)

        def issue() -> None:
            for f in cap:
                run_schedule(self.inputs, f)
            run_schedule(self.items, cctx)
            for f in cap:
                run_schedule(self.gathers, f)

        got = graphs.capture_graph(m, issue, self.streams, self.streams[ex.home], ex.home,
                                   "it replays the explicit schedule step by step from the host instead "
                                   "(cuda_graphs=False asks for that directly)")
        if got is None:
            self.fallback = True
            return outs
        self.graph, self.keep_alive = got
        self.captures += 1
        self._stage("capture")
        log.info("captured the %s schedule as one CUDA graph: %d micro-batches, %d steps, %d waits, %d copies",
                 self.schedule.source, self.schedule.micro_batches, len(self.items), self.schedule.num_waits,
                 len(self.copies))
        return outs
