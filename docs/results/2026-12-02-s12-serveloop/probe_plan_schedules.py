"""Which scheduler plans of the tiny Llama on cpu:0,cpu:1 carry a pipelined schedule whose streams differ from the
unit-cost schedule of the same placement (what the distributed executor replayed before it took the plan's).

Run from the repository root: ``PYTHONPATH=. python docs/results/2026-12-02-s12-serveloop/probe_plan_schedules.py``.
Prints, per policy: micro-batches, simulated seconds, DAG edges cut (any kind), the schedule's memory domains,
whether its streams equal the unit-cost ones, whether its placement is the plan's.
"""
import time, torch, logging
from tests.runtime.test_pipelining import _compile
from torch_tessera.models import build_model
from torch_tessera.backend.pipeline import estimate, place
from torch_tessera.target.devices import parse_device
from torch_tessera.scheduler.gantt import simulated_schedule
from torch_tessera.scheduler.modulo import build_pipelined_schedule
t=time.time()
torch.manual_seed(0)
model, inputs = build_model("llama", "tiny")
runner, template = _compile(model, inputs)
print("compile", time.time()-t, len(runner.program.launches))
specs=[parse_device(d) for d in ("cpu:0","cpu:1")]
costs, topo = estimate(runner.program, specs)
for pol in ("throughput","af","layer","latency"):
    t=time.time()
    pl, plan = place(runner.program, runner.dag, specs, pol, costs=costs, topology=topo)
    cuts = sum(1 for u,v in runner.dag.graph.edges if pl[u]!=pl[v])
    s = simulated_schedule(plan, runner.dag, costs, topo).schedule
    u = build_pipelined_schedule(runner.dag, pl, plan.micro_batches, domains=(0,1), devices=2)
    print(pol, "M", plan.micro_batches, "sim", plan.simulated_seconds, "cuts", cuts, "dom", s.domains, "same_as_unit", s.streams==u.streams, "placement_eq", dict(s.placement)==dict(pl), round(time.time()-t,2))
