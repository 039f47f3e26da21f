"""Partitions of one GPU share its memory: the topology's memory pools (planned here for an assumed H200)."""

from __future__ import annotations

import pytest

from torch_tessera.target.costs import MemoryPool
from torch_tessera.target.devices import parse_devices
from torch_tessera.target.links import build_topology, memory_pools

H200 = 141 * 10**9


def _pools(devices: str, hosts=None):
    return build_topology(parse_devices(devices, assume_gpu="h200"), hosts=hosts).memory_pools


def test_partitions_of_one_gpu_share_its_memory_once():
    (pool,) = _pools("cuda:0@104sm,cuda:0@24sm")
    assert (pool.name, pool.members, pool.capacity) == ("cuda:0", (0, 1), H200)
    assert "shared by cuda:0@104sm, cuda:0@24sm" in pool.source


def test_whole_gpu_and_its_partition_share_too_but_separate_gpus_do_not():
    assert _pools("cuda:0,cuda:0@24sm")[0].members == (0, 1)
    assert _pools("cuda:0,cuda:1") == ()
    assert _pools("cuda:0,cuda:1@24sm") == ()
    pools = _pools("cuda:0@104sm,cuda:1@104sm,cuda:0@24sm,cuda:1@24sm")
    assert [(p.name, p.members) for p in pools] == [("cuda:0", (0, 2)), ("cuda:1", (1, 3))]


def test_a_mem_budget_wins_and_the_others_share_what_is_left():
    topo = build_topology(parse_devices("cuda:0@104sm,cuda:0@24sm,mem=40GB", assume_gpu="h200"))
    assert topo.memory == (H200, 40 * 10**9)
    (pool,) = topo.memory_pools
    assert (pool.members, pool.capacity) == ((0,), H200 - 40 * 10**9)
    assert "less 40.00 GB set by mem= on cuda:0@24sm,mem=40GB" in pool.source
    assert _pools("cuda:0@104sm,mem=100GB,cuda:0@24sm,mem=40GB") == ()  # every partition has a budget: they win


def test_same_index_on_two_hosts_is_two_gpus():
    assert _pools("cuda:0@104sm,cuda:0@24sm", hosts=["a", "b"]) == ()
    assert _pools("cuda:0@104sm,cuda:0@24sm", hosts=["a", "a"])[0].name == "cuda:0 on a"


def test_simulated_and_cpu_devices_are_not_pooled():
    assert _pools("sim:h200@104sm,sim:h200@24sm") == ()  # each sim: device is a GPU of its own (as its links)
    assert memory_pools(parse_devices("cpu:0,cpu:1")) == ()


def test_pool_survives_free_transfers_and_rejects_bad_members():
    topo = build_topology(parse_devices("cuda:0@104sm,cuda:0@24sm", assume_gpu="h200"))
    assert topo.free_transfers().memory_pools == topo.memory_pools
    with pytest.raises(ValueError, match="increasing"):
        MemoryPool("cuda:0", (1, 0), H200)
    with pytest.raises(ValueError, match="beyond"):
        type(topo)(topo.devices, topo.bandwidth, topo.latency, topo.memory, memory_pools=(MemoryPool("x", (0, 2), 1),))


def test_budgets_of_one_gpus_partitions_must_fit_it_together():
    """Each budget alone fits the 141 GB H200, together they do not: refused, naming the partitions, the sum and the
    GPU's memory. Budgets that fit together, or on two different GPUs, are taken."""
    from torch_tessera.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError) as e:
        parse_devices("cuda:0@104sm,mem=100GB,cuda:0@24sm,mem=100GB", assume_gpu="h200")
    msg = str(e.value)
    assert msg == ("devices 'cuda:0@104sm,mem=100GB,cuda:0@24sm,mem=100GB': the mem= budgets of cuda:0's partitions "
                   "(cuda:0@104sm,mem=100GB, cuda:0@24sm,mem=100GB) add up to 200.00 GB, more than the 141.00 GB of "
                   "its NVIDIA H200; partitions of one GPU share its memory, so lower the budgets"), msg
    assert [d.name for d in parse_devices("cuda:0@104sm,mem=100GB,cuda:0@24sm,mem=40GB", assume_gpu="h200")] == [
        "cuda:0@104sm,mem=100GB", "cuda:0@24sm,mem=40GB"]
    assert len(parse_devices("cuda:0,mem=100GB,cuda:1,mem=100GB", assume_gpu="h200")) == 2
