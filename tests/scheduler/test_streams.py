"""Replicated workloads (request streams): each stream's own state, request-dist as a point of the search space, and
the plan against every placement enumerated."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import MB, random_costs, random_dag, topo
from torch_tessera.lowering.program import BufferKind
from torch_tessera.target.costs import CostTable
from torch_tessera.scheduler import Workload, WorkloadProgram, plan
from torch_tessera.scheduler.evaluate import cycle_seconds
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.synthetic import SynthKernel, _buf, dag_from_kernels


def _stateful_dag():
    """k0 reads a weight and writes the state (a KV cache), k1 reads the state, k2 reads k1's output."""
    buffers: dict = {}
    w = _buf(buffers, "w", BufferKind.PARAMETER, 50 * MB)
    state = _buf(buffers, "kv", BufferKind.STATE, 2 * MB)
    t1 = _buf(buffers, "t1", BufferKind.TEMP, 4000)
    t2 = _buf(buffers, "t2", BufferKind.TEMP, 4000)
    ks = [SynthKernel("update", "elementwise", [w], [state], 0.0),
          SynthKernel("attn", "attention", [state], [t1], 0.0),
          SynthKernel("proj", "gemm", [t1, w], [t2], 0.0)]
    return dag_from_kernels(ks, buffers)


def _two_devices_costs(dag, slow: float = 3.0) -> CostTable:
    """d1 is ``slow`` times slower than d0 on every kernel but attention, where they are equal."""
    nodes = sorted(dag.graph.nodes)
    c = np.array([[1e-3, 1e-3 if dag.node(k).op_class == "attention" else slow * 1e-3] for k in nodes])
    return CostTable(("d0", "d1"), tuple(nodes), c)


def test_shares_and_names():
    dag = random_dag(3, 0)
    wl = Workload.single(dag, random_costs(dag, 2, 0))
    rep = wl.replicated([0.75, 0.25])
    assert [p.name for p in rep.programs] == ["main", "main@1"]
    assert [p.stream for p in rep.programs] == [0, 1] and rep.streams == 2
    assert [p.frequency for p in rep.programs] == [0.75, 0.25]
    for bad in ([1.0], [0.5, 0.6], [-0.5, 1.5]):
        with pytest.raises(ValueError, match="shares"):
            wl.replicated(bad)
    with pytest.raises(ValueError, match="already replicated"):
        rep.replicated([0.5, 0.5])


def test_each_stream_owns_its_state_weights_shared():
    dag = _stateful_dag()
    wl = Workload((WorkloadProgram("decode", dag, _two_devices_costs(dag), 1.0, "decode"),)).replicated([0.5, 0.5])
    pb = compile_problem(as_workload(wl, None), topo(2))
    names = {r.name: r.kind for r in pb.resident}
    assert names["kv"] == "state" and names["kv@1"] == "state"  # two caches ...
    assert "w" in names and "w@1" not in names  # ... one set of weights
    # request-dist: stream r on device r; stream 1's cache writer is not tied to stream 0's
    place = np.asarray(pb.streams)[pb.prog]
    assert pb.group[pb.prog == 0].max() < pb.group[pb.prog == 1].min()
    mem = __import__("torch_tessera.scheduler.evaluate", fromlist=["memory"]).memory(pb, place)
    assert mem["state"].tolist() == [2 * MB, 2 * MB] and mem["weight"].tolist() == [50 * MB, 50 * MB]


def _brute_best(pb):
    best = np.inf
    for combo in itertools.product(range(pb.D), repeat=pb.n):
        place = np.array(combo, dtype=np.int64)
        if all(len(set(place[pb.group == g])) == 1 for g in np.unique(pb.group)):
            best = min(best, cycle_seconds(pb, place))
    return best


