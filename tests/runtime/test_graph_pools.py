"""Memory pools of the one-graph-over-every-GPU capture, against a model of the CUDA caching allocator's use counts.

A CUDA graph addresses every byte its kernels touched at capture, including blocks its extern ops allocated and freed
inside the capture (attention workspaces, outputs nobody keeps). Those stay reserved only while their private pool's
use count on THAT device is above zero: ``torch.cuda.graph.__enter__`` calls ``torch.cuda.empty_cache()`` before
every capture, which cudaFrees the cached segments of every pool whose count has fallen to zero, on every device.

c10's ``MemPool`` belongs to the device that is current when it is constructed (``MemPool::MemPool``:
``device_ = c10::cuda::current_device(); createOrIncrefPool(device_, id_)``); ``use_mem_pool(pool, device=d)`` adds
one use on ``d`` on entry and releases it on exit. Found this way (2026-11-30): the pool for the other GPU was built
while the home GPU was current, so once the capture ended its count on that GPU was 0, and the NEXT executor's
capture (another bucket's program, another plan's executor, the next pipeline slot) could free memory the first
graph replays into. Suspected (not yet confirmed on a GPU) behind "CUDA error: an illegal memory access" in
``_wait_whole`` after a decode replay of the compiled serving engine on two H200s, and the crash of a second
pipelined multi-GPU replay.
"""

from __future__ import annotations

import collections
import contextlib
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import TEST_DEVICE
from tests.runtime.graph_stand_in import stand_in_graphs  # noqa: F401 - pytest fixture
from torch_tessera.runtime import graphs as graphs_mod
from torch_tessera.runtime.executor import BufferPool
from torch_tessera.runtime.realize import CallContext

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="models torch.cuda's allocator on CPU only")


class _Allocator:
    """Use counts per (device index, pool id), as c10's caching allocator keeps them."""

    def __init__(self) -> None:
        self.current = 0
        self.use: collections.Counter = collections.Counter()
        self.ids = 0

    def freeable(self, device: int, pool: object) -> bool:
        """Whether ``empty_cache()`` would cudaFree ``pool``'s cached segments on ``device``."""
        return self.use[(device, pool.id)] <= 0


@pytest.fixture
def allocator(monkeypatch):
    alloc = _Allocator()

    def index(d) -> int:
        return d if isinstance(d, int) else torch.device(d).index

    @contextlib.contextmanager
    def device(d):
        prev, alloc.current = alloc.current, index(d)
        try:
            yield
        finally:
            alloc.current = prev

    class MemPool:
        def __init__(self) -> None:
            alloc.ids += 1
            self.id = (0, alloc.ids)
            alloc.use[(alloc.current, self.id)] += 1  # createOrIncrefPool(current_device(), id)

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        d = alloc.current if device is None else index(device)
        alloc.use[(d, pool.id)] += 1  # beginAllocateCurrentThreadToPool: create_or_incref
        try:
            yield
        finally:
            alloc.use[(d, pool.id)] -= 1  # endAllocateToPool + releasePool

    class Stream:
        def wait_event(self, event) -> None:
            pass

    class Event:
        def record(self, stream=None) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: alloc.current)
    monkeypatch.setattr(torch.cuda, "MemPool", MemPool)
    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    alloc.Stream = Stream
    return alloc


class _Gpu:
    def __init__(self, index: int) -> None:
        self.index, self.torch_device = index, torch.device("cuda", index)

    def guard(self):
        return torch.cuda.device(self.index)


@pytest.mark.parametrize("home", [0, 1])
def test_other_gpus_pools_stay_owned_while_the_graph_lives(stand_in_graphs, allocator, home):
    """After the capture, each other GPU's private pool still has a use on THAT GPU (held by the graph's keep-alive
    list), so the next capture's ``empty_cache()`` cannot free memory this graph replays into."""
    machine = SimpleNamespace(devices=[_Gpu(0), _Gpu(1)], domains=[0, 1])
    allocator.current = home
    streams = [allocator.Stream(), allocator.Stream()]
    pools = [BufferPool(torch.device("cpu")), BufferPool(torch.device("cpu"))]
    captured = graphs_mod.capture_whole(machine, [], CallContext(pools, streams), home, copy_streams={})
    assert captured is not None, "the capture fell back to one graph per segment"
    graph, keep_alive = captured
    other = 1 - home
    assert len(keep_alive) == 1
    assert not allocator.freeable(other, keep_alive[0]), (
        f"the private pool the graph allocated from on cuda:{other} has no use left there after the capture: the next "
        "torch.cuda.graph capture (empty_cache) would free memory this graph still addresses")
    assert allocator.current == home  # the current device is left as it was
