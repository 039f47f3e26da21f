"""The throughput plan's second objective (`scheduler.transfers`): the same cycle time with fewer bytes moved."""

from __future__ import annotations

import numpy as np
import pytest

from torch_tessera.scheduler.blocks import Blocks, block_cycle
from torch_tessera.scheduler.transfers import trim_limit, trim_transfers


def _blocks(update_cost: tuple[float, float]) -> Blocks:
    """Two devices; a producer (group 0) feeds a KV-cache update (group 2) over a big edge, and the update feeds a
    reader (group 1) over a small one: cutting the big edge or the small one balances the devices the same way."""
    coef = np.zeros((2, 2, 2))
    coef[0, 0, 1] = coef[0, 1, 0] = 0.5  # 0 -> 2: the whole cache
    coef[1, 0, 1] = coef[1, 1, 0] = 0.01  # 2 -> 1: one token's K/V
    return Blocks(label=np.arange(3), cost=np.array([[1.0, 1.0], [1.0, 1.0], list(update_cost)]),
                  pinned=np.full(3, -1), forbidden=np.zeros(2, dtype=bool), esrc=np.array([0, 2]),
                  edst=np.array([2, 1]), coef=coef, res_bytes=np.zeros(0), res_holders=[])


def test_moves_the_update_to_its_producer_when_the_cycle_stays():
    b = _blocks((0.01, 0.01))
    place = np.array([0, 1, 1])
    value = block_cycle(b, place)
    got, cycle, saved = trim_transfers(b, place, value, deadline=np.inf)
    assert got.tolist() == [0, 1, 0]
    assert cycle == pytest.approx(value) and saved == pytest.approx(0.49)


def test_keeps_the_plan_when_the_move_costs_cycle_time():
    b = _blocks((0.2, 0.05))  # slower on device 0, where it would make that device the bottleneck
    place = np.array([0, 1, 1])
    value = block_cycle(b, place)
    got, cycle, saved = trim_transfers(b, place, value, deadline=np.inf)
    assert got.tolist() == [0, 1, 1] and cycle == value and saved == 0.0
    moved, cycle2, _ = trim_transfers(b, place, value * 1.5, deadline=np.inf)  # a looser limit lets it move
    assert moved.tolist() == [0, 1, 0] and value < cycle2 <= value * 1.5


def test_limit_keeps_the_solvers_gap_promise():
    assert trim_limit(1.0, 0.999, 5e-3, 5e-3) == pytest.approx(0.999 / 0.995 * (1 - 1e-9))
    assert trim_limit(1.0, 0.9, 5e-3, 5e-3) == 1.0  # already outside the gap: no increase at all
    assert trim_limit(1.0, 1.0, 5e-3, 1e-2) == pytest.approx(1.005)


def test_moves_a_chain_of_heavy_edges_together():
    """KV-cache update (1) -> cache read (2) -> attention (3), with a small input (0 -> 1): the plan cuts 2 -> 3.
    Moving 1 or 2 alone only moves the heavy cut; moving both next to the attention sheds it."""
    coef = np.zeros((3, 2, 2))
    coef[0, 0, 1] = coef[0, 1, 0] = 0.01  # 0 -> 1: one token's K
    coef[1, 0, 1] = coef[1, 1, 0] = 0.5  # 1 -> 2: the whole cache
    coef[2, 0, 1] = coef[2, 1, 0] = 0.5  # 2 -> 3: the whole cache, read for attention
    b = Blocks(label=np.arange(4), cost=np.array([[2.0, 2.0], [0.01, 0.01], [0.01, 0.01], [1.0, 1.0]]),
               pinned=np.full(4, -1), forbidden=np.zeros(2, dtype=bool), esrc=np.array([0, 1, 2]),
               edst=np.array([1, 2, 3]), coef=coef, res_bytes=np.zeros(0), res_holders=[])
    place = np.array([0, 0, 0, 1])
    value = block_cycle(b, place)
    got, cycle, saved = trim_transfers(b, place, value * 1.01, deadline=np.inf)
    assert got.tolist() == [0, 1, 1, 1]
    assert cycle <= value * 1.01 and saved == pytest.approx(0.49)


@pytest.mark.parametrize("hop", [False, True])
def test_moves_scored_at_once_match_one_at_a_time(hop):
    """The trimming scores its candidate moves together; each score equals the one-move update (up to rounding),
    with the per-hop charge (``hop``) on the devices a cut edge joins."""
    from torch_tessera.scheduler import Workload
    from torch_tessera.scheduler.blocks import aggregate, block_loads_many
    from torch_tessera.scheduler.problem import compile_problem
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag
    from torch_tessera.scheduler.transfers import _Adjacency, _moved_loads, _moves, _score_moves

    devs = ("big", "small", "mid")
    dag = transformer_dag(layers=4, tokens=256, context=1024)
    tp = nvlink_topology(devs)
    if hop:
        from dataclasses import replace

        rng = np.random.default_rng(3)
        tp = replace(tp, hop_overhead=rng.uniform(20e-6, 80e-6, (3, 3)), copy_exposure=rng.uniform(0.2, 0.8, (3, 3)))
    pb = compile_problem(Workload.single(dag, roofline_costs(dag, devs)), tp, micro_batches=2)
    blocks = aggregate(pb, pb.group)
    assert (blocks.dcoef is not None) == hop
    place = np.random.default_rng(0).integers(0, 3, size=blocks.B)
    nbrs = _Adjacency(blocks)
    weight = blocks.coef.reshape(len(blocks.esrc), -1).max(1)
    moves = _moves(blocks, place, weight, nbrs, np.ones(3, dtype=bool), 0.0)
    assert len(moves) > 10 and any(len(gs) > 1 for gs, _ in moves)  # single and cluster moves
    dev, link = (x[0] for x in block_loads_many(blocks, place[None]))
    cyc, traffic = _score_moves(blocks, place, moves, dev, link)
    for k, (gs, d) in enumerate(moves):
        new = place.copy()
        new[gs] = d
        dev1, link1 = _moved_loads(blocks, nbrs, place, new, gs, dev, link)
        assert cyc[k] == pytest.approx(max(dev1.max(), link1.max()), rel=1e-12)
        assert traffic[k] == pytest.approx(link1.sum(), rel=1e-12, abs=1e-15)
