"""Pipelined micro-batches on CPU virtual devices: each equals eager and the single call, with its own copies.

Every cut edge is a real copy between separate pools filled with NaN bytes, so a micro-batch reading another's
buffers, a buffer freed before its last use, or a missing copy shows up as a wrong value.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.backend.test_models_equal_eager import StatefulCounter
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from tests.conftest import TEST_DEVICE, RecordingBackend
from torch_tessera.errors import TesseraError
from torch_tessera.models import MLP, build_model
from torch_tessera.runtime.executor import BufferPool
from torch_tessera.runtime.pipelining import make_lanes, plan_waves, schedule_chunks, slot_priorities
from torch_tessera.runtime.placed import PlacedExecutor
from torch_tessera.runtime.runner import random_placement
from torch_tessera.runtime.schedule import LaunchStep, build_schedule, cut_edge_count

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)


def _compile(model, inputs):
    """Compile on two CPU virtual devices; return the runner and the program's input list for ``inputs``."""
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(*inputs)
    runner = backend.executors[0]
    seen = []
    run = runner.executor.run
    runner.executor.run = lambda args: (seen.append(list(args)), run(args))[1]
    with torch.no_grad():
        compiled(*inputs)
    del runner.executor.run
    return runner, seen[0]


def _substitute(template, old, new):
    """``template`` with every tensor that is ``old[i]`` replaced by ``new[i]``."""
    out = list(template)
    for o, n in zip(old, new):
        hits = [i for i, a in enumerate(out) if a is o]
        assert hits, "input not found among the program's inputs"
        for i in hits:
            out[i] = n
    return out


def _check_placements(model, inputs, make_input, placements, counts):
    runner, template = _compile(model, inputs)
    for seed, pl in placements(runner):
        runner.set_placement(pl)
        ex = runner.executor
        n_cut = cut_edge_count(runner.dag, pl)
        for n, slots in counts:
            xs = [make_input(seed * 10 + m) for m in range(n)]
            batches = [_substitute(template, inputs, x) for x in xs]
            cut_before, launches_before = ex.transfers["cut"], ex.launches_executed
            with torch.no_grad():
                got = ex.run_pipelined(batches, slots=slots)
            assert ex.cut_edges_per_batch == [n_cut] * n, (seed, ex.cut_edges_per_batch, n_cut)
            assert ex.transfers["cut"] - cut_before == n * len(ex.schedule.copies("cut"))
            assert ex.launches_executed - launches_before == n * len(runner.program.launches)
            with torch.no_grad():
                for m, (x, b) in enumerate(zip(xs, batches)):
                    msg = lambda e: f"placement {seed}, micro-batch {m} of {n}, {slots} slots: {e}"  # noqa: E731
                    torch.testing.assert_close(got[m][0], model(*x), msg=msg)
                    torch.testing.assert_close(got[m], ex.run(b), msg=msg)
        yield n_cut


def test_tiny_llama_random_placements():
    torch.manual_seed(0)
    model, inputs = build_model("llama", "tiny")

    def placements(runner):
        return [(s, random_placement(runner.dag, 2, s)) for s in (1, 2)]

    cuts = list(_check_placements(model, inputs, lambda s: (torch.randint(0, 256, inputs[0].shape,
                                                                         generator=torch.Generator().manual_seed(s)),),
                                  placements, [(2, 2)]))
    assert all(c > 0 for c in cuts)


def test_mlp_placements_and_slot_counts():
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)

    def placements(runner):
        n = len(runner.program.launches)
        return [(100, {i: i % 2 for i in range(n)})] + [(s, random_placement(runner.dag, 2, s)) for s in (3, 4, 5)]

    cuts = list(_check_placements(model, inputs, lambda s: (torch.randn(8, 32, generator=torch.Generator()
                                                                        .manual_seed(s)),),
                                  placements, [(2, 2), (4, 2), (4, 4), (3, 1)]))
    assert sum(c > 0 for c in cuts) >= 3


