"""tessera plan on two partitions of one GPU: the GPU's memory counts once, in every plan and baseline."""

from __future__ import annotations

import re

import pytest

from torch_tessera.commands.plan import best_throughput, plan_all, report
from torch_tessera.errors import InfeasiblePlanError
from torch_tessera.scheduler import Plan, synthetic
from torch_tessera.scheduler.types import Workload
from torch_tessera.target.devices import parse_devices
from torch_tessera.target.links import build_topology

H200 = 141 * 10**9


def _plans(devices: str):
    """Every plan of a 16-layer LLM of 97.9 GB (29 GB of weights, 69 GB of KV cache) on ``devices`` (H200s)."""
    specs = parse_devices(devices, assume_gpu="h200")
    names = [s.name for s in specs]
    peaks = {s.name: (s.peak_bf16_flops, s.mem_bandwidth, 4e-6) for s in specs}
    kw = dict(layers=16, hidden=8192, ffn=28672, context=512)
    pre, dec = synthetic.transformer_dag(tokens=1024, **kw), synthetic.transformer_dag(tokens=64, **kw)
    wl = Workload.llm(pre, synthetic.roofline_costs(pre, names, peaks=peaks), dec,
                      synthetic.roofline_costs(dec, names, peaks=peaks), 128.0)
    topo = build_topology(specs)
    plans = plan_all(wl, None, topo, "throughput", True, micro_batches=2, time_limit=5.0, cache_dir=False)
    return best_throughput(plans, wl, topo, micro_batches=2)[0]


def test_partitions_of_one_gpu_plan_within_its_memory_and_request_dist_does_not_fit():
    plans = _plans("cuda:0@104sm,cuda:0@24sm")
    err = plans["request-dist"]
    assert isinstance(err, InfeasiblePlanError)
    m = re.search(r"GPU cuda:0 \(the 141\.00 GB of one NVIDIA H200, shared by cuda:0@104sm, cuda:0@24sm\) needs "
                  r"([\d.]+) GB for its partitions together, has 141\.00 GB", str(err))
    assert m and float(m.group(1)) == pytest.approx(2 * 97.9, abs=0.5), str(err)
    made = {k: p for k, p in plans.items() if isinstance(p, Plan)}
    assert {"throughput", "homo-L", "homo-R", "layer"} <= set(made)
    for name, p in made.items():
        ((gpu, members, held, budget),) = p.memory_pools
        assert (gpu, members, budget) == ("cuda:0", (0, 1), H200) and held <= budget, name
    text = report(plans, "throughput")
    assert "request-dist: request-dist (a full model copy on each of cuda:0@104sm, cuda:0@24sm) does not fit" in text
    assert re.search(r"GPU cuda:0 is shared by cuda:0@104sm, cuda:0@24sm: together they hold throughput [\d.]+ GB, "
                     r".*\(buffers they share once; budget 141\.00 GB\)", text), text


def test_two_whole_gpus_still_hold_a_replica_each():
    plans = _plans("cuda:0,cuda:1")
    rd = plans["request-dist"]
    assert isinstance(rd, Plan) and rd.replicas == (0, 1) and rd.memory_pools == ()
    assert all(b == pytest.approx(97.9e9, rel=0.01) for b in rd.memory_bytes)
