"""The runtime replays an explicit pipelined schedule exactly, and what it computes equals eager PyTorch.

On CPU virtual devices every device has its own pools, fresh allocations are NaN bytes and every step runs when the
host issues it, so the executed order can be recorded step by step, and a schedule that lets a consumer run before
its producer's bytes arrived gives a wrong value.
"""

from __future__ import annotations

import os
import random
import time

import pytest
import torch

from tests.conftest import TEST_DEVICE
from tests.runtime.test_pipelining import _compile, _substitute
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.errors import ScheduleError, TesseraError, TransferTimeout
from torch_tessera.models import MLP, REGISTRY, build_model, get_model
from torch_tessera.runtime.replay import issue_order
from torch_tessera.runtime.runner import random_placement
from torch_tessera.scheduler.modulo import build_pipelined_schedule
from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RunStep, TransferStep, WaitStep

if TEST_DEVICE != "cpu":
    pytest.skip("CPU virtual devices only", allow_module_level=True)

#: random placements per registry model (each with a random micro-batch count in 1..4, fixed seeds). 100 per model
#: take too long in Triton's interpreter on a shared 2-core machine; TESSERA_REPLAY_PLACEMENTS=100 runs the full set
PLACEMENTS = int(os.environ.get("TESSERA_REPLAY_PLACEMENTS", "4"))


def _mlp_runner():
    torch.manual_seed(0)
    model = MLP(32, 64).eval()
    inputs = (torch.randn(8, 32),)
    runner, template = _compile(model, inputs)
    return model, inputs, runner, template


def _batches(template, inputs, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(8, 32, generator=gen),) for _ in range(n)]
    return xs, [_substitute(template, inputs, x) for x in xs]


def _schedule(runner, placement, m):
    ex = runner.executor
    return build_pipelined_schedule(runner.dag, placement, m, domains=ex.domains, devices=len(ex.devices))


@pytest.mark.parametrize("host_order", ["round-robin", "lazy:0", "lazy:1"])
def test_executed_order_equals_the_schedule(host_order):
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    ex = runner.executor
    sched = _schedule(runner, placement, 3)
    assert sched.num_waits > 0 and sched.steps(TransferStep)
    xs, batches = _batches(template, inputs, 3)
    ex.trace = []
    with torch.no_grad():
        got = ex.replay(sched, host_order=host_order).run(batches)
    kinds = {"run": RunStep, "transfer": TransferStep, "record": None, "wait": WaitStep}
    executed = [step for kind, step, _ in ex.trace if kind in kinds]
    assert executed == issue_order(sched, host_order)  # the host issued exactly the schedule's steps, in this order
    for d in range(sched.devices):  # and per device exactly the schedule's stream, in its order
        assert [s for s in executed if s.device == d] == list(sched.streams[d])
    for x, g in zip(xs, got):
        torch.testing.assert_close(g[0], model(*x))
    assert ex.cut_edges_per_batch == [len([e for e in sched.steps(TransferStep) if e.micro_batch == m])
                                      for m in range(3)]


def _planned(runner, micro_batches):
    """The throughput plan of the runner's DAG on two CPU virtual devices (random costs; the first launch pinned to
    device 0, the last to device 1, so it cuts), installed on the runner."""
    import numpy as np

    from torch_tessera.scheduler import plan
    from torch_tessera.target.costs import CostTable, Topology

    nodes = sorted(runner.dag.graph.nodes)
    devs = ("cpu:0", "cpu:1")
    costs = CostTable(devs, tuple(nodes), np.random.default_rng(3).uniform(1e-6, 1e-4, (len(nodes), 2)), "random")
    p = plan(runner.dag, costs, Topology.uniform(devs, 50e9, 5e-6), pins={nodes[0]: 0, nodes[-1]: 1},
             micro_batches=micro_batches, cache_dir=False)
    runner.set_placement(dict(p.placement), plan=p)
    return p