def _state_batches(model, x0, template, xs, states):
    return [_substitute(template, [x0, model.state], [x, s]) for x, s in zip(xs, states)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distinct_states_each_updated_as_eager(seed):
    torch.manual_seed(0)
    model = StatefulCounter()
    x0 = torch.randn(4, 16)
    runner, template = _compile(model, (x0,))
    runner.set_placement(random_placement(runner.dag, 2, seed))
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(4, 16, generator=gen) for _ in range(3)]
    states = [torch.randn(16, generator=gen) for _ in range(3)]
    want = []
    for x, s in zip(xs, states):
        eager = copy.deepcopy(model)
        eager.state.copy_(s)
        want.append((eager(x), eager.state.clone()))
    assert len(plan_waves(runner.program, _state_batches(model, x0, template, xs, states), 2)) == 2
    got = runner.executor.run_pipelined(_state_batches(model, x0, template, xs, states), slots=2)
    for (out, state), g, s in zip(want, got, states):
        torch.testing.assert_close(g[0], out)
        torch.testing.assert_close(s, state)  # each micro-batch's own state, updated once


@pytest.mark.parametrize("slots", [2, 3])
def test_shared_state_runs_in_order(slots):
    """With 3 slots, micro-batches 0 and 2 would share a wave: interleaved, 2 would read the cache before 0 wrote."""
    torch.manual_seed(0)
    model = StatefulCounter()
    x0 = torch.randn(4, 16)
    runner, template = _compile(model, (x0,))
    runner.set_placement(random_placement(runner.dag, 2, 7))
    xs = [torch.randn(4, 16) for _ in range(3)]
    shared, own = torch.randn(16), torch.randn(16)
    states = [shared, own, shared]  # micro-batches 0 and 2 write the same cache
    batches = _state_batches(model, x0, template, xs, states)
    waves = plan_waves(runner.program, batches, slots)
    assert [(w.batches, w.barrier) for w in waves] == [((0, 1), False), ((2,), True)]
    eager, eager_own = copy.deepcopy(model), copy.deepcopy(model)
    eager.state.copy_(shared)
    eager_own.state.copy_(own)
    want = [eager(xs[0]), eager_own(xs[1]), eager(xs[2])]  # 2 sees 0's update
    got = runner.executor.run_pipelined(batches, slots=slots)
    for w, g in zip(want, got):
        torch.testing.assert_close(g[0], w)
    torch.testing.assert_close(shared, eager.state)
    torch.testing.assert_close(own, eager_own.state)


def test_issue_is_interleaved_chunk_by_chunk():
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    n = len(runner.program.launches)
    runner.set_placement({i: i % 2 for i in range(n)})
    ex = runner.executor
    ex.trace = []  # every step run, as (kind, step, micro-batch); micro-batch m runs on slot m here
    batches = [_substitute(template, inputs, (torch.randn(8, 32),)) for _ in range(2)]
    with torch.no_grad():
        ex.run_pipelined(batches, slots=2)
    order = [(batch, step.launch) for kind, step, batch in ex.trace if kind == "launch"]
    chunks = schedule_chunks(ex.schedule.steps)
    assert len(chunks) > 2
    want = []
    for start, end in chunks:
        for slot in (0, 1):
            want += [(slot, s.launch) for s in ex.schedule.steps[start:end] if isinstance(s, LaunchStep)]
    assert order == want
    first_of_slot1 = order.index(next(o for o in order if o[0] == 1))
    last_of_slot0 = max(i for i, o in enumerate(order) if o[0] == 0)
    assert first_of_slot1 < last_of_slot0  # slot 1 starts before slot 0 is done


def test_chunks_cover_the_schedule_and_end_in_one_device_segment():
    torch.manual_seed(0)
    runner, _ = _compile(MLP(32, 64).eval(), (torch.randn(8, 32),))
    sched = build_schedule(runner.program, runner.dag, random_placement(runner.dag, 2, 3))
    chunks = schedule_chunks(sched.steps)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(sched.steps)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    for start, end in chunks[:-1]:
        launches = [s for s in sched.steps[start:end] if isinstance(s, LaunchStep)]
        assert launches and len({s.device for s in launches}) == 1
        assert isinstance(sched.steps[end - 1], LaunchStep)


def test_slot_priorities_are_staggered():
    assert slot_priorities(1, -5) == [0]
    assert slot_priorities(2, -5) == [-1, 0]
    assert slot_priorities(4, -5) == [-3, -2, -1, 0]
    assert slot_priorities(8, -5) == [-5, -5, -5, -4, -3, -2, -1, 0]  # clamped to what the device allows
    runner, _ = _compile(MLP(32, 64).eval(), (torch.randn(8, 32),))
    lanes = make_lanes(runner.devices, 3)
    assert [lane.priority for lane in lanes] == [-2, -1, 0]


