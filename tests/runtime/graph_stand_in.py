"""A pointer-faithful stand-in for CUDA graphs on CPU virtual devices (shared by the graph-path tests).

A real CUDA graph records each kernel with the addresses its arguments had at capture and replays exactly those,
without running anything while capturing. The stand-in does the same on CPU: while "capturing", a Triton launch
resolves its tensor arguments at once and records a closure over those very tensors (nothing runs); an extern op runs
once to obtain its capture-time output tensors and its replay writes into them. Replays therefore read and write the
memory the capture saw, as on a GPU. Every replayed launch and copy first checks that each storage it touches is
still the one its buffer pool binds (:class:`StaleReplay` otherwise): a GPU graph holds raw addresses, so memory its
pool dropped could be freed or handed out again.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_tessera.lowering.program import ScalarArg, TensorArg, TritonLaunch
from torch_tessera.runtime import executor as executor_mod
from torch_tessera.runtime import graphs as graphs_mod
from torch_tessera.runtime import placed as placed_mod
from torch_tessera.target.devices import CpuStream
from torch_tessera.runtime.push import push_copy


class StaleReplay(AssertionError):
    """A replay used memory its buffer pool no longer binds (on a GPU: freed or re-bound since capture)."""


def _check_bound(pool, pairs, what: str) -> None:
    """Every (buffer name, tensor the replay uses) still the storage ``pool`` binds for that buffer (a CUDA graph
    holds raw addresses: memory its pool dropped may be freed and handed out again)."""
    for name, t in pairs:
        cur = pool.storages.get(name)
        if cur is None and name in pool.released:
            continue  # the caller's state, dropped by the pool after capture: the wrapper checked its address
        if cur is None or cur.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
            raise StaleReplay(f"{what}: buffer {name} is {'no longer bound' if cur is None else 're-bound'} in its "
                              "pool since capture; a CUDA graph would touch freed or reused memory")


class _Graph:
    """Stand-in for ``torch.cuda.CUDAGraph``: replay runs the closures recorded while capturing."""

    capturing: "_Graph | None" = None

    def __init__(self) -> None:
        self.calls: list = []

    def replay(self) -> None:
        for call in self.calls:
            call()


class _capture:
    def __init__(self, graph: _Graph, pool=None, stream=None) -> None:
        self.graph = graph

    def __enter__(self) -> None:
        _Graph.capturing = self.graph

    def __exit__(self, *exc) -> None:
        _Graph.capturing = None


@pytest.fixture
def stand_in_graphs(monkeypatch):
    """CUDA graphs replaced by the pointer-faithful stand-in; executors accept ``cuda_graphs=True`` on CPU devices."""
    install_stand_in(monkeypatch)


def install_stand_in(monkeypatch) -> None:
    """What :func:`stand_in_graphs` does, through ``monkeypatch`` (a ``pytest.MonkeyPatch``; undone with it): for a
    script that measures the captured replay's host work on CPU."""
    orig_launch = executor_mod.KernelLauncher.launch

    def launch(self, launch, pool, stream=None):
        if pool.device.type == "cpu":
            stream = None
        if _Graph.capturing is None:
            return orig_launch(self, launch, pool, stream)

        def arg(v):
            if isinstance(v, TensorArg):
                return pool.view(v)
            return v.value if isinstance(v, ScalarArg) else v

        if isinstance(launch, TritonLaunch):
            args, kernel = [arg(a) for a in launch.args], self.kernel(launch.kernel)
            pairs = [(a.buffer, t) for a, t in zip(launch.args, args) if isinstance(a, TensorArg)]

            def replay_triton(args=args, kernel=kernel, device=pool.device, pairs=pairs, name=launch.kernel):
                _check_bound(pool, pairs, f"replay of {name}")
                with executor_mod._interpreter_context(device):
                    kernel.run(*args, stream=0)

            _Graph.capturing.calls.append(replay_triton)
            return None
        args, kwargs = tree_map(arg, launch.args), tree_map(arg, dict(launch.kwargs))
        result = launch.overload(*args, **kwargs)  # the capture-time allocation of fresh outputs
        leaves = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        specs = [a for a in tree_flatten((launch.args, dict(launch.kwargs)))[0] if isinstance(a, TensorArg)]
        vals = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        pairs = [(a.buffer, t) for a, t in zip(specs, vals)]
        outs = [(o.buffer, t) for o, t in zip(launch.outputs, leaves)]

        def replay_extern(args=args, kwargs=kwargs, leaves=leaves, op=launch.overload, pairs=pairs, outs=outs):
            _check_bound(pool, pairs + outs, f"replay of {op}")
            new = [t for t in tree_flatten(op(*args, **kwargs))[0] if isinstance(t, torch.Tensor)]
            for old, fresh in zip(leaves, new):
                if old.data_ptr() != fresh.data_ptr():
                    old.copy_(fresh)  # a graph writes fresh outputs where the capture allocated them

        _Graph.capturing.calls.append(replay_extern)
        return result

    def capture_copy(machine, step, pools, streams, copy_stream, push=False):
        src = pools[step.src].storages[step.buffer][step.start:step.end]
        dst = pools[step.dst].storages[step.buffer][step.start:step.end]

        def replay_copy(src_pool=pools[step.src], dst_pool=pools[step.dst]):
            _check_bound(src_pool, [(step.buffer, src)], f"copy of {step.buffer} from {step.src}")
            _check_bound(dst_pool, [(step.buffer, dst)], f"copy of {step.buffer} to {step.dst}")
            if push:  # a push kernel node: the copy kernel (in Triton's interpreter) over these very bytes
                push_copy(src, dst)
            else:
                dst.copy_(src)  # a memcpy node: these very bytes, at replay

        _Graph.capturing.calls.append(replay_copy)

    def capture_transfer(machine, step, pools, stream):
        src = pools[step.src].storages[step.buffer][step.start:step.end]
        dst = pools[step.dst].storages[step.buffer][step.start:step.end]

        def replay_transfer(src_pool=pools[step.src], dst_pool=pools[step.dst]):
            _check_bound(src_pool, [(step.buffer, src)], f"transfer of {step.buffer} from {step.src}")
            _check_bound(dst_pool, [(step.buffer, dst)], f"transfer of {step.buffer} to {step.dst}")
            dst.copy_(src)  # a memcpy node: these very bytes, at replay

        _Graph.capturing.calls.append(replay_transfer)

    orig_init = placed_mod.PlacedExecutor.__init__

    def init(self, *a, cuda_graphs=False, **k):
        orig_init(self, *a, **k)
        self.set_cuda_graphs(cuda_graphs)

    monkeypatch.setattr(graphs_mod, "capture_copy", capture_copy)
    monkeypatch.setattr(graphs_mod, "capture_transfer", capture_transfer)
    monkeypatch.setattr(executor_mod.KernelLauncher, "launch", launch)
    monkeypatch.setattr(placed_mod.PlacedExecutor, "__init__", init)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: CpuStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s=None: contextlib.nullcontext())
