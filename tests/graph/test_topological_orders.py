"""Any topological order of the dependency DAG computes what eager PyTorch computes, on every model of the corpus.

Each model of the PTX validation corpus (``tests/ptx/zoo.py``) is lowered once, its DAG built from the PTX access
summaries (sm_80 and sm_90), and the single-device executor then runs its launches in many random topological orders
of that DAG. Every fresh allocation is filled with NaN bytes (:data:`torch_tessera.runtime.placed.POISON`) and
temporaries are freed after their last use *in the order run*, so a launch scheduled before a producer it depends on
reads garbage or a freed buffer: a dependency the DAG misses shows up as a wrong value or an error. Each order must
give the eager result (``assert_close``) and exactly the program-order result (kernels are deterministic on CPU).
``tests/graph/test_mutation.py`` shows that this check fails when one RAW edge is dropped.

The helpers here (:func:`lowered`, :func:`random_topological_order`, :func:`run_graphs`, :func:`mismatch`) are shared
with the mutation test.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence
from unittest import mock

import networkx as nx
import pytest
import torch

from tests.ptx import conftest as _ptx_env  # noqa: F401  (sets TRITON_INTERPRET before Triton is imported)
from tests.ptx.zoo import zoo
from torch_tessera.errors import TesseraError
from torch_tessera.graph import DependencyGraph, build_dependency_graph
from torch_tessera.lowering import lower
from torch_tessera.lowering.program import BufferKind, TensorArg
from torch_tessera.ptx import analyze_program
from torch_tessera.runtime.executor import BufferPool, KernelLauncher, ProgramExecutor, launch_buffers
from torch_tessera.runtime.placed import POISON

DRAWS = 200  # random topological orders drawn per model
ORDERS = 12  # distinct orders run per model (each run costs ~0.1-1 s in the Triton interpreter)
SEED = 0


@dataclass
class GraphUnderTest:
    """One graph Dynamo compiled for a model: its program, DAG and executor, and the inputs of its first call.

    ``reference`` holds the outputs of the first call (program order), checked against eager through the compiled
    model; later runs call the executor directly with ``inputs`` (the same tensors, so in-place state updates land in
    the model's buffers) and compare with ``reference``.
    """

    program: Any
    dag: DependencyGraph
    executor: ProgramExecutor
    inputs: list = field(default_factory=list)
    reference: list = field(default_factory=list)

    def __call__(self, args: list) -> list:
        self.inputs = list(args)
        args.clear()
        out = self.executor.run(self.inputs)
        self.reference = [o.clone() if isinstance(o, torch.Tensor) else o for o in out]
        return out


@dataclass
class LoweredModel:
    """A corpus model lowered once, its graphs' program-order outputs checked against eager.

    Attributes:
        name: corpus name.
        fn: the model (an ``nn.Module`` or a function).
        graphs: the graphs Dynamo compiled, in call order.
        state: the model's state before any call (restored before each run: the KV cache is mutated in place).
        want_state: eager state after one call.
    """

    name: str
    fn: Any
    graphs: list[GraphUnderTest] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    want_state: dict[str, torch.Tensor] = field(default_factory=dict)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Fill every buffer the executor allocates with :data:`POISON` bytes (NaN in every float dtype)."""
    allocate = BufferPool.allocate

    def poisoned(pool: BufferPool, name: str, nbytes: int) -> None:
        allocate(pool, name, nbytes)
        pool.storages[name].fill_(POISON)

    with mock.patch.object(BufferPool, "allocate", poisoned):
        yield


def _state(fn: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in fn.state_dict().items()} if isinstance(fn, torch.nn.Module) else {}


#: Corpus models run side by side in one graph: independent branches give many topological orders, and Inductor's
#: buffer reuse across branches gives WAR/WAW edges between them.
COMPOSITE = ("mlp", "selective_scan", "moe", "conv_block", "index_add_scatter", "split_k_reduction")


def _composite(parts: dict[str, tuple[Any, tuple]]) -> tuple[Any, tuple]:
    fns = [parts[n][0] for n in COMPOSITE]
    arity = [len(parts[n][1]) for n in COMPOSITE]

    def composite(*args: Any) -> list:
        out, i = [], 0
        for f, k in zip(fns, arity):
            out.append(f(*args[i:i + k]))
            i += k
        return out

    return composite, tuple(x for n in COMPOSITE for x in parts[n][1])


def shared_temp(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One temporary (the GEMM output) read by two kernels that no edge orders: in an order that runs the later one
    first, the temporary must stay alive until the other has run (freeing it after its last use in *program* order
    would be wrong)."""
    y = x @ w
    return y.sum(0), y.amax(1)


def _models() -> dict[str, tuple[Any, tuple]]:
    torch.manual_seed(SEED)
    models = {name: (fn, inputs) for name, fn, inputs in zoo()}
    models["zoo_composite"] = _composite(models)
    models["shared_temp"] = (shared_temp, (torch.randn(8, 16), torch.randn(16, 32)))
    return models


MODELS = _models()


@functools.lru_cache(maxsize=None)
def lowered(name: str) -> LoweredModel:
    """Lower corpus model ``name`` once per session and check its program-order run against eager.

    Raises:
        AssertionError: the compiled model (every graph in program order, poisoned allocations) differs from eager.
    """
    fn, inputs = MODELS[name]
    model = LoweredModel(name, fn, state=_state(fn))

    def on_captured(captured: Any) -> GraphUnderTest:
        program = captured.program
        dag = build_dependency_graph(program, analyze_program(program, targets=(80, 90)))
        graph = GraphUnderTest(program, dag, ProgramExecutor(program, captured.kernel_objects))
        model.graphs.append(graph)
        return graph

    eager = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: lower(gm, ex, on_captured), dynamic=False)
    with torch.no_grad(), poisoned_allocations():
        want = eager(*inputs)
        got = compiled(*inputs)
    model.want_state = _state(eager)
    torch.testing.assert_close(got, want, msg=lambda m: f"{name}, program order: {m}")
    torch.testing.assert_close(_state(fn), model.want_state, msg=lambda m: f"{name}, state: {m}")
    return model


def run_graphs(model: LoweredModel, orders: Sequence[Sequence[int] | None]) -> tuple[list, dict[str, torch.Tensor]]:
    """Run every graph from the model's initial state, graph ``i`` in ``orders[i]``: outputs per graph, state after."""
    if isinstance(model.fn, torch.nn.Module):
        model.fn.load_state_dict(model.state)
    with torch.no_grad(), poisoned_allocations():
        out = [g.executor.run(g.inputs, order) for g, order in zip(model.graphs, orders)]
    return out, _state(model.fn)


def mismatch(model: LoweredModel, outputs: list, state: dict[str, torch.Tensor]) -> str | None:
    """Why ``outputs`` and ``state`` differ from eager (the eager-checked program-order outputs), else ``None``."""
    try:
        torch.testing.assert_close(outputs, [g.reference for g in model.graphs])
        torch.testing.assert_close(state, model.want_state)
    except AssertionError as e:
        return str(e).strip().splitlines()[0]
    return None


def random_topological_order(graph: nx.DiGraph, rng: random.Random) -> list[int]:
    """A topological order of ``graph`` drawn by picking a uniformly random ready node at each step."""
    indegree = {n: graph.in_degree(n) for n in graph}
    ready = [n for n, d in indegree.items() if d == 0]
    order = []
    while ready:
        n = ready.pop(rng.randrange(len(ready)))
        order.append(n)
        for s in graph.successors(n):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    assert len(order) == graph.number_of_nodes(), "the DAG has a cycle"
    return order


def is_topological(graph: nx.DiGraph, order: Sequence[int]) -> bool:
    position = {n: i for i, n in enumerate(order)}
    return len(position) == graph.number_of_nodes() and all(position[u] < position[v] for u, v in graph.edges)


def has_several_orders(graph: nx.DiGraph) -> bool:
    """Whether ``graph`` has more than one topological order (it does unless one path visits every node)."""
    order = list(nx.topological_sort(graph))
    return not all(graph.has_edge(a, b) for a, b in zip(order, order[1:]))


def test_random_order_helper_draws_only_and_many_topological_orders():
    g = nx.DiGraph([(0, 1), (0, 2), (1, 3), (2, 3)])
    g.add_node(4)
    rng = random.Random(1)
    orders = {tuple(random_topological_order(g, rng)) for _ in range(200)}
    assert all(is_topological(g, o) for o in orders)
    assert len(orders) == 10  # 2 orders of {1, 2} times 5 positions of the free node 4
    assert has_several_orders(g) and not has_several_orders(nx.DiGraph([(0, 1), (1, 2), (0, 2)]))


def test_executor_rejects_an_order_that_is_not_a_permutation():
    model = lowered("mlp")
    graph = model.graphs[0]
    n = len(graph.program.launches)
    for bad in (list(range(n - 1)), [0] * n, list(range(1, n + 1))):
        with pytest.raises(TesseraError, match="permutation"):
            graph.executor.run(graph.inputs, order=bad)


@pytest.mark.parametrize("name", list(MODELS))
def test_random_topological_orders_equal_eager(name):
    model = lowered(name)
    rng = random.Random(f"{SEED}:{name}")
    orders = {tuple(tuple(random_topological_order(g.dag.graph, rng)) for g in model.graphs) for _ in range(DRAWS)}
    orders = rng.sample(sorted(orders), min(ORDERS, len(orders)))
    if any(has_several_orders(g.dag.graph) for g in model.graphs):  # the random orders must really differ
        assert len(orders) > 1, f"{name}: every random order was the same"
    executed = [g.executor.launches_executed for g in model.graphs]
    for order in orders:
        got, state = run_graphs(model, order)
        problem = mismatch(model, got, state)
        assert problem is None, f"{name}, order {order}: {problem}"
        torch.testing.assert_close(got, [g.reference for g in model.graphs], rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{name}, order {order} differs from program order: {m}")
    assert [g.executor.launches_executed - e for g, e in zip(model.graphs, executed)] == [
        len(orders) * len(g.program.launches) for g in model.graphs]  # every launch of every order ran
    print(f"\n{name}: {len(orders)} distinct topological orders over {[len(g.program.launches) for g in model.graphs]} "
          f"launches equal eager")


@pytest.mark.parametrize("name", ["shared_temp", "moe", "zoo_composite"])
def test_temporaries_live_from_first_to_last_use_in_the_order_run(name):
    model = lowered(name)
    graph = model.graphs[0]
    program = graph.program
    rng = random.Random(7)
    order = next(o for o in (random_topological_order(graph.dag.graph, rng) for _ in range(100)) if o != sorted(o))
    events: list[tuple[str, Any]] = []
    allocate, free, launch = BufferPool.allocate, BufferPool.free, KernelLauncher.launch

    def logged_allocate(pool, buffer, nbytes):
        events.append(("alloc", buffer))
        allocate(pool, buffer, nbytes)

    def logged_free(pool, buffer):
        events.append(("free", buffer))
        free(pool, buffer)

    def logged_launch(launcher, lau, pool, stream=None):
        events.append(("launch", lau.index))
        return launch(launcher, lau, pool, stream)

    with mock.patch.object(BufferPool, "allocate", logged_allocate), \
            mock.patch.object(BufferPool, "free", logged_free), \
            mock.patch.object(KernelLauncher, "launch", logged_launch), torch.no_grad():
        graph.executor.run(graph.inputs, order)
    assert [i for kind, i in events if kind == "launch"] == order
    temps = {b for b, buf in program.buffers.items() if buf.kind == BufferKind.TEMP}
    outputs = {o.buffer for o in program.outputs if isinstance(o, TensorArg)}
    allocated = [b for kind, b in events if kind == "alloc"]
    freed = [b for kind, b in events if kind == "free"]
    assert len(allocated) == len(set(allocated)), "a temporary was freed before a later use and allocated again"
    assert set(freed) <= temps - outputs and len(freed) == len(set(freed))
    assert set(freed) >= set(allocated) - outputs  # every temporary it allocated is released
    position = {i: k for k, i in enumerate(order)}
    for k, (kind, buffer) in enumerate(events):
        if kind != "free":
            continue
        users = [position[e[1]] for e in events[:k] if e[0] == "launch" and buffer in launch_buffers(
            program.launches[e[1]])]
        later = [e[1] for e in events[k:] if e[0] == "launch" and buffer in launch_buffers(program.launches[e[1]])]
        assert users and not later, f"{buffer} freed before launches {later} that use it"