@pytest.mark.parametrize("host_order", ["round-robin", "lazy:1"])
def test_executed_order_equals_the_plans_schedule(host_order, caplog):
    """The runner replays the schedule its plan carries (the one the simulator scored), step for step in the order
    it lists, and computes what eager computes; a micro-batch count the plan has no schedule for gets a unit-cost
    schedule of the placement, logged."""
    import logging

    model, inputs, runner, template = _mlp_runner()
    p = _planned(runner, 3)
    sched = runner.schedule_for(3)
    assert sched is p.schedule_of() and sched.num_waits > 0
    ex = runner.executor
    xs, batches = _batches(template, inputs, 3, seed=7)
    ex.trace = []
    with torch.no_grad():
        got = ex.run_pipelined(batches, schedule=sched) if host_order == "round-robin" else \
            ex.replay(sched, host_order=host_order).run(batches)
    kinds = {"run", "transfer", "record", "wait"}
    executed = [step for kind, step, _ in ex.trace if kind in kinds]
    assert executed == issue_order(sched, host_order)
    for d in range(sched.devices):
        assert [s for s in executed if s.device == d] == list(sched.streams[d])
    for x, g in zip(xs, got):
        torch.testing.assert_close(g[0], model(*x))
    with caplog.at_level(logging.INFO, logger="torch_tessera.runtime.runner"):
        other = runner.schedule_for(2)
    assert other.micro_batches == 2 and "unit-cost" in caplog.text
    assert other == _schedule(runner, dict(p.placement), 2)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` over a copy of its whole storage: same sizes, strides and storage offset (a view the program was
    lowered for keeps its layout)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage().clone(), t.storage_offset(),
                                                               t.size(), t.stride())


def _recorded_programs(name: str, n: int):
    """Registry model ``name`` (tiny) compiled on two CPU virtual devices, everything on device 0; called on ``n``
    fresh inputs, each checked against eager. Returns ``(runner, [(program args, program outputs)] per call)`` for
    every compiled program (a model with graph breaks has several): the micro-batches to replay and what they
    must give."""
    from tests.conftest import RecordingBackend

    torch.manual_seed(0)
    model, inputs = build_model(name, "tiny")
    spec = get_model(name)
    torch._dynamo.reset()
    backend = RecordingBackend(devices="cpu:0,cpu:1", policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(*inputs)
    calls = {id(r): [] for r in backend.executors}
    for r in backend.executors:
        run = r.executor.run
        program = r.program
        fresh = [isinstance(a, TensorArg) and program.buffers[a.buffer].kind == BufferKind.INPUT
                 and a.buffer not in program.static_inputs for a in program.inputs]  # per-call inputs: kept apart

        def record(args, run=run, seen=calls[id(r)], fresh=fresh):
            args = [_copy(a) if f and isinstance(a, torch.Tensor) else a for a, f in zip(args, fresh)]
            out = run(list(args))
            seen.append((args, [o.clone() if isinstance(o, torch.Tensor) else o for o in out]))
            return out

        r.executor.run = record
    with torch.no_grad():
        for k in range(n):
            x = spec.example_inputs("tiny", seed=1 + k)
            torch.testing.assert_close(compiled(*x), model(*x), msg=lambda e: f"{name}, home placement: {e}")
    for r in backend.executors:
        del r.executor.run
    return [(r, calls[id(r)]) for r in backend.executors if calls[id(r)]]


def test_every_registry_model_equals_eager_under_random_placements_and_micro_batches():
    """PLACEMENTS random placements per registry model, each with a random micro-batch count in 1..4, replayed as
    the modulo scheduler's schedule (round-robin host order). Each program's micro-batches are the inputs it got
    while the compiled model (everything on one device) computed what eager computes on 4 fresh inputs; the replay
    must give the outputs it gave then, micro-batch by micro-batch."""
    rng = random.Random(0)
    report = {}
    for name in sorted(REGISTRY):
        t0 = time.perf_counter()
        programs = _recorded_programs(name, 4)
        t1 = time.perf_counter()
        cuts = 0
        for seed in range(PLACEMENTS):
            for runner, calls in programs:
                placement = random_placement(runner.dag, 2, 1000 + seed)
                runner.set_placement(placement)
                m = rng.randint(1, 4)
                sched = _schedule(runner, placement, m)
                with torch.no_grad():
                    got = runner.executor.run_pipelined([list(a) for a, _ in calls[:m]], schedule=sched)
                for k, (g, (_, want)) in enumerate(zip(got, calls)):
                    for j, (gg, ww) in enumerate(zip(g, want)):
                        torch.testing.assert_close(gg, ww, msg=lambda e: f"{name}, placement {seed}, output {j} of "
                                                                         f"micro-batch {k} of {m}: {e}")
                cuts += bool(sched.steps(TransferStep))
        assert cuts >= PLACEMENTS // 2, f"{name}: only {cuts} placements cut anything"
        report[name] = (round(t1 - t0), round(time.perf_counter() - t1))
        print(f"{name}: {len(programs)} programs, compile {report[name][0]} s, {PLACEMENTS} placements replayed in "
              f"{report[name][1]} s", flush=True)
    print(f"replayed {PLACEMENTS} placements per model; seconds (compile, replays): {report}")


def _without(sched: PipelinedSchedule, d: int, i: int) -> PipelinedSchedule:
    streams = list(sched.streams)
    streams[d] = streams[d][:i] + streams[d][i + 1:]
    return PipelinedSchedule(sched.devices, sched.micro_batches, tuple(streams), sched.placement, sched.domains,
                             sched.cut_edges, source="mutant")


def test_dropping_any_wait_is_refused_or_computes_a_wrong_value():
    """Mutation test: every wait of the schedule dropped in turn. The executor refuses each mutant before it runs
    (ScheduleError naming an edge and micro-batch); run unchecked, a mutant whose wait covered a RAW edge with
    bytes computes a wrong value in at least one host order (the consumer's device runs ahead)."""
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    ex = runner.executor
    sched = _schedule(runner, placement, 2)
    xs, batches = _batches(template, inputs, 2, seed=5)
    with torch.no_grad():
        want = [model(*x) for x in xs]
    graph = runner.dag.graph
    mutants = [(d, i, s) for d, st in enumerate(sched.streams) for i, s in enumerate(st) if isinstance(s, WaitStep)]
    assert len(mutants) >= 2
    wrong = 0
    for d, i, wait in mutants:
        mutant = _without(sched, d, i)
        with pytest.raises(ScheduleError) as err:
            ex.replay(mutant)
        assert err.value.edge is not None and err.value.micro_batch is not None, str(err.value)
        raw = any("RAW" in graph.edges[e]["kinds"] and graph.edges[e]["ranges"] for e in wait.edges)
        results = []
        for order in ("lazy:0", "lazy:1"):
            with torch.no_grad():
                got = ex.replay(mutant, check=False, host_order=order).run(batches)
            results.append(all(torch.allclose(g[0], w, equal_nan=False) for g, w in zip(got, want)))
        if raw:
            assert not all(results), f"dropping wait {wait} (device {d}) went unnoticed"
            wrong += 1
    assert wrong > 0


def test_a_wait_that_never_completes_names_its_edge_and_micro_batch(monkeypatch):
    from torch_tessera.runtime import realize, replay

    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    ex = runner.executor
    ex.timeout_s = 0.05
    sched = _schedule(runner, placement, 2)
    _, batches = _batches(template, inputs, 2)
    monkeypatch.setattr(replay._HostEvent, "query", lambda self: False)
    monkeypatch.setattr(realize, "SPIN_S", 0.0)
    with pytest.raises(TransferTimeout, match=r"edges \[\(\d+, \d+\).*\] of micro-batch \d\) did not complete within"):
        with torch.no_grad():
            ex.run_pipelined(batches, schedule=sched)


def test_bad_replays_are_refused():
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    ex = runner.executor
    sched = _schedule(runner, placement, 2)
    _, batches = _batches(template, inputs, 3)
    with pytest.raises(TesseraError, match="multiple of 2"):
        ex.run_pipelined(batches, schedule=sched)
    other = {n: 1 - d for n, d in placement.items()}
    with pytest.raises(TesseraError, match="elsewhere than the executor"):
        ex.run_pipelined(batches[:2], schedule=_schedule(runner, other, 2))


def test_debug_trace_prints_bytes_and_bandwidth_of_each_transfer(caplog):
    model, inputs, runner, template = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    runner.set_placement(placement)
    sched = _schedule(runner, placement, 2)
    _, batches = _batches(template, inputs, 2)
    with caplog.at_level("DEBUG", logger="torch_tessera.runtime"), torch.no_grad():
        runner.executor.run_pipelined(batches, schedule=sched)
        runner.executor.run(batches[0])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("transfer ")]
    assert len(lines) >= len(sched.steps(TransferStep))
    assert all(" bytes in " in x and "GB/s" in x for x in lines)
    assert any("of micro-batch 1" in x for x in lines)
