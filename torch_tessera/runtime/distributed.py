"""Process-per-device runtime: one process (rank) per device, cut edges sent through ``torch.distributed``.

Rank ``r`` runs device ``r`` of a placement. A call, or a group of micro-batches, replays the placement's explicit
pipelined schedule (:class:`~torch_tessera.scheduler.pipeline_schedule.PipelinedSchedule`, one memory domain per
rank; a single call is the schedule over one micro-batch): the plan's own schedule over that many micro-batches when
the executor was given one (``schedules``: the schedule the simulator scored), else a schedule built from the placement
with every launch costing the same (logged). Every rank issues its device's steps in the schedule's order through the
runtime's one loop, a transfer is an ``isend`` of exactly the edge's bytes and the wait that consumes it an ``irecv``
(:mod:`torch_tessera.runtime.dist_replay`). The per-call copies around the steps (inputs
from the home rank, outputs and state gathered to it) and the setup copies (weights, static inputs) come from the same
:class:`Schedule` the in-process :class:`~torch_tessera.runtime.placed.PlacedExecutor` builds (:func:`build_schedule`).
Storages are flat ``uint8`` tensors, so a message moves a byte range whatever the dtype. On CUDA (NCCL) a wait makes
the compute stream wait for NCCL's stream, so the host keeps queuing work as in the in-process executor; on CPU (gloo)
it blocks. At the end of a call every outstanding message is awaited.

Failure: every wait on a peer is bounded by ``timeout_s`` (gloo: ``Work.wait(timeout)``; NCCL: polling
``Work.is_completed()`` at the end of the call). A peer that died (connection reset) or stopped answering raises
:class:`~torch_tessera.errors.PeerFailureError` naming this rank, the peer, the edge and the timeout; the process
group's own timeout is set later than ours, as a backstop. Launch the ranks with ``torchrun`` (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` in the environment); ``tessera dist-run`` is the
command-line entry point.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten

from torch_tessera.errors import ConfigError, PeerFailureError, RendezvousError, TesseraError
from torch_tessera.graph.types import DependencyGraph
from torch_tessera.lowering.program import BufferKind, ExternLaunch, KernelProgram, TensorArg
from torch_tessera.runtime.executor import (
    BufferPool,
    KernelLauncher,
    bind_input,
    fresh_extern_outputs,
    launch_buffers,
)
from torch_tessera.runtime.dist_context import (  # noqa: F401 - part of this module's interface
    DistContext,
    agree_on_plan,
    agree_on_schedules,
    init_distributed,
    plan_fingerprint,
    shutdown,
)
from torch_tessera.runtime.dist_replay import DistReplay, check_replayable, direction_groups
from torch_tessera.runtime.inputs import input_positions, static_input_keys
from torch_tessera.runtime.pipelining import check_disjoint_state, check_shared_weights
from torch_tessera.runtime.realize import POISON
from torch_tessera.runtime.schedule import STATIC_INPUTS, CopyStep, LaunchStep, Schedule, Step, build_schedule
from torch_tessera.scheduler.modulo import build_pipelined_schedule
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """One posted message this rank takes part in.

    Attributes:
        steps: the copies it carries (several when packed into one staging buffer).
        kind: ``"send"`` or ``"recv"``.
        works: the ``Work`` handles to wait on.
        buffers: the pool buffers the message still reads (send) or will write (recv); empty for a packed send,
            whose bytes were copied into the staging buffer when it was posted.
        unpack: for a packed receive, ``(staging slice, destination slice)`` pairs to copy once it has arrived.
    """

    steps: tuple[CopyStep, ...]
    kind: str
    works: tuple
    buffers: frozenset
    unpack: tuple = ()
    keep: Any = None  # the staging tensor, alive until the transfer is done
    done: bool = False

    def touches(self, buffer: str, span: tuple[int, int] | None) -> bool:
        if buffer not in self.buffers:
            return False
        return span is None or any(s.buffer == buffer and s.start < span[1] and span[0] < s.end for s in self.steps)


@dataclass
class _Call:
    """This rank's state for one call, or for one micro-batch of a pipelined run.

    Attributes:
        pool: its buffers (the shared weights, its inputs, its temporaries and outputs).
        index: the number passed to ``step_hook`` (calls before it, plus the micro-batch index).
        batch: micro-batch index in a pipelined run; ``None`` for a single call.
        pending: posted messages not yet waited on.
        sent: cut edges it sent.
        received: cut edges it received.
        static_keys: on the home rank with ``weights="send"``, ``static_input_keys`` of the caller's static INPUTs
            (checked against those sent at setup).
    """

    pool: BufferPool
    index: int
    batch: int | None = None
    pending: list = field(default_factory=list)
    sent: set = field(default_factory=set)
    received: set = field(default_factory=set)
    static_keys: dict = field(default_factory=dict)

    def where(self) -> str:
        """Words for the error message: which micro-batch, if any."""
        return "" if self.batch is None else f" in micro-batch {self.batch}"



@dataclass
class TransferStats:
    """What one rank moved.

    Attributes:
        ranges: byte ranges moved, by purpose (``cut``, ``input``, ``weights``, ``static``, ``gather``).
        messages: point-to-point operations posted (the ranges of one transfer, or a call's inputs or gathers with one
            peer, share one).
        bytes_sent: bytes sent, by purpose.
        bytes_received: bytes received, by purpose.
        batches: ``batch_isend_irecv`` calls (groups of more than one operation).
        cut_edges_sent: distinct cut edges this rank sent in the last call (pipelined: in any micro-batch).
        cut_edges_received: distinct cut edges this rank received in the last call (pipelined: in any micro-batch).
        batch_cut_edges_sent: for the last pipelined run, the cut edges this rank sent for each micro-batch.
        batch_cut_edges_received: for the last pipelined run, the cut edges it received for each micro-batch.
    """

    ranges: Counter = field(default_factory=Counter)
    messages: int = 0
    bytes_sent: Counter = field(default_factory=Counter)
    bytes_received: Counter = field(default_factory=Counter)
    batches: int = 0
    cut_edges_sent: set = field(default_factory=set)
    cut_edges_received: set = field(default_factory=set)
    batch_cut_edges_sent: list = field(default_factory=list)
    batch_cut_edges_received: list = field(default_factory=list)


class DistributedExecutor:
    """This rank's part of a placed program: its launches, and its end of every transfer.

    Every rank constructs it with the same program, DAG and placement (see :func:`agree_on_plan`) and calls
    :meth:`run` the same number of times. Rank ``r`` runs the launches placed on device ``r``.

    Args:
        program: the kernel program (lowered on this rank's device).
        dag: its dependency DAG.
        placement: launch index -> device index, which is the rank that runs it.
        ctx: this rank's context (:func:`init_distributed`).
        kernel_objects: live kernel objects from this rank's lowering (others are loaded from source).
        home: the rank holding the caller's inputs and receiving the outputs.
        weights: ``"local"``: every rank binds the parameters and static INPUTs (``KernelProgram.static_inputs``:
            module buffers) it reads from its own ``inputs`` every call (each built the same model, and changes its
            module buffers as the others do); ``"send"``: the home rank sends them once, at the first call (setup
            steps of purpose ``"weights"`` and ``"static"``). A static INPUT is not sent again: with ``"send"``, a
            call whose static tensor on the home rank moved or was modified in place since the first call raises
            :class:`TesseraError` there (its peers then fail with ``PeerFailureError`` after ``timeout_s``), since
            the other ranks cannot know to receive it again (no per-call message says so). For the same reason an
            inference tensor (``torch.inference_mode``: no version counter, a change cannot be seen) as a static
            INPUT another rank reads is refused at the first call.
        static_inputs: ``"place"`` (default): static INPUTs are handled as ``weights`` says; ``"copy"``: the home
            rank's static INPUTs are sent every call, like other inputs (any change, inference tensors too; with
            ``weights="local"`` the other ranks then bind only their parameters).
        step_hook: called as ``step_hook(call, step)`` before each step this rank takes part in (fault injection in
            tests, tracing).
        schedules: the plan's pipelined schedules of this placement (at most one per micro-batch count; one memory
            domain per device), the same on every rank: a call or group of that many micro-batches replays it. For
            other counts a schedule with every launch costing the same is built (:meth:`schedule_for`, logged).

    Attributes:
        schedule: the global step list of a single call (same on every rank).
        dag: the dependency DAG; placement: launch index -> device (= rank).
        trace: when a list, every step of a pipelined schedule this rank runs is appended as ``(kind, step)``.
        stats: this rank's :class:`TransferStats`.
        launches_executed: launches run on this rank since construction.
        calls: completed calls.
        schedule_sources: micro-batch count -> ``"plan"`` or ``"unit-cost"``: where the schedule replayed for that
            many micro-batches came from.

    Raises:
        ConfigError: the placement uses more devices than there are ranks, ``weights`` or ``static_inputs`` is
            unknown, or ``schedules`` holds two schedules over one micro-batch count.
        TesseraError: a schedule of ``schedules`` is for another placement, more devices than ranks, or devices
            sharing memory (:func:`~torch_tessera.runtime.dist_replay.check_replayable`).
    """

    def __init__(
        self,
        program: KernelProgram,
        dag: DependencyGraph,
        placement: Mapping[int, int],
        ctx: DistContext,
        kernel_objects: Mapping[str, Any] | None = None,
        home: int = 0,
        weights: str = "local",
        step_hook: Callable[[int, Step], None] | None = None,
        static_inputs: str = "place",
        schedules: Sequence[PipelinedSchedule] = (),
    ) -> None:
        n_dev = max(list(placement.values()) + [home]) + 1
        if n_dev > ctx.world_size:
            raise ConfigError(f"the placement uses {n_dev} devices but only {ctx.world_size} ranks are running; launch "
                              f"one rank per device (torchrun --nproc-per-node {n_dev})")
        if weights not in ("local", "send"):
            raise ConfigError(f"weights={weights!r} is not one of ('local', 'send')")
        if static_inputs not in STATIC_INPUTS:
            raise ConfigError(f"static_inputs={static_inputs!r} is not one of {STATIC_INPUTS}")
        self.program, self.ctx, self.home, self.weights = program, ctx, home, weights
        self.static_inputs = static_inputs
        self.rank = ctx.rank
        self.timeout_s = ctx.timeout_s
        self.step_hook = step_hook
        self.schedule: Schedule = build_schedule(program, dag, placement, home, static_inputs=static_inputs)
        self.dag, self.placement = dag, dict(placement)
        self.trace: list | None = None
        self._replays: dict[int, DistReplay] = {}  # id(pipelined schedule) -> its replay on this rank
        self._built: dict[int, PipelinedSchedule] = plan_schedules(schedules, self.placement, ctx.world_size)
        self.schedule_sources: dict[int, str] = {m: "plan" for m in self._built}
        self._directions: tuple | None = None
        self._names = {k.index: k.name for k in dag.nodes()}
        self._writes = {k.index: set(k.writes) for k in dag.nodes()}
        self._cuda = ctx.device.type == "cuda"
        self.launcher = KernelLauncher(program, kernel_objects, ctx.device)
        self._fresh = fresh_extern_outputs(program)
        self._weights = BufferPool(ctx.device)  # weights and static INPUTs received at setup
        self._setup_done = weights == "local"
        self._static_names = frozenset(s.buffer for s in self.schedule.setup if s.purpose == "static")
        self._static_at = input_positions(program, self._static_names)
        self._static_sent: dict[str, tuple] = {}  # home rank, "send": static INPUT -> tensor_key when sent
        self.stats = TransferStats()
        self.launches_executed = 0
        self.calls = 0

    # -- the plan, seen from this rank ----------------------------------------------------------------------------
    def mine(self, step: CopyStep) -> bool:
        return self.rank in (step.src, step.dst)

    # -- a call ---------------------------------------------------------------------------------------------------
    def __call__(self, args: list) -> list:
        """Inductor's calling convention (the callee clears ``args``), so a compiled model can run on every rank.

        On ranks other than home the outputs are placeholders of the right shapes (NaN or zero): the values live on
        the home rank only.
        """
        inputs = list(args)
        if isinstance(args, list):
            args.clear()
        out = self.run(inputs)
        return out if out is not None else self.placeholder_outputs()

    def placeholder_outputs(self) -> list:
        """Outputs of the right size, strides and dtype on this rank's device, filled with NaN (floats) or 0."""
        out = []
        for o in self.program.outputs:
            if not isinstance(o, TensorArg):
                out.append(o.value)
                continue
            t = torch.empty_strided(o.size, o.stride, dtype=o.dtype, device=self.ctx.device)
            out.append(t.fill_(float("nan") if t.is_floating_point() else 0))
        return out

    def run(self, inputs: Sequence[Any] | None) -> list | None:
        """Run this rank's part of one call.

        Args:
            inputs: the graph inputs in program order (tensors on this rank's device). The home rank needs all of
                them; other ranks need the parameters and static INPUTs (module buffers; parameters only with
                ``static_inputs="copy"``) when ``weights="local"`` and may pass ``None`` otherwise.

        Returns:
            On the home rank, the program's outputs (tensors on its device); ``None`` on other ranks.

        Raises:
            PeerFailureError: a peer died or did not answer within ``timeout_s``; names the peer and the edge.
            TesseraError: wrong inputs, a static input that changed since ``weights="send"`` sent it or that is an
                inference tensor (home rank), or an inconsistent schedule.
        """
        self.setup(self.new_call(inputs, self.calls))
        replay = self.replay(self.schedule_for(1))
        got = replay.replay([inputs], None)
        call = replay.last_calls[0]
        self.stats.cut_edges_sent, self.stats.cut_edges_received = call.sent, call.received
        self.calls += 1
        return got[0] if got is not None else None

    def run_pipelined(self, batches: Sequence[Sequence[Any]] | None, slots: int = 2,
                      schedule: PipelinedSchedule | None = None) -> list[list] | None:
        """Run independent micro-batches on every rank by replaying an explicit pipelined schedule
        (:mod:`torch_tessera.runtime.dist_replay`): each rank issues its device's steps in the schedule's order.
        Every rank calls it with the same ``slots`` or schedule and as many micro-batches.

        Args:
            batches: one input list per micro-batch, as for :meth:`run` (weights, the PARAMETER inputs, and, with
                ``static_inputs="place"``, static INPUTs must be the same tensors in every micro-batch; micro-batches
                of one replay must not share a state storage). Ranks other than home need only the parameters and
                static INPUTs (``weights="local"``, as for :meth:`run`) and may pass ``None`` with ``weights="send"``.
            slots: without ``schedule``, the micro-batches of each replay: the schedule over ``slots`` micro-batches
                (:meth:`schedule_for`: the plan's, else a unit-cost one) is replayed for each group of ``slots``, a
                last smaller group over its own schedule.
            schedule: the schedule to replay (of this placement; ``len(batches)`` a multiple of its
                micro-batches), checked before its first replay.

        Returns:
            On the home rank, each micro-batch's outputs in order, equal to what :meth:`run` returns for its inputs;
            ``None`` on other ranks.

        Raises:
            PeerFailureError: a peer died or did not answer within ``timeout_s``; names the peer, the edge and the
                micro-batch.
            ScheduleError: ``schedule`` does not cover every RAW/WAR/WAW edge (names the edge and micro-batch).
            TesseraError: ``slots < 1``, wrong inputs, different weights or static inputs per micro-batch, state
                shared inside a replay, a static input refused as by :meth:`run`, or ranks that disagree on the
                number of micro-batches, ``slots`` or the schedule's micro-batches (raised on every rank).
            RendezvousError: the ranks could not exchange the micro-batch plan.
        """
        if slots < 1:
            raise TesseraError(f"slots must be at least 1, got {slots}")
        size = schedule.micro_batches if schedule is not None else slots
        batches = None if batches is None else [list(b) for b in batches]
        n = self._agree(batches, size, schedule is not None)
        home = self.rank == self.home
        if n == 0:
            return [] if home else None
        inputs = batches if batches is not None else [None] * n
        self.setup(self.new_call(inputs[0], self.calls))
        outputs: list = []
        calls: list = []
        for first in range(0, n, size):
            group = inputs[first:first + size]
            replay = self.replay(schedule if schedule is not None else self.schedule_for(len(group)))
            got = replay.replay(group, first)
            calls += replay.last_calls
            outputs += got or []
        self.stats.batch_cut_edges_sent = [c.sent for c in calls]
        self.stats.batch_cut_edges_received = [c.received for c in calls]
        self.stats.cut_edges_sent = set().union(*self.stats.batch_cut_edges_sent)
        self.stats.cut_edges_received = set().union(*self.stats.batch_cut_edges_received)
        self.calls += n
        return outputs if home else None

    def replay(self, schedule: PipelinedSchedule, check: bool = True) -> DistReplay:
        """This rank's replay of ``schedule``, checked and lowered once per schedule (collective the first time:
        every rank makes the second direction's process group)."""
        if self._directions is None:
            self._directions = direction_groups(self.ctx)
        cached = self._replays.get(id(schedule))
        if cached is None or cached.schedule is not schedule:
            cached = self._replays[id(schedule)] = DistReplay(self, schedule, self._directions, check)
        return cached

    def schedule_for(self, micro_batches: int) -> PipelinedSchedule:
        """The schedule a call or group of ``micro_batches`` replays: the plan's (``schedules``) when it has one over
        that many, else one built once from the placement with every launch costing the same (one memory domain per
        rank; logged, and noted in :attr:`schedule_sources`)."""
        if micro_batches not in self._built:
            world = self.ctx.world_size
            log.info("rank %d: no plan schedule over %d micro-batches (the plan's: %s); replaying a unit-cost schedule "
                     "of the placement", self.rank, micro_batches,
                     sorted(m for m, w in self.schedule_sources.items() if w == "plan") or "none")
            self._built[micro_batches] = build_pipelined_schedule(self.dag, self.placement, micro_batches,
                                                                  domains=tuple(range(world)), devices=world)
            self.schedule_sources[micro_batches] = "unit-cost"
        return self._built[micro_batches]

    def _agree(self, batches: list | None, size: int, fixed: bool) -> int:
        """The number of micro-batches, the home rank's (after its checks), agreed by every rank.

        Raises:
            TesseraError: on every rank, when the home rank's checks fail or the ranks disagree.
            RendezvousError: the ranks could not exchange it.
        """
        problem = None
        try:
            if batches is None and self.rank == self.home:
                raise TesseraError(f"rank {self.rank} is home: it needs every micro-batch's inputs")
            if batches is not None:
                self._check_batches(batches, size, fixed)
        except TesseraError as e:
            problem = str(e)
        mine = (None if batches is None else len(batches), size, problem)
        every: list = [None] * self.ctx.world_size
        try:
            dist.all_gather_object(every, mine, group=self.ctx.control)
        except RuntimeError as e:
            raise RendezvousError(f"rank {self.rank}: the ranks could not exchange the micro-batch plan of a "
                                  f"pipelined run ({e}); check the other ranks' logs") from e
        problems = [f"rank {r}: {p}" for r, (_, _, p) in enumerate(every) if p]
        if problems:
            raise TesseraError("pipelined run refused: " + "; ".join(problems))
        n = every[self.home][0]
        bad = [r for r, (c, z, _) in enumerate(every) if z != size or c not in (None, n)]
        if bad:
            raise TesseraError(
                f"pipelined run: ranks {bad} disagree with home rank {self.home} on the micro-batches or the "
                f"micro-batches per replay (each rank's: {[(c, z) for c, z, _ in every]}); every rank must call "
                "run_pipelined with the same slots or schedule and as many micro-batches (or None where allowed)")
        return n

    def _check_batches(self, batches: list, size: int, fixed: bool) -> None:
        """Refuse micro-batches :meth:`run_pipelined` cannot run (its ``Raises``)."""
        for m, b in enumerate(batches):
            if len(b) != len(self.program.inputs):
                raise TesseraError(f"micro-batch {m}: program expects {len(self.program.inputs)} inputs, got {len(b)}")
        if fixed and len(batches) % size:
            raise TesseraError(f"{len(batches)} micro-batches for a schedule of {size}: pass a multiple of {size}, or "
                               f"build the schedule for micro_batches={len(batches)}")
        if self.rank != self.home or not batches:
            return
        check_shared_weights(self.program, batches, static=self.static_inputs == "place")
        check_disjoint_state(self.program, batches, size, "run them in separate calls")

    # -- the pieces of a call (driven step by step by dist_replay) -------------------------------------------------
    def new_call(self, inputs: Sequence[Any] | None, index: int, **where: Any) -> _Call:
        """A call's state: a fresh pool holding the weights and ``inputs`` (checked against the program).

        Args:
            inputs: graph inputs in program order, or ``None`` (see :meth:`run`).
            index: the number ``step_hook`` receives for this call.
            where: ``batch`` of a pipelined micro-batch.
        """
        if inputs is not None and len(inputs) != len(self.program.inputs):
            raise TesseraError(f"program expects {len(self.program.inputs)} inputs, got {len(inputs)}")
        pool = BufferPool(self.ctx.device)
        pool.storages.update(self._weights.storages)
        self._bind_inputs(pool, inputs)
        call = _Call(pool, index, **where)
        if self.rank == self.home and self.weights == "send" and self._static_at and inputs is not None:
            # of the caller's tensors: the pool's bindings (``Tensor.set_``) have version counters of their own
            call.static_keys = static_input_keys(self._static_at, inputs)
        return call

    def setup(self, call: _Call) -> None:
        """At the first call only, with ``weights="send"``: the home rank's weights and static INPUTs onto the ranks
        that read them. At later calls, on the home rank: check that the static INPUTs sent are unchanged.

        Raises:
            TesseraError: (home rank, ``weights="send"``) at the first call, a static INPUT is an inference tensor
                (sent once, its changes could never be seen); later, a static INPUT's tensor moved or was modified
                in place since it was sent (the other ranks would compute with the old bytes). The other ranks then
                fail with ``PeerFailureError`` after ``timeout_s``.
        """
        if self._setup_done:
            self._check_static_unchanged(call)
            return
        self._check_no_inference_static(call)
        mine = tuple(s for s in self.schedule.setup if self.mine(s))
        if mine:
            self.post(mine, call)
            self.finish(call, final=True)
        for s in mine:
            if s.dst == self.rank:
                self._weights.storages[s.buffer] = call.pool.storages[s.buffer]
        if self.rank == self.home:
            self._static_sent = dict(call.static_keys)
        self._setup_done = True

    def _check_no_inference_static(self, call: _Call) -> None:
        """Home rank, ``weights="send"``: refuse static INPUTs made of inference tensors before sending anything."""
        inference = sorted(b for b, keys in call.static_keys.items() if any(v is None for _, v in keys))
        if inference:
            raise TesseraError(
                f"rank {self.rank}: static inputs {inference[:5]} are inference tensors (made under "
                "torch.inference_mode: no version counter), and weights='send' sends static inputs once, so a later "
                "change to them could not be seen; make them outside torch.inference_mode, or use weights='local' "
                "or static_inputs='copy'")

    def _check_static_unchanged(self, call: _Call) -> None:
        if self.weights != "send" or self.rank != self.home or not self._static_names:
            return
        changed = sorted(b for b, k in call.static_keys.items() if self._static_sent.get(b) != k)
        if changed:
            raise TesseraError(
                f"rank {self.rank}: static inputs {changed[:5]} moved or were modified in place since the first call "
                "sent them to the ranks that read them (weights='send' sends them once); use weights='local' (every "
                "rank binds its own every call), static_inputs='copy' (sent every call) or build a new "
                "DistributedExecutor")

    def finish(self, call: _Call, final: bool) -> None:
        """Wait for every transfer ``call`` still has in flight (``final``: on CUDA too, poll for completion)."""
        for p in call.pending:
            if not p.done:
                self.wait_pending(p, call, final)
        call.pending = []

    def outputs(self, call: _Call) -> list:
        """The program's outputs from ``call``'s pool (home rank)."""
        for o in self.program.outputs:
            if isinstance(o, TensorArg):
                self._ensure(call.pool, o.buffer)
        return [call.pool.view(o) if isinstance(o, TensorArg) else o.value for o in self.program.outputs]

    def hook(self, call: _Call, step: Step) -> None:
        if self.step_hook is not None:
            self.step_hook(call.index, step)

    def _bind_inputs(self, pool: BufferPool, inputs: Sequence[Any] | None) -> None:
        specs = self.program.inputs
        if self.rank == self.home:
            wanted = range(len(specs))
        elif self.weights == "local":  # the rank's own parameters and static INPUTs (never sent: setup does not run)
            # with static_inputs="copy" they arrive from the home rank every call (into storages of this executor's)
            static = set(getattr(self.program, "static_inputs", ())) if self.static_inputs == "place" else set()
            wanted = [i for i, s in enumerate(specs) if isinstance(s, TensorArg)
                      and (self.program.buffers[s.buffer].kind == BufferKind.PARAMETER
                           or (self.program.buffers[s.buffer].kind == BufferKind.INPUT and s.buffer in static))]
        else:
            return
        if wanted and inputs is None:
            what = "parameters and static inputs" if static else "parameters"
            raise TesseraError(f"rank {self.rank} needs the graph inputs (its {what}, weights='local'); pass them or "
                               f"use weights='send'")
        for i in wanted:
            spec = specs[i]
            if isinstance(spec, TensorArg) and spec.buffer not in pool:
                bind_input(pool, spec, inputs[i], i)

    def _ensure(self, pool: BufferPool, name: str) -> None:
        if name in pool:
            return
        pool.allocate(name, self.program.buffers[name].nbytes)
        if not self._cuda:
            pool.storages[name].fill_(POISON)  # a missing transfer shows up as NaN

    def launch(self, step: LaunchStep, call: _Call) -> None:
        launch, pool = self.program.launches[step.launch], call.pool
        touched = launch_buffers(launch)
        for b in touched:
            self._wait_for(call, b, ("recv",))
        for b in self._writes.get(step.launch, ()):
            self._wait_for(call, b, ("send",))  # the bytes in flight must not change under the send
        for b in touched:
            if b not in self._fresh.get(launch.index, ()):
                self._ensure(pool, b)
        with _device_ctx(self.ctx.device):
            stream = torch.cuda.current_stream() if self._cuda else None
            result = self.launcher.launch(launch, pool, stream)
        if isinstance(launch, ExternLaunch) and launch.index in self._fresh:
            leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            for spec, t in zip(launch.outputs, leaves):
                if spec.buffer in self._fresh[launch.index]:
                    pool.bind(spec.buffer, t)
        self.launches_executed += 1

    # -- transfers ------------------------------------------------------------------------------------------------
    def post(self, steps: Sequence[CopyStep], call: _Call, group: Any = None, stage: bool = False) -> None:
        """Post this rank's end of ``steps`` for ``call``: one message per peer and direction (several byte ranges
        are packed into one staging buffer), all in one ``batch_isend_irecv`` when there are several messages.

        Args:
            steps: copies this rank sends or receives.
            call: the call or micro-batch whose pool they read or write.
            group: the process group (``None``: the default group).
            stage: send from a private copy of the bytes even for one range (the pool's buffer may then change at
                once, nothing waits for the send before it).
        """
        groups: dict[tuple, list[CopyStep]] = {}  # (kind, peer, ...) -> its ranges
        for i, s in enumerate(steps):
            key: tuple = ("send", s.dst) if s.src == self.rank else ("recv", s.src)
            if s.purpose in ("weights", "static"):
                key += (i,)  # weights and static inputs are large: one message each, never a packed copy of them all
            groups.setdefault(key, []).append(s)
            self._count(s, key[0], call)
        ops, pendings = [], []
        for (kind, peer, *_), ranges in groups.items():
            tensor, pending = self._prepare(kind, ranges, call, stage)
            ops.append((dist.isend if kind == "send" else dist.irecv, tensor, peer))
            pendings.append(pending)
        try:
            if len(ops) == 1:
                fn, tensor, peer = ops[0]
                works = [fn(tensor, peer, group=group)]
            else:
                works = dist.batch_isend_irecv([dist.P2POp(fn, tensor, peer, group) for fn, tensor, peer in ops])
                self.stats.batches += 1
        except RuntimeError as e:
            raise self._failure(pendings[0], e, call) from e
        self.stats.messages += len(ops)
        works = [w for w in works if w is not None]
        for k, p in enumerate(pendings):
            p.works = (works[k],) if len(works) == len(ops) else tuple(works)
            call.pending.append(p)

    def _count(self, s: CopyStep, kind: str, call: _Call) -> None:
        self.stats.ranges[s.purpose] += 1
        if kind == "send":
            self.stats.bytes_sent[s.purpose] += s.nbytes
            if s.edge is not None:
                call.sent.add(s.edge)
        else:
            self.stats.bytes_received[s.purpose] += s.nbytes
            if s.edge is not None:
                call.received.add(s.edge)

    def _prepare(self, kind: str, group: list[CopyStep], call: _Call,
                 stage: bool = False) -> tuple[torch.Tensor, _Pending]:
        """The tensor to send or receive into for ``group`` (copies with one peer), and its pending record; a send
        of several ranges, or with ``stage`` of any, goes from a private copy."""
        pool = call.pool
        for s in group:
            if kind == "send":
                if s.buffer not in pool:
                    raise TesseraError(f"rank {self.rank}: {s.purpose} send of {s.buffer}[{s.start}:{s.end}] "
                                       f"(edge {s.edge}): the buffer does not exist here; the schedule is inconsistent")
                self._wait_for(call, s.buffer, ("recv",), (s.start, s.end))
            else:
                self._ensure(pool, s.buffer)
                self._wait_for(call, s.buffer, ("send", "recv"), (s.start, s.end))
        slices = [pool.storages[s.buffer][s.start:s.end] for s in group]
        names = frozenset(s.buffer for s in group)
        if len(group) == 1 and not (stage and kind == "send"):
            return slices[0], _Pending(tuple(group), kind, (), names)
        if kind == "send":
            packed = torch.cat(slices)
            return packed, _Pending(tuple(group), kind, (), frozenset(), keep=packed)
        staging = torch.empty(sum(s.nbytes for s in group), dtype=torch.uint8, device=self.ctx.device)
        pairs, at = [], 0
        for s, dst in zip(group, slices):
            pairs.append((staging[at:at + s.nbytes], dst))
            at += s.nbytes
        return staging, _Pending(tuple(group), kind, (), names, tuple(pairs), keep=staging)

    def _wait_for(self, call: _Call, buffer: str, kinds: Sequence[str], span: tuple[int, int] | None = None) -> None:
        """Wait for ``call``'s pending transfers of ``buffer`` of the given kinds (overlapping ``span`` if given)."""
        for p in call.pending:
            if not p.done and p.kind in kinds and p.touches(buffer, span):
                self.wait_pending(p, call, final=False)
        call.pending = [p for p in call.pending if not p.done]

    def wait_pending(self, p: _Pending, call: _Call, final: bool) -> None:
        """Wait for one transfer: blocking with a timeout on CPU; stream-ordered on CUDA, polled at the call's end."""
        try:
            for w in p.works:
                if not self._cuda:
                    w.wait(timeout=datetime.timedelta(seconds=self.timeout_s))
                    continue
                if final:
                    deadline = time.monotonic() + self.timeout_s
                    while not w.is_completed():
                        if time.monotonic() > deadline:
                            raise self._failure(p, None, call)
                        time.sleep(20e-6)
                w.wait()
        except RuntimeError as e:
            if isinstance(e, PeerFailureError):
                raise
            raise self._failure(p, e, call) from e
        for src, dst in p.unpack:
            dst.copy_(src)
        p.done, p.keep, p.unpack = True, None, ()

    def describe(self, step: CopyStep) -> str:
        """A transfer in words: the edge (launches and kernel names), the buffer range and the devices (= ranks)."""
        where = f"buffer {step.buffer}[{step.start}:{step.end}] ({step.nbytes} bytes)"
        if step.edge is not None:
            u, v = step.edge
            return (f"cut edge launch {u} ({self._names.get(u, '?')}) on rank {step.src} -> launch {v} "
                    f"({self._names.get(v, '?')}) on rank {step.dst}, {where}")
        return f"{step.purpose} transfer of {where} from rank {step.src} to rank {step.dst}"

    def _failure(self, p: _Pending, cause: BaseException | None, call: _Call) -> PeerFailureError:
        step = p.steps[0]
        peer = step.dst if p.kind == "send" else step.src
        text = str(cause) if cause is not None else ""
        if cause is None or "timed out" in text.lower() or "timeout" in text.lower():
            why = f"no answer within {self.timeout_s:g} s"
        else:
            why = f"the connection failed ({text.splitlines()[0][:200] if text else type(cause).__name__})"
        verb = "sending to" if p.kind == "send" else "receiving from"
        return PeerFailureError(
            f"rank {self.rank} ({self.ctx.device}): {verb} rank {peer} failed, {why}{call.where()}, on the "
            f"{self.describe(step)}"
            f"{f' (and {len(p.steps) - 1} more ranges in the same message)' if len(p.steps) > 1 else ''}. "
            f"Check rank {peer}'s log (it may have died); if it is only slow, raise the timeout "
            f"(timeout_s / --timeout, now {self.timeout_s:g} s)",
            rank=self.rank, peer=peer, edge=step.edge, buffer=step.buffer, batch=call.batch,
        )


def plan_schedules(schedules: Sequence[PipelinedSchedule], placement: Mapping[int, int],
                   world_size: int) -> dict[int, PipelinedSchedule]:
    """The plan's schedules by micro-batch count, each checked as replayable by the ranks
    (:func:`~torch_tessera.runtime.dist_replay.check_replayable`).

    Raises:
        ConfigError: two schedules over one micro-batch count.
        TesseraError: a schedule ``check_replayable`` refuses.
    """
    out: dict[int, PipelinedSchedule] = {}
    for s in schedules:
        if s.micro_batches in out:
            raise ConfigError(f"two plan schedules over {s.micro_batches} micro-batches; give one per count")
        check_replayable(s, placement, world_size)
        out[s.micro_batches] = s
    return out


def _device_ctx(device: torch.device) -> Any:
    import contextlib

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
