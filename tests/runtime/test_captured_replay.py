"""An explicit pipelined schedule captured as ONE CUDA graph (runtime/captured.py), on CPU virtual devices with the
pointer-faithful stand-in graph (tests/runtime/graph_stand_in.py): the capture issues exactly the schedule's steps in
the replay's host order, each wait on the event its record step recorded, and replays of the graph compute what eager
PyTorch computes for fresh inputs, for random placements and micro-batch counts. With ``TESSERA_TEST_DEVICE=cuda`` the
stand-in tests skip and the real capture runs instead, on ``TESSERA_TEST_CUDA_PAIR`` (default two green-context
partitions of cuda:0, ``cuda:0@104sm,cuda:0@24sm``).
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from tests.conftest import TEST_DEVICE
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture

if TEST_DEVICE == "cpu":  # test_replay's helpers build CPU virtual devices (that module skips itself elsewhere)
    from tests.runtime.test_replay import _batches, _mlp_runner, _schedule
from torch_tessera.errors import TesseraError, TesseraFallbackWarning
from torch_tessera.runtime import graphs as graphs_mod
from torch_tessera.runtime.captured import CapturedReplay
from torch_tessera.runtime.replay import ScheduleReplay
from torch_tessera.runtime.runner import random_placement
from torch_tessera.scheduler.issue import issue_order
from torch_tessera.scheduler.pipeline_schedule import RecordStep, RunStep, TransferStep, WaitStep
from torch_tessera.target import devices as devices_mod

cpu_only = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the stand-in graph replaces CUDA graphs on CPU only")


class _Event:
    def __init__(self, stream, n):
        self.stream, self.n = stream, n

    def query(self):
        return True


class _RecordingStream:
    """A stream of the fake stream API: logs every record and wait, in issue order, to a shared list."""

    def __init__(self, log, device):
        self.log, self.device, self.cuda_stream = log, device, id(self)

    def record_event(self, event=None):
        ev = _Event(self, len(self.log))
        self.log.append(("record", self.device, ev))
        return ev

    def wait_event(self, event):
        self.log.append(("wait", self.device, event))

    def wait_stream(self, stream):
        self.log.append(("wait-stream", self.device, stream))

    def synchronize(self):
        return None

    def query(self):
        return True


def _captured_executor(seed, m):
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, seed)
    runner.set_placement(placement)
    ex = runner.executor
    ex.set_cuda_graphs(True)  # the stand-in lets CPU executors "replay CUDA graphs"
    return model, inputs, template, ex, _schedule(runner, placement, m)


@cpu_only
def test_capture_issues_the_schedule_in_replay_order_with_its_waits(stand_in_graphs, monkeypatch):
    log: list = []
    made = []

    def new_stream(self, priority=0):
        made.append(_RecordingStream(log, len(made)))
        return made[-1]

    monkeypatch.setattr(devices_mod.Device, "new_stream", new_stream)
    model, inputs, template, ex, sched = _captured_executor(3, 3)
    assert sched.num_waits > 0 and sched.steps(TransferStep)
    replay = ex.replay(sched)
    assert isinstance(replay, CapturedReplay)
    xs, batches = _batches(template, inputs, 3)
    with torch.no_grad():
        replay.run(batches)  # the first call: warm-up (eager, in the static pools) then the capture
    assert replay.captures == 1
    order = issue_order(sched)
    steps = [s for kind, s, _ in replay.captured_steps if kind in ("run", "transfer", "record", "wait")]
    assert steps == order  # the capture issued exactly the schedule's steps, in the replay's host order
    for d in range(sched.devices):
        assert [s for s in steps if s.device == d] == list(sched.streams[d])
    copies = [s for kind, s, _ in replay.captured_steps if kind == "copy"]
    assert len(copies) == 3 * (len(replay.replay.inputs) + len(replay.replay.gathers))
    # every record / wait of the schedule went to its device's stream; each wait waits on the very event the record
    # step of its event id recorded
    syncs = [s for s in order if isinstance(s, (RecordStep, WaitStep))]
    logged = [e for e in log if e[0] in ("record", "wait")][-len(syncs):]
    recorded = {}
    for step, (kind, dev, ev) in zip(syncs, logged):
        assert made[dev] is made[step.device] and kind == ("record" if isinstance(step, RecordStep) else "wait")
        if kind == "record":
            recorded[step.event_id] = ev
        else:
            assert ev is recorded[step.event_id] and ev.stream.device != dev
    assert len(recorded) == len(sched.steps(RecordStep))


@cpu_only
def test_graph_replays_equal_eager_for_fresh_inputs(stand_in_graphs):
    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    launches = ex.launches_executed
    for call in range(3):
        xs, batches = _batches(template, inputs, 2, seed=10 + call)
        with torch.no_grad():
            got = ex.run_pipelined(batches, schedule=sched)
        for x, g in zip(xs, got):
            torch.testing.assert_close(g[0], model(*x), msg=lambda e: f"call {call}: {e}")
    assert (replay.captures, replay.replays) == (1, 2)  # captured once, the graph replayed by every later call
    runs = len(sched.steps(RunStep))
    assert ex.launches_executed - launches == 3 * runs
    assert ex.cut_edges_per_batch == [len([e for e in sched.steps(TransferStep) if e.micro_batch == m])
                                      for m in range(2)]


@cpu_only
def test_random_placements_and_micro_batches_equal_eager(stand_in_graphs):
    rng = random.Random(7)
    for seed in range(6):
        m = rng.randint(1, 4)
        model, inputs, template, ex, sched = _captured_executor(100 + seed, m)
        for call in range(2):
            xs, batches = _batches(template, inputs, m, seed=seed * 10 + call)
            with torch.no_grad():
                got = ex.run_pipelined(batches, schedule=sched)
            for k, (x, g) in enumerate(zip(xs, got)):
                torch.testing.assert_close(g[0], model(*x), msg=lambda e: f"placement {seed}, micro-batch {k}: {e}")
        assert ex.replay(sched).replays == 1


@cpu_only
def test_eager_replay_without_graphs_and_a_clear_error_on_cpu():
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    ex = runner.executor
    sched = _schedule(runner, placement, 2)
    assert type(ex.replay(sched)) is ScheduleReplay  # CPU devices, cuda_graphs=False: issued step by step
    with pytest.raises(TesseraError, match="every device must be a CUDA device"):
        ex.replay(sched, captured=True)


@cpu_only
def test_a_refused_capture_warns_and_falls_back_to_the_eager_replay(stand_in_graphs, monkeypatch):
    model, inputs, template, ex, sched = _captured_executor(3, 2)

    class Refused:
        def __init__(self, *a, **k):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", Refused)
    replay = ex.replay(sched)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(2):
            xs, batches = _batches(template, inputs, 2, seed=call)
            with torch.no_grad():
                got = ex.run_pipelined(batches, schedule=sched)
            for x, g in zip(xs, got):
                torch.testing.assert_close(g[0], model(*x))
    assert replay.fallback and replay.captures == 0
    assert any(issubclass(w.category, TesseraFallbackWarning) and "step by step" in str(w.message) for w in caught)


@cpu_only
def test_moved_weights_are_captured_again(stand_in_graphs):
    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    xs, batches = _batches(template, inputs, 2)
    with torch.no_grad():
        replay.run(batches)
        replay.run(batches)
    assert (replay.captures, replay.replays) == (1, 1)
    weight = next(a for a in batches[0] if isinstance(a, torch.Tensor) and a.requires_grad)
    moved = weight.detach().clone()
    batches = [[moved if a is weight else a for a in b] for b in batches]
    with torch.no_grad():
        got = replay.run(batches)
    assert replay.captures == 2
    for x, g in zip(xs, got):
        torch.testing.assert_close(g[0], model(*x))


@cpu_only
def test_capture_transfer_is_one_copy_on_the_given_stream(monkeypatch):
    """graphs.capture_transfer: the byte range of the copy step, from the producer's pool into the consumer's."""
    from types import SimpleNamespace

    from torch_tessera.runtime.executor import BufferPool
    from torch_tessera.runtime.realize import Machine
    from torch_tessera.runtime.schedule import CopyStep

    pools = [BufferPool(torch.device("cpu")), BufferPool(torch.device("cpu"))]
    pools[0].allocate("b", 16)
    pools[1].allocate("b", 16)
    pools[0].storages["b"].copy_(torch.arange(16, dtype=torch.uint8))
    pools[1].storages["b"].zero_()
    seen = []
    monkeypatch.setattr(graphs_mod, "memcpy", lambda step, src, dst, stream: (seen.append(stream), dst.copy_(src)))
    machine = SimpleNamespace(slices=lambda step, p: Machine.slices(SimpleNamespace(devices=[]), step, p))
    graphs_mod.capture_transfer(machine, CopyStep(0, 1, "b", 4, 9, "cut", (1, 2)), pools, "producer-stream")
    assert seen == ["producer-stream"]
    assert pools[1].storages["b"].tolist() == [0] * 4 + list(range(4, 9)) + [0] * 7


@cpu_only
@pytest.mark.parametrize("name", ["llama"])
def test_a_registry_model_equals_eager_through_the_captured_graph(stand_in_graphs, name):
    """A registry model (tiny): random placements, each with a random micro-batch count in 1..3; every program's
    micro-batches replayed through the captured graph twice (the capturing call, then a graph replay) give the
    outputs the home placement gave while the compiled model matched eager PyTorch."""
    from tests.runtime.test_replay import _recorded_programs

    rng = random.Random(1)
    programs = _recorded_programs(name, 3)
    for seed in range(2):
        for runner, calls in programs:
            placement = random_placement(runner.dag, 2, 2000 + seed)
            runner.set_placement(placement)
            ex = runner.executor
            ex.set_cuda_graphs(True)
            m = rng.randint(1, 3)
            sched = _schedule(runner, placement, m)
            for attempt in range(2):
                with torch.no_grad():
                    got = ex.run_pipelined([list(a) for a, _ in calls[:m]], schedule=sched)
                for k, (g, (_, want)) in enumerate(zip(got, calls)):
                    for j, (gg, ww) in enumerate(zip(g, want)):
                        torch.testing.assert_close(gg, ww, msg=lambda e: f"{name}, placement {seed}, call {attempt}, "
                                                                         f"output {j} of micro-batch {k}: {e}")
            assert ex.replay(sched).replays == 1


@cpu_only
def test_a_replay_that_never_completes_raises_transfer_timeout(stand_in_graphs, monkeypatch):
    from torch_tessera.errors import TransferTimeout
    from torch_tessera.runtime import realize

    model, inputs, template, ex, sched = _captured_executor(3, 2)
    _, batches = _batches(template, inputs, 2)
    with torch.no_grad():
        ex.run_pipelined(batches, schedule=sched)  # the capturing call
    ex.timeout_s = 0.05
    monkeypatch.setattr(devices_mod.CpuEvent, "query", lambda self: False)  # the event after the replay never fires
    monkeypatch.setattr(realize, "SPIN_S", 0.0)
    with pytest.raises(TransferTimeout, match=r"one replay of the CUDA graph over .* did not complete within 0.05 s; "
                                              r"it holds \d+ transfers \(edges \[\("):
        with torch.no_grad():
            ex.run_pipelined(batches, schedule=sched)


@cpu_only
def test_spin_queues_the_cycles_asked_or_says_it_cannot(monkeypatch):
    """compat.torch_cuda.spin (the diagnosis bench queues its timed launches behind it): seconds become clock cycles
    at SPIN_CLOCK_HZ; a torch without ``torch.cuda._sleep`` gets False and nothing queued."""
    from torch_tessera.compat import torch_cuda

    asked = []
    monkeypatch.setattr(torch.cuda, "_sleep", asked.append, raising=False)
    assert torch_cuda.spin(2e-3) and asked == [int(2e-3 * torch_cuda.SPIN_CLOCK_HZ)]
    monkeypatch.delattr(torch.cuda, "_sleep")
    assert torch_cuda.spin(1e-3) is False and len(asked) == 1


def _no_wait(sched):
    """``sched`` with every record and wait dropped (the diagnosis bench's ``no-wait`` mode)."""
    from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule

    streams = tuple(tuple(s for s in st if not isinstance(s, (WaitStep, RecordStep))) for st in sched.streams)
    return PipelinedSchedule(sched.devices, sched.micro_batches, streams, sched.placement, sched.domains,
                             sched.cut_edges, source="no-wait")


@cpu_only
def test_a_replay_in_another_replays_pools_leaves_that_graph_valid(stand_in_graphs):
    """The diagnosis bench's sequence: the schedule captured, then a mode captured in its ``last_pools`` and the
    eager replay run in them, then the first graph replayed again. The second capture must not re-bind a buffer the first graph holds the address of
    (an extern kernel's fresh output: the stand-in raises StaleReplay; a GPU touches freed memory), and the first
    graph's outputs must still be right."""
    from tests.runtime.test_replay import _recorded_programs

    programs = _recorded_programs("llama", 2)
    runner, calls = max(programs, key=lambda p: len(p[0].program.launches))
    placement = random_placement(runner.dag, 2, 2001)
    runner.set_placement(placement)
    ex = runner.executor
    ex.set_cuda_graphs(True)
    sched = _schedule(runner, placement, 2)
    batches = [list(a) for a, _ in calls[:2]]
    executed = ex.replay(sched, captured=True)
    with torch.no_grad():
        executed.run(batches)
        executed.run(batches)
        ex.replay(_no_wait(sched), check=False, captured=True).run(batches, executed.last_pools)
        ex.replay(sched, captured=False).run(batches, executed.last_pools)  # the eager mode, as the bench's
        got = executed.run(batches)
    for k, (g, (_, want)) in enumerate(zip(got, calls)):
        for j, (gg, ww) in enumerate(zip(g, want)):
            torch.testing.assert_close(gg, ww, msg=lambda e: f"output {j} of micro-batch {k}: {e}")


@cpu_only
def test_on_step_names_each_stage_of_the_capturing_call_and_of_each_replay(stand_in_graphs):
    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    stages = []
    replay.on_step = lambda stage: stages.append((stage, replay.captures, replay.replays))
    for call in range(3):
        _, batches = _batches(template, inputs, 2, seed=call)
        with torch.no_grad():
            replay.run(batches)
    assert stages == [("bind", 0, 0), ("warm-up", 0, 0), ("capture", 1, 0), ("replay", 1, 1), ("replay", 1, 2)]


def _real_partition_replay(seed):
    """An MLP compiled on two CUDA devices (``TESSERA_TEST_CUDA_PAIR``, default two partitions of cuda:0), a random
    placement, 2 micro-batches: ``(model, template, x0, replay)``, the replay captured on its first call."""
    import os

    from tests.conftest import RecordingBackend
    from torch_tessera.models import MLP
    from torch_tessera.scheduler.modulo import build_pipelined_schedule

    torch.manual_seed(0)
    model = MLP(32, 64).cuda().eval()
    x0 = torch.randn(8, 32, device="cuda")
    torch._dynamo.reset()
    backend = RecordingBackend(devices=os.environ.get("TESSERA_TEST_CUDA_PAIR", "cuda:0@104sm,cuda:0@24sm"),
                               policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(x0)
    runner = max(backend.executors, key=lambda r: len(r.program.launches))
    seen: list = []
    run = runner.executor.run
    runner.executor.run = lambda a: (seen.append(list(a)), run(a))[1]
    with torch.no_grad():
        compiled(x0)
    del runner.executor.run
    template = seen[0]
    placement = random_placement(runner.dag, 2, seed)
    runner.set_placement(placement)
    ex = runner.executor
    sched = build_pipelined_schedule(runner.dag, placement, 2, domains=ex.domains, devices=len(ex.devices))
    replay = ex.replay(sched, captured=True)
    assert isinstance(replay, CapturedReplay)
    return model, template, x0, replay


@pytest.mark.skipif(TEST_DEVICE != "cuda" or not torch.cuda.is_available(), reason="a real CUDA graph capture")
@pytest.mark.parametrize("seed", [0, 1])
def test_real_capture_on_two_partitions_equals_eager(seed):
    """The real thing: the capturing call and three graph replays with fresh inputs equal eager PyTorch, with one
    capture, no fallback; synchronized after every call (a CUDA error surfaces in the call that caused it)."""
    model, template, x0, replay = _real_partition_replay(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for call in range(4):
        xs = [torch.randn(8, 32, device="cuda", generator=gen) for _ in range(2)]
        batches = [[x if a is x0 else a for a in template] for x in xs]
        with torch.no_grad():
            got = replay.run(batches)
            torch.cuda.synchronize()
            for k, (x, g) in enumerate(zip(xs, got)):
                torch.testing.assert_close(g[0], model(x), msg=lambda e: f"call {call}, micro-batch {k}: {e}")
    assert (replay.captures, replay.replays, replay.fallback) == (1, 3, False)


@pytest.mark.skipif(TEST_DEVICE != "cuda" or not torch.cuda.is_available(), reason="a real CUDA graph capture")
def test_replays_on_one_gpu_return_at_once_ordered_on_the_callers_stream():
    """On partitions of one GPU (one memory domain) a call does not wait for its replay on the host: queued behind
    50 ms of spin on the caller's stream, the call returns while the caller's stream is still busy. Calls issued back
    to back with fresh inputs and no synchronisation, each input freed right after its call, still equal eager:
    the replay waits for the caller's stream and the caller's stream for the replay."""
    from torch_tessera.compat import torch_cuda

    model, template, x0, replay = _real_partition_replay(0)
    if len({str(d.torch_device) for d in replay.executor.devices}) > 1:
        pytest.skip("TESSERA_TEST_CUDA_PAIR names two GPUs: those calls wait on the host")
    assert replay.host_wait is False
    with torch.no_grad():
        replay.run([[x0 if a is x0 else a for a in template]] * 2)  # the capturing call
    torch.cuda.synchronize()
    if not torch_cuda.spin(0.05):
        pytest.skip("this torch has no torch.cuda._sleep")
    with torch.no_grad():
        replay.run([[x0 if a is x0 else a for a in template] for _ in range(2)])
    assert not torch.cuda.current_stream().query(), "the call waited on the host for its replay"
    gen = torch.Generator(device="cuda").manual_seed(1)
    got, want = [], []
    with torch.no_grad():
        for call in range(6):
            xs = [torch.randn(8, 32, device="cuda", generator=gen) for _ in range(2)]
            want.append([model(x) for x in xs])
            got.append(replay.run([[x if a is x0 else a for a in template] for x in xs]))
            del xs  # the caller frees its inputs at once; the allocator may hand their memory out again
            torch.empty(8, 32, device="cuda").fill_(float("nan"))
    torch.cuda.synchronize()
    for call, (g, w) in enumerate(zip(got, want)):
        for k in range(2):
            torch.testing.assert_close(g[k][0], w[k], msg=lambda e: f"call {call}, micro-batch {k}: {e}")


@cpu_only
def test_only_calls_over_one_memory_domain_skip_the_host_wait(stand_in_graphs, monkeypatch):
    """CPU virtual devices are separate memory domains: the call waits for its replay on the host (a replay that
    never completes raises TransferTimeout: the test above). A replay marked as one domain returns without querying
    its completion event, and its outputs are right."""
    from torch_tessera.runtime import realize

    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    assert replay.host_wait is True
    xs, batches = _batches(template, inputs, 2)
    with torch.no_grad():
        replay.run(batches)  # the capturing call
    replay.host_wait = False
    ex.timeout_s = 0.05
    monkeypatch.setattr(devices_mod.CpuEvent, "query", lambda self: False)
    monkeypatch.setattr(realize, "SPIN_S", 0.0)
    with torch.no_grad():
        got = replay.run(batches)
    assert replay.replays == 1
    for x, g in zip(xs, got):
        torch.testing.assert_close(g[0], model(*x))


@cpu_only
def test_the_input_fingerprint_does_not_keep_a_dropped_input_alive():
    """The fast input check watches the last fully checked call's tensors through weak references: a tensor the
    caller drops (a finished request's KV cache) is freed at once, and a call with a new tensor is checked in full."""
    import gc
    import weakref

    from torch_tessera.runtime.inputcheck import CheckedInputs

    checked = CheckedInputs(lambda batches: [list(b) for b in batches])
    cache = torch.zeros(4, 4)
    batches, fast = checked([[cache, 3]])
    checked.confirm(batches)
    assert checked([[cache, 3]])[1] is True and checked.full_checks == 1
    gone = weakref.ref(cache)
    del cache, batches
    gc.collect()
    assert gone() is None, "the input check kept the dropped tensor alive"
    assert checked([[torch.zeros(4, 4), 3]])[1] is False and checked.full_checks == 2
    assert checked([[torch.zeros(4, 4), 4]])[1] is False


@cpu_only
def test_the_fast_input_check_still_catches_a_moved_or_reshaped_input(stand_in_graphs):
    """After a full check, a call with the very same weights takes the fast path (no full check). A weight moved or
    reshaped at the same address (the same object: ``p.data = ...``) is checked in full again: moved, the graph is
    captured again and the outputs equal eager; reshaped, it is refused by name. A copied input (new tensors each
    call are fine) is checked at every call: reshaped in place, or a new tensor of a shape ``copy_`` would broadcast
    (before, the graph replayed it silently), it is refused by name."""
    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    xs, batches = _batches(template, inputs, 2)
    with torch.no_grad():
        replay.run(batches)  # capture: checked in full
        replay.run(batches)
        replay.run(batches)
    assert replay.checked.full_checks == 1 and replay.replays == 2  # the capturing call only
    weight = next(a for a in batches[0] if isinstance(a, torch.Tensor) and a.requires_grad)
    w = next(i for i, a in enumerate(batches[0]) if a is weight)
    weight.data = weight.data.clone()  # moved, same object (a raw-address graph would read freed memory)
    with torch.no_grad():
        got = replay.run(batches)
    assert replay.checked.full_checks == 2 and replay.captures == 2
    for x, g in zip(xs, got):
        torch.testing.assert_close(g[0], model(*x))
    kept = weight.data
    weight.data = kept.view(1, *kept.shape)  # reshaped at the same address
    with torch.no_grad(), pytest.raises(TesseraError, match=rf"micro-batch 0: input {w} .* has shape \(1, "):
        replay.run(batches)
    assert replay.checked.full_checks == 3
    weight.data = kept
    k = next(i for i, a in enumerate(batches[0]) if isinstance(a, torch.Tensor) and not a.requires_grad)
    with torch.no_grad():
        got = replay.run(batches)  # as the last call that passed: the fast path again
        assert replay.checked.full_checks == 3
        for x, g in zip(xs, got):
            torch.testing.assert_close(g[0], model(*x))
        batches[1][k].unsqueeze_(0)  # a copied input reshaped in place, same object and address
        with pytest.raises(TesseraError, match=rf"micro-batch 1: input {k} .* has shape \(1, 8, 32\).*lowered"):
            replay.run(batches)
        batches[1][k].squeeze_(0)
        batches[1][k] = batches[1][k][:1]  # another tensor, a shape copy_ would broadcast
        with pytest.raises(TesseraError, match=rf"micro-batch 1: input {k} .* has shape \(1, 32\)"):
            replay.run(batches)


@cpu_only
def test_calls_of_several_groups_are_checked_in_full_and_equal_eager(stand_in_graphs):
    """A call of two groups of the schedule's micro-batches (each group may bind other state) keeps no fingerprint:
    every such call is checked in full, and each group's outputs equal eager."""
    model, inputs, template, ex, sched = _captured_executor(3, 2)
    replay = ex.replay(sched)
    xs, batches = _batches(template, inputs, 4)
    for call in range(3):
        with torch.no_grad():
            got = replay.run(batches)
        for x, g in zip(xs, got):
            torch.testing.assert_close(g[0], model(*x))
    assert replay.checked.full_checks == 3
