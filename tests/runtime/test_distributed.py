"""The process-per-device runtime: two gloo ranks run a plan that cuts the tiny Llama and match eager, in single calls
and pipelined (micro-batches in flight); a rank that dies or stops answering ends the run on the other rank with
:class:`PeerFailureError` within the timeout, naming the micro-batch in a pipelined run.

Each test launches real processes (``torchrun``, or the same environment set by hand where a test must watch each
rank on its own: torchrun stops every rank as soon as one fails).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TEST_DEVICE
from torch_tessera.target.costs import Topology
from torch_tessera.target.links import NETWORK_FIGURES, build_topology

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.pop("TESSERA_TEST_DEVICE", None)
    return env


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
def test_two_gloo_ranks_run_the_tiny_llama_plan_and_match_eager(tmp_path):
    """One launch checks single calls, then 3 micro-batches with different inputs (run_pipelined: the schedule over
    micro-batches 0 and 1 replayed, then the schedule over micro-batch 2)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "torch_tessera.cli", "dist-run", "--model", "llama",
           "--size", "tiny", "--devices", "cpu:0,cpu:1", "--policy", "random", "--seed", "1", "--timeout", "60",
           "--calls", "2", "--micro-batches", "3", "--slots", "2", "--json", str(tmp_path / "rank{rank}.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["ok"], r0["failures"]
    assert r0["equal_inprocess"]  # bit-identical to the in-process runtime on cpu:0,cpu:1
    assert r0["max_abs_diff_eager"] < 1e-4
    assert r0["cut_edges"] > 0 and r0["launches"] > 0 and r1["launches"] > 0  # both ranks compute
    sent = {tuple(e) for r in (r0, r1) for e in r["cut_edges_sent"]}
    received = {tuple(e) for r in (r0, r1) for e in r["cut_edges_received"]}
    assert len(sent) == r0["cut_edges"] and sent == received  # every cut edge crossed once, nothing else
    assert r0["launches"] + r1["launches"] == r0["total_launches"]
    assert r0["messages"] < r0["ranges"]["cut"]  # ranges with one peer between two launches travel together

    p0, p1 = r0["pipelined"], r1["pipelined"]
    assert p0["failures"] == [] and p0["micro_batches"] == 3 and p0["slots"] == 2
    assert p0["schedule_order"] and p1["schedule_order"]  # each rank ran its device's steps in the schedule's order
    assert p0["equal_inproc_pipelined"] and p0["equal_inproc_single"]  # bit-identical, micro-batch by micro-batch
    assert p0["max_abs_diff_eager"] < 1e-4
    assert p0["cut_edges_per_batch"] == [r0["cut_edges"]] * 3  # transfers == cut edges x micro-batches
    for m in range(3):
        sent = {tuple(e) for p in (p0, p1) for e in p["batch_cut_edges_sent"][m]}
        assert sent == {tuple(e) for p in (p0, p1) for e in p["batch_cut_edges_received"][m]} == received
    per_call = (r0["ranges"]["cut"] + r1["ranges"]["cut"]) // (2 * 2)  # both ends counted, 2 single calls
    assert p0["cut_ranges"] == 3 * per_call


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
def test_two_gloo_ranks_replay_the_plans_own_schedule(tmp_path):
    """``dist-run --policy af``: rank 0's plan carries the schedule its simulator scored (2 micro-batches); both ranks
    replay exactly it for each group of 2 (``--slots`` defaults to the plan's), and only the single calls, over 1
    micro-batch, which the plan has no schedule for, replay a unit-cost one. Every micro-batch equals eager, bitwise
    the in-process replay of the same schedule and the in-process single call, and moves every cut edge once."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "torch_tessera.cli", "dist-run", "--model", "llama",
           "--size", "tiny", "--devices", "cpu:0,cpu:1", "--policy", "af", "--timeout", "60", "--calls", "1",
           "--micro-batches", "4", "--json", str(tmp_path / "rank{rank}.json")]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["ok"], r0["failures"]
    assert r0["schedule_sources"] == r1["schedule_sources"] == {"1": "unit-cost", "2": "plan"}
    p0, p1 = r0["pipelined"], r1["pipelined"]
    assert p0["slots"] == 2 and p0["failures"] == []
    assert p0["schedule_order"] and p1["schedule_order"]  # each rank ran its stream of the plan's schedule, in order
    assert p0["equal_inproc_pipelined"] and p0["equal_inproc_single"] and r0["equal_inprocess"]
    assert p0["max_abs_diff_eager"] < 1e-4 and r0["max_abs_diff_eager"] < 1e-4
    assert r0["cut_edges"] > 0 and p0["cut_edges_per_batch"] == [r0["cut_edges"]] * 4


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
@pytest.mark.parametrize("model", ["mlp", "llama"])
def test_two_gloo_ranks_replay_the_explicit_schedule(tmp_path, model):
    """Two gloo ranks (``tests/runtime/dist_schedule_rank.py``) replay the explicit pipelined schedule of 3 random
    placements x 1..4 micro-batches of the tiny model: each rank runs exactly its device's steps in the schedule's
    order, every micro-batch's outputs equal eager and, bitwise, the in-process replay of the same schedule, and every
    cut edge of every micro-batch is sent once and received once."""
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.runtime.dist_schedule_rank", model,
                                       str(tmp_path / f"rank{rank}.json")], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(r0["cases"]) == len(r1["cases"]) == 12
    assert sorted({c["micro_batches"] for c in r0["cases"]}) == [1, 2, 3, 4]
    assert sum(c["transfers"] > 0 for c in r0["cases"]) >= 8  # most placements cut something
    for c0, c1 in zip(r0["cases"], r1["cases"]):
        where = f"placement {c0['seed']}, {c0['micro_batches']} micro-batches"
        assert c0["order"] and c1["order"], where
        assert c0["steps"] > 0 and c1["steps"] > 0, where  # both ranks run steps
        assert c0["allclose_eager"] and c0["max_abs_diff_eager"] < 1e-4, (where, c0["max_abs_diff_eager"])
        assert c0["equal_inprocess"], where
        for m in range(c0["micro_batches"]):
            sent = {tuple(e) for c in (c0, c1) for e in c["sent"][m]}
            assert sent == {tuple(e) for c in (c0, c1) for e in c["received"][m]}, (where, m)
        assert sum(len(s) for c in (c0, c1) for s in c["sent"]) == c0["transfers"], where


def _launch_rank(rank: int, port: int, args: list[str], log: Path) -> subprocess.Popen:
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
               WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    return subprocess.Popen([sys.executable, "-m", "torch_tessera.cli", "dist-run", *args], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="gloo on CPU virtual devices")
@pytest.mark.parametrize("mode,pipelined", [("exit", False), ("hang", False), ("exit", True), ("hang", True)])
def test_a_failed_rank_ends_the_run_with_an_error_naming_it_within_the_timeout(tmp_path, mode, pipelined):
    """Pipelined: 3 micro-batches on 2 slots after one call; rank 1 exits at its first send of micro-batch 2 (call 3),
    after the first wave (micro-batches 0 and 1) has completed on both ranks."""
    timeout, margin = 4.0, 10.0
    args = ["--model", "mlp", "--devices", "cpu:0,cpu:1", "--policy", "random", "--seed", "0", "--timeout",
            str(timeout), "--calls", "1", "--no-inprocess", "--inject-failure", f"1:{mode}"]
    if pipelined:
        args[-1] += ":3"
        args += ["--micro-batches", "3", "--slots", "2"]
    port = _free_port()
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    procs = [_launch_rank(r, port, args, logs[r]) for r in (0, 1)]
    try:
        t_fault = None
        deadline = time.monotonic() + 240
        while procs[0].poll() is None and time.monotonic() < deadline:
            if t_fault is None:
                marks = [l for l in logs[1].read_text().splitlines() if l.startswith("DIST-RUN-FAULT")]
                if marks:
                    t_fault = float(marks[0].split()[1])
            time.sleep(0.05)
        t_end = time.time()
        if t_fault is None:  # rank 0 may end between two polls, before the loop read rank 1's mark: read it now
            marks = [l for l in logs[1].read_text().splitlines() if l.startswith("DIST-RUN-FAULT")]
            t_fault = float(marks[0].split()[1]) if marks else None
        out0 = logs[0].read_text()
        assert procs[0].returncode == 2, out0[-3000:] + logs[1].read_text()[-2000:]
        assert t_fault is not None, logs[1].read_text()[-3000:]
        error = next(l for l in out0.splitlines() if l.startswith("tessera dist-run: error:"))
        assert "rank 0" in error and "rank 1 failed" in error, error
        assert "launch" in error and "buffer" in error, error  # the edge: launches, kernels, buffer range
        assert ("in micro-batch 2" in error) == pipelined, error
        elapsed = t_end - t_fault
        assert elapsed < timeout + margin, (elapsed, error)
        if mode == "hang":
            assert f"no answer within {timeout:g} s" in error, error
            assert elapsed >= timeout - 0.5, elapsed
        else:
            assert "connection failed" in error, error
            assert procs[1].wait(timeout=30) == 17
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_hosts_put_a_network_link_between_devices_on_different_hosts():
    devices = ["sim:h200", "sim:h200", "sim:h200"]
    one = build_topology(devices)
    two = build_topology(devices, hosts=["a", "a", "b"])
    net = NETWORK_FIGURES["rdma400"]
    assert two.bandwidth[0, 1] == one.bandwidth[0, 1] > net.bandwidth  # same host: NVLink, as before
    assert two.bandwidth[0, 2] == two.bandwidth[2, 1] == net.bandwidth
    assert two.latency[1, 2] == net.latency
    assert two.same_host(0, 1) and not two.same_host(1, 2) and one.same_host(0, 2)
    assert two.transfer_seconds(0, 2, 64 << 20) > 5 * two.transfer_seconds(0, 1, 64 << 20)
    assert "across hosts" in two.source and two.hosts == ("a", "a", "b")


def test_the_scheduler_prices_cross_host_hops():
    """A kernel chain where the second device is faster for half the kernels: a fast link lets the plan use it, a
    slow network link makes the hops cost more than they save."""
    from torch_tessera.scheduler import plan
    from torch_tessera.scheduler.synthetic import roofline_costs, transformer_dag

    dag = transformer_dag(layers=2, tokens=64, hidden=1024)
    costs = roofline_costs(dag, ["big", "small"])
    fast = Topology.uniform(costs.devices, 350e9, 20e-6)
    slow = Topology(costs.devices, np.full((2, 2), 1e6), np.full((2, 2), 1e-3), hosts=("a", "b"))
    p_fast = plan(dag, costs, fast, policy="latency", cache_dir=False, time_limit=5)
    p_slow = plan(dag, costs, slow, policy="latency", cache_dir=False, time_limit=5)
    assert p_slow.predicted_seconds >= p_fast.predicted_seconds
    placement = next(iter(p_slow.placements.values()))
    assert len(set(placement.values())) == 1  # across a 1 MB/s, 1 ms link nothing is worth cutting


@pytest.mark.skipif(not os.environ.get("TESSERA_BENCH_DRY_RUN"), reason="~1-2 min on 2 cores: set TESSERA_BENCH_DRY_RUN=1")
def test_gpu_distributed_bench_dry_runs_on_cpu(tmp_path):
    """bench/gpu_distributed.py with --cpu: gloo, cpu:0/cpu:1, the interpreter, tiny dims; everything but the GPUs."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(ROOT / "bench" / "gpu_distributed.py"), "--cpu", "--out",
           str(tmp_path), "--layers", "1", "--batch", "4", "--repeats", "1", "--hop-repeats", "2", "--timeout", "60",
           "--micro-batches", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads((tmp_path / "distributed.json").read_text())
    assert {r["placement"] for r in out["plans"]} == {"home", "af"}
    assert all(r["bitwise_equal_inprocess"] for r in out["plans"])
    assert next(r for r in out["plans"] if r["placement"] == "af")["cut_edges"] > 0
    assert len(out["hops"]) == 6 and (tmp_path / "distributed.md").exists()
    for r in out["plans"]:  # the pipelined rows: slots 1 and 2, bitwise equal to the in-process run_pipelined
        assert r["pipelined_s1_bitwise_equal_inprocess"] and r["pipelined_s2_bitwise_equal_inprocess"], r
        assert r["dist_pipelined_s2_ms"] > 0 and r["inprocess_pipelined_s1_ms"] > 0


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="CPU virtual devices")
def test_each_rank_lowers_its_stream_of_the_schedule_and_refuses_a_schedule_missing_a_wait():
    """No processes: each rank's replay items are its device's stream of the schedule, in order, with the transfers
    it receives landing at waits (every transfer exactly once, on its destination); a schedule with any one wait
    dropped is refused before anything runs, naming an edge and a micro-batch."""
    import torch

    from tests.runtime.test_replay import _mlp_runner, _without
    from torch_tessera.errors import ScheduleError
    from torch_tessera.runtime.dist_replay import DistReplay, RankWaitRunner
    from torch_tessera.runtime.distributed import DistContext, DistributedExecutor
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.pipeline_schedule import TransferStep, WaitStep

    _, _, runner, _ = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    sched = build_pipelined_schedule(runner.dag, placement, 3, domains=(0, 1), devices=2)
    transfers = sched.steps(TransferStep)
    assert transfers and sched.num_waits
    landed = []
    for rank in (0, 1):
        ctx = DistContext(rank=rank, world_size=2, backend="gloo", device=torch.device("cpu"), timeout_s=1.0)
        ex = DistributedExecutor(runner.program, runner.dag, placement, ctx)
        replay = DistReplay(ex, sched, (None, None))
        assert [it.step for it in replay.items if it.step is not None] == list(sched.streams[rank])
        for it in replay.items:
            if isinstance(it.runner, RankWaitRunner):
                assert isinstance(it.step, WaitStep) and all(t.dst == rank for t in it.runner.lands)
                landed += it.runner.lands
        waits = [(d, i) for d, st in enumerate(sched.streams) for i, s in enumerate(st) if isinstance(s, WaitStep)]
        for d, i in waits:
            with pytest.raises(ScheduleError) as err:
                DistReplay(ex, _without(sched, d, i), (None, None))
            assert err.value.edge is not None and err.value.micro_batch is not None, str(err.value)
    assert sorted(map(repr, landed)) == sorted(map(repr, transfers))
    msgs = {id(m): m for m in replay.messages.values()}.values()  # transfers issued back to back travel together
    assert sum(map(len, msgs)) == len(transfers)
    for m in msgs:
        at = [sched.streams[m[0].src].index(t) for t in m]
        assert at == list(range(at[0], at[0] + len(m))) and len({(t.dst, t.micro_batch) for t in m}) == 1


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="CPU virtual devices")
def test_the_executor_replays_the_plans_schedule_and_builds_unit_cost_ones_only_as_a_logged_fallback(caplog):
    """No processes: with the plan's schedule over 3 micro-batches (costs that order it otherwise than unit costs),
    a group of 3 replays exactly that schedule on each rank; a group of 2 gets a unit-cost schedule, logged and noted
    in ``schedule_sources``. Schedules ranks cannot replay are refused at construction, naming the problem."""
    import logging

    import torch

    from tests.runtime.test_replay import _mlp_runner
    from torch_tessera.errors import ConfigError, TesseraError
    from torch_tessera.runtime.dist_replay import DistReplay
    from torch_tessera.runtime.distributed import DistContext, DistributedExecutor
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.scheduler.modulo import build_pipelined_schedule

    _, _, runner, _ = _mlp_runner()
    placement = random_placement(runner.dag, 2, 3)
    cost = np.random.default_rng(3).uniform(1e-6, 1e-4, (max(runner.dag.graph.nodes) + 1, 2))
    planned = build_pipelined_schedule(runner.dag, placement, 3, costs=cost, domains=(0, 1), devices=2)
    unit = build_pipelined_schedule(runner.dag, placement, 3, domains=(0, 1), devices=2)
    assert planned.streams != unit.streams  # otherwise the order checks below could not tell them apart
    for rank in (0, 1):
        ctx = DistContext(rank=rank, world_size=2, backend="gloo", device=torch.device("cpu"), timeout_s=1.0)
        ex = DistributedExecutor(runner.program, runner.dag, placement, ctx, schedules=(planned,))
        assert ex.schedule_for(3) is planned and ex.schedule_sources == {3: "plan"}
        replay = DistReplay(ex, ex.schedule_for(3), (None, None))  # lowered without process groups
        assert [it.step for it in replay.items if it.step is not None] == list(planned.streams[rank])
        with caplog.at_level(logging.INFO, logger="torch_tessera.runtime.distributed"):
            caplog.clear()
            fallback = ex.schedule_for(2)
        assert fallback.micro_batches == 2 and ex.schedule_sources == {3: "plan", 2: "unit-cost"}
        assert any("unit-cost" in r.getMessage() and "2 micro-batches" in r.getMessage() for r in caplog.records)
    ctx = DistContext(rank=0, world_size=2, backend="gloo", device=torch.device("cpu"), timeout_s=1.0)
    shared = build_pipelined_schedule(runner.dag, placement, 2, domains=(0, 0), devices=2)
    with pytest.raises(TesseraError, match="shared memory domains"):
        DistributedExecutor(runner.program, runner.dag, placement, ctx, schedules=(shared,))
    other = build_pipelined_schedule(runner.dag, random_placement(runner.dag, 2, 4), 2, domains=(0, 1), devices=2)
    with pytest.raises(TesseraError, match="elsewhere than the executor"):
        DistributedExecutor(runner.program, runner.dag, placement, ctx, schedules=(other,))
    with pytest.raises(ConfigError, match="two plan schedules over 3"):
        DistributedExecutor(runner.program, runner.dag, placement, ctx, schedules=(planned, planned))