@pytest.mark.parametrize("shares", [(0.5, 0.5), (0.75, 0.25)])
def test_replicated_plan_matches_brute_force_and_never_loses_to_request_dist(shares):
    dag = _stateful_dag()
    wl = Workload((WorkloadProgram("decode", dag, _two_devices_costs(dag), 1.0, "decode"),)).replicated(shares)
    tp = topo(2, bw=1e10, lat=1e-6)
    p = plan(wl, None, tp, policy="throughput", cache_dir=False)
    pb = compile_problem(as_workload(wl, None), tp, micro_batches=2)
    request_dist = cycle_seconds(pb, np.asarray(pb.streams)[pb.prog])
    assert p.predicted_seconds <= request_dist * (1 + 1e-9)
    assert p.predicted_seconds == pytest.approx(_brute_best(pb), rel=1e-4)
    # d1 matches d0 only on attention: the best plan sends some attention of stream 0 there, so it beats
    # request-dist (stream 1 wholly on the slow device) strictly
    assert p.predicted_seconds < request_dist * 0.99


def test_plan_streams_sizes_streams_by_each_devices_throughput():
    from torch_tessera.scheduler import plan_streams

    dag = _stateful_dag()
    wl = Workload((WorkloadProgram("decode", dag, _two_devices_costs(dag, slow=3.0), 1.0, "decode"),))
    tp = topo(2, bw=1e10, lat=1e-6)
    p = plan_streams(wl, tp)
    homo_l = plan(wl, None, tp, policy="homo-L", cache_dir=False).cycle_seconds
    homo_r = plan(wl, None, tp, policy="homo-R", cache_dir=False).cycle_seconds
    share0 = (1 / homo_l) / (1 / homo_l + 1 / homo_r)
    assert p.frequencies == pytest.approx({"decode": share0, "decode@1": 1 - share0})
    assert set(p.placements) == {"decode", "decode@1"}
    # request-dist's cycle is 1 / (1/homo_l + 1/homo_r); the streams plan is at most that
    assert p.cycle_seconds <= 1 / (1 / homo_l + 1 / homo_r) * (1 + 1e-9)
    with pytest.raises(ValueError, match="one fraction per device"):
        plan_streams(wl, tp, shares=[1.0])


def test_plan_streams_request_dist_is_one_runnable_placement():
    """policy="request-dist": stream r wholly on device r (no replicas, no cut edge), with the same shares, and a
    cycle equal to the replicas' request-dist cycle (each device busy its share of the time)."""
    from torch_tessera.errors import ConfigError
    from torch_tessera.scheduler import plan_streams

    dag = _stateful_dag()
    wl = Workload((WorkloadProgram("decode", dag, _two_devices_costs(dag, slow=3.0), 1.0, "decode"),))
    tp = topo(2, bw=1e10, lat=1e-6)
    rd = plan_streams(wl, tp, policy="request-dist")
    assert not rd.replicas and not rd.cut_edges
    assert {n: set(pl.values()) for n, pl in rd.placements.items()} == {"decode": {0}, "decode@1": {1}}
    assert rd.frequencies == pytest.approx(plan_streams(wl, tp).frequencies)
    replicas = plan(wl, None, tp, policy="request-dist", cache_dir=False)
    assert replicas.replicas == (0, 1)
    assert rd.cycle_seconds == pytest.approx(replicas.cycle_seconds, rel=1e-6)
    with pytest.raises(ConfigError, match="policy must be"):
        plan_streams(wl, tp, policy="af")


def test_request_dist_streams_need_a_device_each():
    """More request streams than devices: request-dist cannot put stream r on device r, and says so."""
    from torch_tessera.errors import ConfigError

    dag = _stateful_dag()
    wl = Workload((WorkloadProgram("decode", dag, _two_devices_costs(dag), 1.0, "decode"),)).replicated([0.5, 0.3, 0.2])
    with pytest.raises(ConfigError, match="3 streams for 2 devices"):
        plan(wl, None, topo(2), policy="request-dist", cache_dir=False)