def test_priority_classes_put_the_urgent_program_ahead_of_the_background_one():
    """Across programs (decode "urgent", prefill "background"): every urgent slot is strictly more urgent than every
    background stream and than a normal program's last slot; an unknown class is refused by the executor, the
    backend option and the helper."""
    from torch_tessera.backend.config import TesseraConfig
    from torch_tessera.errors import ConfigError, TesseraError
    from torch_tessera.measure.execute import program_priorities
    from torch_tessera.runtime.pipelining import single_priority

    for slots in (1, 2, 4, 8):
        urgent, background = slot_priorities(slots, -5, "urgent"), slot_priorities(slots, -5, "background")
        assert max(urgent) < min(background) == 0
        assert max(urgent) < max(slot_priorities(slots, -5))
        assert urgent == sorted(urgent) and min(urgent) >= -5
    assert slot_priorities(4, -5, "urgent") == [-4, -3, -2, -1]
    assert single_priority("urgent", -5) == -1 and single_priority("background", -5) == 0
    from torch_tessera.backend import config
    from torch_tessera.runtime import pipelining

    assert config.PRIORITY_CLASSES == pipelining.PRIORITY_CLASSES  # the option's values are the runtime's
    with pytest.raises(ValueError, match="priority_class"):
        slot_priorities(2, -5, "high")
    runner, _ = _compile(MLP(32, 64).eval(), (torch.randn(8, 32),))
    runner.priority_class = "urgent"
    runner.set_placement({i: i % 2 for i in range(len(runner.program.launches))})
    assert runner.executor.priority_class == "urgent"
    assert [lane.priority for lane in runner.executor.pipeline.lanes(2)] == [-2, -1]  # CPU: CUDA's range assumed
    runner.priority_class = "loud"
    with pytest.raises(TesseraError, match="priority_class"):
        runner.set_placement({i: 0 for i in range(len(runner.program.launches))})
    with pytest.raises(ConfigError, match="priority"):
        TesseraConfig.from_options({"priority": "loud"})
    assert program_priorities({"prefill": 1.0, "decode": 129.0}) == {"prefill": "background", "decode": "urgent"}
    assert program_priorities({"prefill": 1.0, "decode": 129.0}, enabled=False) == {"prefill": "normal",
                                                                                     "decode": "normal"}
    assert program_priorities({"denoise": 50.0}) == {"denoise": "normal"}
    assert program_priorities({"prefill@0": 1.0, "decode@0": 64.0, "prefill@1": 1.0, "decode@1": 64.0}) == {
        "prefill@0": "background", "decode@0": "urgent", "prefill@1": "background", "decode@1": "urgent"}


def test_weights_copied_once_and_must_be_shared():
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    n = len(runner.program.launches)
    runner.set_placement({i: 1 for i in range(n)})  # every weight is needed on device 1
    ex = runner.executor
    batches = [_substitute(template, inputs, (torch.randn(8, 32),)) for _ in range(4)]
    with torch.no_grad():
        ex.run_pipelined(batches, slots=2)
        ex.run_pipelined(batches, slots=2)
    assert ex.transfers["weights"] == len(ex.schedule.setup) > 0
    params = [i for i, s in enumerate(runner.program.inputs)
              if runner.program.buffers[s.buffer].kind.value == "parameter"]
    bad = [list(b) for b in batches[:2]]
    bad[1][params[0]] = bad[1][params[0]].clone()
    with pytest.raises(TesseraError, match="weight input"):
        ex.run_pipelined(bad, slots=2)
    with pytest.raises(TesseraError, match="slots"):
        ex.run_pipelined(batches, slots=0)


