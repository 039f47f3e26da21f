"""Planning's fast paths give the results of the plain code they replaced, kept here as references.

* :func:`modulo.dag_index`, :func:`blocks.block_loads_many`, :func:`simulate.step_durations`,
  :func:`counts.layer_split`, the schedule's emission (``modulo._emit``) and the simulation (``simulate.simulate``
  over its durations and longest path) equal their references (bit for bit) on transformer, random and
  registry-model DAGs.
* A schedule built from a timeline that carries its adjacency equals one built without it.
* ``plan(score="simulate")`` with every reference patched in chooses the same placements, micro-batch count and
  simulated step as with the fast paths, on the planning-speed bench's transformer DAGs (2-4 devices, whose solver
  path has no time limit that binds) and, from one solver result, on registry-model and random DAGs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import torch_tessera.scheduler as scheduler
from torch_tessera.scheduler import blocks, chains, counts, modulo, pipeline_plan, plan, simulate, solve, transfers
from torch_tessera.scheduler.blocks import aggregate, block_cycle_many, block_memory_ok_many, memory_binds
from torch_tessera.scheduler.counts import tied_classes
from torch_tessera.scheduler.modulo import DagIndex
from torch_tessera.scheduler.pipeline_plan import PipelineModel, program_simulations
from torch_tessera.scheduler.pipeline_schedule import RecordStep, RunStep, TransferStep, WaitStep
from torch_tessera.scheduler.problem import as_workload, compile_problem
from torch_tessera.scheduler.synthetic import layered_dag, nvlink_topology, roofline_costs, transformer_dag
from torch_tessera.target.costs import CostTable

DEVS = ("big", "mid", "small", "small")
BENCH_DEVS = {2: ("big", "small"), 3: ("big", "mid", "small"), 4: ("big", "mid", "small", "small")}


def ref_dag_index(dag) -> DagIndex:
    """:func:`modulo.dag_index` as it was: over ``dag.graph.edges(data=True)``."""
    nodes = sorted(dag.graph.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    edges = []
    for u, v, d in dag.graph.edges(data=True):
        raw = "RAW" in d["kinds"] and bool(d["ranges"])
        ranges = tuple(tuple(r) for r in d["ranges"]) if raw else ()
        edges.append((idx[u], idx[v], ranges, sum(e - s for _, s, e in ranges)))
    return DagIndex(tuple(nodes), tuple(edges))


def ref_block_loads_many(bl, bplaces):
    """:func:`blocks.block_loads_many` as it was: a 2-D gather and ``np.nonzero``."""
    bplaces = np.asarray(bplaces, dtype=np.int64)
    P, D = bplaces.shape[0], bl.cost.shape[1]
    w = bl.cost[np.arange(bl.B)[None], bplaces]
    dev = np.bincount((np.arange(P)[:, None] * D + bplaces).ravel(), weights=w.ravel(), minlength=P * D)
    a, b = bplaces[:, bl.esrc], bplaces[:, bl.edst]
    pi, ei = np.nonzero(a != b)
    a, b = a[pi, ei], b[pi, ei]
    link = np.bincount(pi * D * D + a * D + b, weights=bl.coef[ei, a, b], minlength=P * D * D)
    if bl.dcoef is not None and len(pi):
        dv = bl.dcoef[ei, a, b]
        dev = dev + np.bincount(np.r_[pi * D + a, pi * D + b], weights=np.r_[dv, dv], minlength=P * D)
    return dev.reshape(P, D), link.reshape(P, D * D)


def ref_step_durations(schedule, costs, topology, wait_seconds):
    """:func:`simulate.step_durations` as it was: one cost look-up per run step."""
    out = []
    dense = not isinstance(costs, CostTable)
    for d, st in enumerate(schedule.streams):
        dur = np.zeros(len(st))
        for i, s in enumerate(st):
            t = type(s)
            if t is RunStep:
                dur[i] = costs[s.launch, d] if dense else costs.row(s.launch)[d]
            elif t is TransferStep:
                same = schedule.domain(s.src) == schedule.domain(s.dst)
                dur[i] = 0.0 if same or topology is None else topology.transfer_seconds(s.src, s.dst, s.nbytes)
            elif t is WaitStep:
                dur[i] = wait_seconds
        out.append(dur)
    return out


def ref_emit(adj, order, D, M):
    """:func:`modulo._emit` as it was: steps built by their classes' ``__init__``, unused records dropped by a
    filter over every step."""
    import bisect

    n = len(adj.nodes)
    nodes, dev, pred, moves, has_cross = adj.nodes, adj.dev, adj.pred, adj.moves, adj.cross
    streams = [[] for _ in range(D)]
    know = [[-1] * D for _ in range(D)]
    wait_know = [[[] for _ in range(D)] for _ in range(D)]
    wait_refs = [[] for _ in range(D)]
    wait_at = [[] for _ in range(D)]
    record_at = [[] for _ in range(D)]
    record = {}
    for op in order:
        m, i = divmod(op, n)
        d = dev[i]
        st = streams[d]
        v = nodes[i]
        kd = know[d]
        for j in pred[i]:
            du = dev[j]
            ev, pos, clock = record[m * n + j]
            u = nodes[j]
            if kd[du] >= pos:
                k = bisect.bisect_left(wait_know[d][du], pos)
                wm, edges, others = wait_refs[d][k]
                if wm == m:
                    edges.append((u, v))
                else:
                    others.append((u, v, m))
                continue
            edges, others = [(u, v)], []
            wait_at[d].append((len(st), m, ev))
            st.append(None)
            kd = know[d] = [a if a > b else b for a, b in zip(kd, clock)]
            kd[d] = len(st) - 1
            wait_refs[d].append((m, edges, others))
            for e in range(D):
                wait_know[d][e].append(kd[e])
        st.append(RunStep(d, m, v))
        kd[d] = len(st) - 1
        if not has_cross[i]:
            continue
        for j, ranges, nb in moves[i]:
            st.append(TransferStep(d, dev[j], m, (v, nodes[j]), ranges, nb))
        record_at[d].append((len(st), op))
        st.append(RecordStep(d, m, op))
        kd[d] = len(st) - 1
        record[op] = (op, len(st) - 1, list(kd))
    used = {ev for at in wait_at for _, _, ev in at}
    out = []
    for d, st in enumerate(streams):
        for (k, m, ev), (_, edges, others) in zip(wait_at[d], wait_refs[d]):
            st[k] = WaitStep(d, m, ev, tuple(edges), tuple(others))
        drop = {k for k, ev in record_at[d] if ev not in used}
        out.append(tuple(x for k, x in enumerate(st) if k not in drop) if drop else tuple(st))
    return tuple(out)


def ref_longest_path(schedule, dur, issued=None):
    """:func:`simulate._longest_path` as it was: over numpy arrays, element by element."""
    streams = schedule.streams
    D = len(streams)
    start = [np.empty(len(st)) for st in streams]
    end = [np.empty(len(st)) for st in streams]
    rec = {}
    pos = [0] * D
    last = [0.0] * D
    left = sum(len(st) for st in streams)
    while left:
        moved = False
        for d in range(D):
            st, du, sd, ed = streams[d], dur[d], start[d], end[d]
            i, t = pos[d], last[d]
            while i < len(st):
                s = st[i]
                if type(s) is WaitStep:
                    r = rec.get(s.event_id)
                    if r is None:
                        break
                    if r > t:
                        t = r
                if issued is not None and issued[d][i] > t:
                    t = issued[d][i]
                sd[i] = t
                t += du[i]
                ed[i] = t
                if type(s) is RecordStep:
                    rec[s.event_id] = t
                i += 1
            if i != pos[d]:
                moved, left = True, left - (i - pos[d])
                pos[d], last[d] = i, t
        assert moved, "deadlock"
    return start, end, max(last, default=0.0)


def ref_durations_and_kinds(schedule, costs, topology, wait_seconds):
    """``simulate._durations_and_kinds`` as it was: :func:`ref_step_durations`, then :func:`simulate.step_kinds`."""
    return ref_step_durations(schedule, costs, topology, wait_seconds), simulate.step_kinds(schedule)


def ref_layer_split(pb, groups, cls, frac, base, top=2):
    """:func:`counts.layer_split` as it was: every trial of a boundary built as its own placement."""
    D, G = pb.D, groups.B
    gprog = np.zeros(G, dtype=np.int64)
    gprog[pb.group] = pb.prog
    known = cls.unit >= 0
    cprog = np.array([gprog[m[0]] for m in cls.members], dtype=np.int64)
    multi = cls.L > 1
    P = len(pb.programs)
    free = groups.pinned < 0
    progs, shares, sizes, sel = [], [], [], []
    pos = np.zeros(G, dtype=np.int64)
    for p in range(P):
        mine = known & (gprog == p)
        units = np.unique(cls.unit[mine])
        if len(units) < 2:
            continue
        pos[mine] = np.searchsorted(units, cls.unit[mine])  # rank of the group's unit in its program
        c = multi & (cprog == p)
        progs.append(p), sizes.append(len(units)), sel.append(np.flatnonzero(mine & free))
        shares.append(frac[c].sum(0) / max(frac[c].sum(), 1e-30) if c.any() else np.full(D, 1.0 / D))
    if not progs or D < 2:
        return []
    dorders = np.array(list(itertools.permutations(range(D))) if D <= 4 else [tuple(range(D))], dtype=np.int64)

    def build(o: int, cuts: list[np.ndarray]) -> np.ndarray:
        gp = base.copy()
        for i, c in enumerate(cuts):
            gp[sel[i]] = dorders[o][np.searchsorted(c, pos[sel[i]], side="right")]
        return gp

    keep: dict[bytes, tuple[float, np.ndarray]] = {}  # the best few candidates scored so far, by placement
    binds = memory_binds(pb, groups)

    def score(cands: list[np.ndarray]) -> np.ndarray:
        stack = np.stack(cands)
        vals = block_cycle_many(groups, stack)
        vals[groups.forbidden[stack].any(1)] = np.inf
        if binds:  # a split that breaks a budget is no candidate (nor a step of the descent)
            vals[~block_memory_ok_many(pb, groups, stack)] = np.inf
        for i in np.argsort(vals, kind="stable")[:4 * top].tolist():
            if np.isfinite(vals[i]):
                keep.setdefault(cands[i].tobytes(), (float(vals[i]), cands[i]))
        if len(keep) > 4 * top:
            for key, _ in sorted(keep.items(), key=lambda kv: kv[1][0])[4 * top:]:
                del keep[key]
        return vals

    seeds = [(o, [np.rint(np.cumsum(shares[i][dorders[o]])[:-1] * sizes[i]).astype(np.int64)
                  for i in range(len(progs))]) for o in range(len(dorders))]
    whole = itertools.product(range(D), repeat=len(progs)) if D ** len(progs) <= 256 else []
    for devs in whole:  # every program wholly on one device (first device order: device g's range is all units)
        seeds.append((0, [np.where(np.arange(D - 1) < int(np.flatnonzero(dorders[0] == g)[0]), 0, sizes[i])
                          for i, g in enumerate(devs)]))
    vals = score([build(o, cuts) for o, cuts in seeds])
    for s in np.argsort(vals, kind="stable")[:2].tolist():
        o, cuts = seeds[s][0], [c.copy() for c in seeds[s][1]]
        cur = vals[s]
        for _ in range(2):
            moved = False
            for i in range(len(progs)):
                for j in range(D - 1):
                    lo = cuts[i][j - 1] if j else 0
                    hi = cuts[i][j + 1] if j + 1 < D - 1 else sizes[i]
                    opts = [v for v in range(lo, hi + 1) if v != cuts[i][j]]
                    if not opts:
                        continue
                    trial = []
                    for v in opts:
                        c = cuts[i].copy()
                        c[j] = v
                        trial.append(build(o, cuts[:i] + [c] + cuts[i + 1:]))
                    tv = score(trial)
                    k = int(np.argmin(tv))
                    if tv[k] < cur * (1 - 1e-12):
                        cuts[i][j], cur, moved = opts[k], float(tv[k]), True
            if not moved:
                break
    return [gp for _, gp in sorted(keep.values(), key=lambda kv: kv[0])][:top]


def _prepare_without_reuse(dag, placement, topology, domains, devices, index, adj=None):
    return _PREPARE(dag, placement, topology, domains, devices, index)


_PREPARE, _SOLVE = modulo._prepare, scheduler.solve_throughput


def _use_references(m):
    """Patch every reference in (``m``: a monkeypatch or its context)."""
    m.setattr(modulo, "dag_index", ref_dag_index)
    m.setattr(pipeline_plan, "dag_index", ref_dag_index)
    m.setattr(modulo, "_prepare", _prepare_without_reuse)
    for mod in (blocks, chains, counts, transfers):
        m.setattr(mod, "block_loads_many", ref_block_loads_many)
    m.setattr(simulate, "step_durations", ref_step_durations)
    m.setattr(simulate, "_durations_and_kinds", ref_durations_and_kinds)
    m.setattr(simulate, "_longest_path", ref_longest_path)
    m.setattr(modulo, "_emit", ref_emit)
    m.setattr(solve, "layer_split", ref_layer_split)


def _bench_case(layers, D, hop_us=52.0):
    """A case of ``bench/bench_scheduler.py --hop-us 52``: a transformer DAG, roofline costs, NVLink links."""
    from dataclasses import replace

    dag = transformer_dag(layers=layers, tokens=256, context=2048)
    devs = BENCH_DEVS[D]
    tp = nvlink_topology(devs)
    tp = replace(tp, hop_overhead=np.full((D, D), hop_us * 1e-6), copy_exposure=np.full((D, D), 0.6))
    return as_workload(dag, roofline_costs(dag, devs)), tp


def _registry_workloads():
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.target.devices import parse_devices

    for name in ("mlp", "llama"):
        mw = model_workload(name, parse_devices("sim:a100,sim:l40s"), size="tiny", prefill_tokens=16,
                            decode_batch=4, mean_output_tokens=8)
        yield name, mw.workload, mw.topology


def _dags():
    yield transformer_dag(layers=4, tokens=256, context=2048)
    yield transformer_dag(layers=18, tokens=256, context=2048)
    yield layered_dag(80, width=4, seed=3)
    for _, wl, _ in _registry_workloads():
        for p in wl.programs:
            yield p.dag


def test_dag_index_equals_the_reference():
    for dag in _dags():
        assert modulo.dag_index(dag) == ref_dag_index(dag)


def test_block_loads_equal_the_reference():
    rng = np.random.default_rng(0)
    for D in (2, 3, 4):
        for wl, tp in (_bench_case(18, D), (as_workload(d := layered_dag(80, width=4, seed=D),
                                                          roofline_costs(d, DEVS[:D], noise=0.3)),
                                             nvlink_topology(DEVS[:D]))):
            pb = compile_problem(wl, tp)
            groups = aggregate(pb, pb.group)
            for bl in (groups, chains.Units(pb, groups).blocks):
                stack = rng.integers(0, D, size=(37, bl.B))
                stack[0] = 0  # no cut edge
                for got, want in zip(blocks.block_loads_many(bl, stack), ref_block_loads_many(bl, stack)):
                    assert np.array_equal(got, want)


def test_step_durations_equal_the_reference():
    rng = np.random.default_rng(1)
    for dag in _dags():
        nodes = sorted(dag.graph.nodes)
        for D in (2, 3):
            costs = roofline_costs(dag, DEVS[:D], noise=0.3)
            dense = np.zeros((max(nodes) + 1, D))
            dense[nodes] = [costs.row(v) for v in nodes]
            tp = nvlink_topology(DEVS[:D])
            s = modulo.build_pipelined_schedule(dag, rng.integers(0, D, len(nodes)), 2, costs=costs, topology=tp)
            for c in (costs, dense):
                for got, want in zip(simulate.step_durations(s, c, tp, 1e-6), ref_step_durations(s, c, tp, 1e-6)):
                    assert np.array_equal(got, want)


def _random_schedules():
    """Schedules of random placements (2-3 devices, 1-3 micro-batches, own or shared memory domains) of the test
    DAGs, with their costs and topology."""
    rng = np.random.default_rng(4)
    for dag in _dags():
        nodes = sorted(dag.graph.nodes)
        for D, M, shared in ((2, 2, False), (3, 3, False), (2, 1, True)):
            costs = roofline_costs(dag, DEVS[:D], noise=0.3)
            tp = nvlink_topology(DEVS[:D])
            yield dag, modulo.build_pipelined_schedule(dag, rng.integers(0, D, len(nodes)), M, costs=costs,
                                                       topology=tp, domains=(0,) * D if shared else None), costs, tp


def test_emit_equals_the_reference():
    rng = np.random.default_rng(5)
    seen = 0
    for dag in _dags():
        index = modulo.dag_index(dag)
        for D, M in ((2, 2), (3, 3), (4, 1)):
            costs = roofline_costs(dag, DEVS[:D], noise=0.3)
            place = dict(zip(index.nodes, rng.integers(0, D, len(index.nodes)).tolist()))
            _, pl, _, dom, adj = modulo._prepare(dag, place, None, None, D, index)
            order = modulo._list_schedule(adj, M, modulo._durations(adj, pl, costs), nvlink_topology(DEVS[:D]),
                                          modulo.WAIT_SECONDS, "micro-batch", D)
            got, want = modulo._emit(adj, order, D, M), ref_emit(adj, order, D, M)
            assert got == want and [list(map(type, st)) for st in got] == [list(map(type, st)) for st in want]
            assert all(s.__dict__ == w.__dict__ for st, wt in zip(got, want) for s, w in zip(st, wt))
            seen += sum(isinstance(x, WaitStep) for st in got for x in st)
    assert seen > 0


def test_simulation_equals_the_reference(monkeypatch):
    for dag, s, costs, tp in _random_schedules():
        fast = simulate.simulate(s, costs, tp)
        with monkeypatch.context() as m:
            m.setattr(simulate, "_durations_and_kinds", ref_durations_and_kinds)
            m.setattr(simulate, "_longest_path", ref_longest_path)
            ref = simulate.simulate(s, costs, tp)
        assert fast.step_seconds == ref.step_seconds
        for a, b in zip((fast.busy, fast.transfer, fast.waiting, fast.idle, fast.stretch, *fast.start, *fast.end),
                        (ref.busy, ref.transfer, ref.waiting, ref.idle, ref.stretch, *ref.start, *ref.end)):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_layer_split_equals_the_reference():
    rng = np.random.default_rng(2)
    for layers, D in ((18, 2), (18, 3), (45, 4)):
        wl, tp = _bench_case(layers, D)
        pb = compile_problem(wl, tp)
        groups = aggregate(pb, pb.group)
        label, tied = blocks.tie_layers(pb)
        cls = tied_classes(pb, groups, label, tied)
        _, frac = counts.solve_counts(pb, cls, groups.forbidden, 10.0, relax=True, presolve=False)
        for base in (np.zeros(groups.B, dtype=np.int64), rng.integers(0, D, groups.B)):
            got = counts.layer_split(pb, groups, cls, frac, base)
            want = ref_layer_split(pb, groups, cls, frac, base)
            assert len(got) == len(want) >= 1
            for g, w in zip(got, want):
                assert np.array_equal(g, w)


def test_a_timeline_of_another_placement_is_not_trusted_for_its_edges():
    dag = transformer_dag(layers=4, tokens=256, context=2048)
    costs, tp = roofline_costs(dag, DEVS[:2]), nvlink_topology(DEVS[:2])
    n = dag.num_kernels
    a, b = np.zeros(n, dtype=np.int64), np.arange(n) % 2
    tl = modulo.list_timeline(dag, a, 2, costs=costs, topology=tp)
    bare = modulo.Timeline(tl.order, tl.step_seconds, tl.occupied)  # no adjacency to reuse
    got = modulo.build_pipelined_schedule(dag, b, 2, costs=costs, topology=tp, timeline=tl)
    assert got == modulo.build_pipelined_schedule(dag, b, 2, costs=costs, topology=tp, timeline=bare)
    assert got.cut_edges  # placement b's edges, not a's (which cut none)


def _same(fast, ref, what):
    assert fast.placements == ref.placements, what
    assert fast.micro_batches == ref.micro_batches, what
    assert fast.simulated_seconds == ref.simulated_seconds, what
    assert fast.predicted_seconds == ref.predicted_seconds, what


@pytest.mark.parametrize("layers,D", [(91, 2), (45, 2), (45, 3), (45, 4), (91, 4)])
def test_plans_equal_the_references_on_bench_dags(monkeypatch, layers, D):
    wl, tp = _bench_case(layers, D)
    fast = plan(wl, None, tp, cache_dir=False)
    with monkeypatch.context() as m:
        _use_references(m)
        ref = plan(wl, None, tp, cache_dir=False)
    assert ref.solver.method == fast.solver.method and "milp" not in fast.solver.method  # no time limit bound
    _same(fast, ref, f"transformer {layers} layers, {D} devices")


def test_plans_equal_the_references_from_one_solver_result(monkeypatch):
    """Registry models and random DAGs: their solver runs MILPs to wall-clock limits, so both plans take one
    solver result (the fast paths of the solver are checked above)."""
    cases = list(_registry_workloads())
    for D in (2, 3, 4):
        dag = layered_dag(80, width=4, seed=D)
        cases.append((f"random-{D}", as_workload(dag, roofline_costs(dag, DEVS[:D], noise=0.3)),
                      nvlink_topology(DEVS[:D])))
    split = 0
    for name, wl, tp in cases:
        solved = {}

        def once(*args, **kwargs):
            if "sol" not in solved:
                solved["sol"] = _SOLVE(*args, **kwargs)
            return solved["sol"]

        monkeypatch.setattr(scheduler, "solve_throughput", once)
        fast = plan(wl, None, tp, cache_dir=False, time_limit=2.0)
        with monkeypatch.context() as m:
            _use_references(m)
            ref = plan(wl, None, tp, cache_dir=False, time_limit=2.0)
        _same(fast, ref, name)
        split += len({d for p in fast.placements.values() for d in p.values()}) > 1
    assert split >= 2  # plans that cut the DAG: the simulator scored and chose them
