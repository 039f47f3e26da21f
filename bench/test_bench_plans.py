"""pytest-benchmark suites for ``tessera bench``'s comparisons at small sizes: each plan's placed program, timed per
call and checked against eager; and the scheduler's solve time.

Cases:

* ``test_plan_call``: a tiny registry model compiled once with the tessera backend on ``TESSERA_BENCH_DEVICES``
  (default ``cpu:0,cpu:1``: two CPU virtual devices, kernels in Triton's interpreter); for every plan (``homo-L``,
  ``homo-R``, ``af``, ``layer``, ``tessera`` = the throughput policy, ``latency``) the placement is computed by the
  scheduler from the roofline costs of ``TESSERA_BENCH_PLAN_SPECS`` (default: the devices themselves on CUDA, the
  simulated ``sim:a100,sim:l40s`` pair on CPU, whose devices have no cost figures), installed, timed per call, and
  its output compared with eager PyTorch. On CPU the times measure the interpreter and the executor, not a GPU: they
  show the runtime's overhead per plan (cut edges cost copies), not the plan's speed on a real pair.
* ``test_solve``: the throughput and latency planners on synthetic transformer DAGs of ~50 and ~200 kernels on a
  simulated pair (:mod:`torch_tessera.scheduler.synthetic`), plan cache off.

Run (not part of ``python -m pytest``, whose ``testpaths`` is ``tests``)::

    PYTHONPATH=$PWD python -m pytest bench/ --benchmark-only
    TESSERA_BENCH_DEVICES=cuda:0,cuda:1@24sm PYTHONPATH=$PWD python -m pytest bench/ --benchmark-only
    TESSERA_BENCH_MODELS=mlp,llama,moe ...   # models (default mlp,llama)

Rounds are kept small (``TESSERA_BENCH_ROUNDS``, default 3 on CPU, 20 on CUDA) because an interpreted call of the tiny
Llama takes about a second.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

DEVICES = tuple(d.strip() for d in os.environ.get("TESSERA_BENCH_DEVICES", "cpu:0,cpu:1").split(","))
ON_CUDA = DEVICES[0].startswith("cuda")
PLAN_SPECS = os.environ.get("TESSERA_BENCH_PLAN_SPECS", ",".join(DEVICES) if ON_CUDA else "sim:a100,sim:l40s")
MODELS = tuple(os.environ.get("TESSERA_BENCH_MODELS", "mlp,llama").split(","))
ROUNDS = int(os.environ.get("TESSERA_BENCH_ROUNDS", "20" if ON_CUDA else "3"))
#: The plans of ``tessera bench`` that are one placement of one program (request-dist and pd are homo-L / homo-R
#: per program and request), with the scheduler's policy name.
PLANS = {"homo-L": "homo-L", "homo-R": "homo-R", "af": "af", "layer": "layer", "tessera": "throughput",
         "latency": "latency"}


class Compiled:
    """A tiny model compiled once with the tessera backend; plans are swapped in with :meth:`use`."""

    def __init__(self, name: str) -> None:
        from torch_tessera.backend import tessera_backend
        from torch_tessera.models import build_model
        from torch_tessera.target.devices import parse_devices

        module, inputs = build_model(name, "tiny")
        target = torch.device("cuda", int(DEVICES[0].split(":")[1].split("@")[0])) if ON_CUDA else "cpu"
        self.module = module.to(target)
        self.inputs = tuple(x.to(target) for x in inputs)
        self.eager = copy.deepcopy(self.module)
        self.specs = parse_devices(PLAN_SPECS)
        holder: list = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list):
            fn = tessera_backend(gm, example_inputs,
                                 options={"devices": DEVICES, "policy": "home", "fallback": "raise"})
            holder.append(fn)
            return fn

        torch._dynamo.reset()
        self.fn = torch.compile(self.module, backend=backend, dynamic=False)
        with torch.no_grad():
            self.want = self.eager(*self.inputs)
            self.fn(*self.inputs)
        self.runner = holder[0].tessera_executors[0]

    def use(self, policy: str) -> dict:
        """Install ``policy``'s placement; returns it (launch index -> device index)."""
        from torch_tessera.backend.pipeline import place

        placement, _ = place(self.runner.program, self.runner.dag, self.specs, policy, cache_dir=False)
        self.runner.set_placement(placement)
        return placement

    def call(self) -> torch.Tensor:
        with torch.no_grad():
            out = self.fn(*self.inputs)
        if ON_CUDA:
            torch.cuda.synchronize()
        return out


_COMPILED: dict[str, Compiled] = {}


def compiled(name: str) -> Compiled:
    if name not in _COMPILED:
        _COMPILED[name] = Compiled(name)
    return _COMPILED[name]


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("model", MODELS)
def test_plan_call(benchmark, model, plan):
    from torch_tessera.runtime.schedule import cut_edge_count
    from torch_tessera.scheduler import NotApplicableError

    c = compiled(model)
    try:
        placement = c.use(PLANS[plan])
    except NotApplicableError as e:
        pytest.skip(f"{plan} does not apply to {model}: {e}")
    got = benchmark.pedantic(c.call, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    torch.testing.assert_close(got, c.want)
    per_device = [sum(1 for d in placement.values() if d == i) for i in range(len(DEVICES))]
    benchmark.extra_info.update(devices=",".join(DEVICES), plan_specs=PLAN_SPECS, launches_per_device=per_device,
                                cut_edges=cut_edge_count(c.runner.dag, placement))


@pytest.mark.parametrize("policy", ["throughput", "latency"])
@pytest.mark.parametrize("layers", [4, 18])
def test_solve(benchmark, layers, policy):
    from torch_tessera.scheduler import plan
    from torch_tessera.scheduler.synthetic import nvlink_topology, roofline_costs, transformer_dag

    devices = ("big", "small")
    dag = transformer_dag(layers=layers, tokens=256, context=2048)
    costs, topo = roofline_costs(dag, devices), nvlink_topology(devices)
    result = benchmark.pedantic(plan, args=(dag, costs, topo), kwargs=dict(policy=policy, cache_dir=False),
                                rounds=3, iterations=1)
    assert result.lower_bound_seconds <= result.predicted_seconds * (1 + 1e-6)
    benchmark.extra_info.update(kernels=dag.graph.number_of_nodes(), predicted_ms=result.predicted_seconds * 1e3,
                                lower_bound_ms=result.lower_bound_seconds * 1e3)