def test_shared_memory_domain_frees_after_the_last_use_on_any_device():
    """SM partitions of one GPU share a pool: a buffer must outlive its last use on every device of the domain."""
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    n = len(runner.program.launches)
    placement = {i: i % 2 for i in range(n)}
    ex = PlacedExecutor(runner.program, runner.dag, placement, runner.devices, runner._kernel_objects)
    ex.domains[:] = [0, 0]  # as if cpu:0 and cpu:1 were partitions of one device
    ex.schedule = build_schedule(runner.program, runner.dag, placement, 0, ex.domains)
    ex.placed_pools = ex.make_pools()
    ex.derive_from_schedule()
    freed = []
    free = BufferPool.free
    BufferPool.free = lambda self, name: (freed.append(name), free(self, name))[1]
    try:
        xs = [(torch.randn(8, 32),) for _ in range(3)]
        with torch.no_grad():
            got = ex.run_pipelined([_substitute(template, inputs, x) for x in xs], slots=2)
            for x, g in zip(xs, got):
                torch.testing.assert_close(g[0], model(*x))
    finally:
        BufferPool.free = free
    assert freed  # temporaries were freed (after their last use), not kept to the end


def test_graph_slots_logic_with_a_stand_in_graph(stand_in_graphs):
    """The per-slot static pools, input copies, shared weights, output copies and slot reuse of the CUDA-graph path,
    run on CPU with the pointer-faithful stand-in graph (``tests/runtime/graph_stand_in.py``)."""
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    n = len(runner.program.launches)
    for placement in ({i: i % 2 for i in range(n)}, random_placement(runner.dag, 2, 11), {i: 1 for i in range(n)}):
        ex = PlacedExecutor(runner.program, runner.dag, placement, runner.devices, runner._kernel_objects)
        ex.set_cuda_graphs(True)
        for call in range(2):
            xs = [(torch.randn(8, 32),) for _ in range(5)]
            with torch.no_grad():
                got = ex.run_pipelined([_substitute(template, inputs, x) for x in xs], slots=2)
                for m, (x, g) in enumerate(zip(xs, got)):
                    torch.testing.assert_close(g[0], model(*x), msg=lambda e: f"call {call}, micro-batch {m}: {e}")
            assert ex.cut_edges_per_batch == [cut_edge_count(runner.dag, placement)] * 5
        assert ex.captures == 2  # one per slot, reused by the second call and by later waves
        assert ex.transfers["weights"] == len(ex.schedule.setup)  # placed once, shared by both slots


def test_waves_and_the_explicit_schedule_replay_compute_the_same_bytes():
    """The wave driver (``run_pipelined(batches, slots)``) and the replay of the placement's explicit schedule over
    ``slots`` micro-batches (``run_pipelined(batches, schedule=...)``), over the same 2 x ``slots`` micro-batches of
    random MLP placements: bitwise-equal outputs, the same cut edges for EVERY micro-batch of the run (both groups)
    and the same cut bytes moved."""
    from torch_tessera.scheduler.modulo import build_pipelined_schedule

    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    cut_any = 0
    for seed in (3, 4, 5):
        placement = random_placement(runner.dag, 2, seed)
        runner.set_placement(placement)
        ex = runner.executor
        n_cut = cut_edge_count(runner.dag, placement)
        cut_any += n_cut > 0
        for slots in (1, 2, 3):
            n = 2 * slots
            xs = [(torch.randn(8, 32, generator=torch.Generator().manual_seed(100 * seed + m)),) for m in range(n)]
            batches = [_substitute(template, inputs, x) for x in xs]
            sched = build_pipelined_schedule(runner.dag, placement, slots, domains=ex.domains, devices=2)
            runs = {}
            for how in ("waves", "schedule"):
                before = ex.machine.counters.bytes_moved["cut"]
                with torch.no_grad():
                    got = (ex.run_pipelined(batches, slots=slots) if how == "waves"
                           else ex.run_pipelined(batches, schedule=sched))
                runs[how] = (got, list(ex.cut_edges_per_batch), ex.machine.counters.bytes_moved["cut"] - before)
            (waves, w_edges, w_bytes), (replayed, r_edges, r_bytes) = runs["waves"], runs["schedule"]
            where = f"placement {seed}, {slots} slots"
            assert w_edges == r_edges == [n_cut] * n, (where, w_edges, r_edges)
            assert w_bytes == r_bytes, (where, w_bytes, r_bytes)
            for m in range(n):
                assert all(torch.equal(a, b) for a, b in zip(waves[m], replayed[m])), (where, m)
                torch.testing.assert_close(waves[m][0], model(*xs[m]))
    assert cut_any >= 2
