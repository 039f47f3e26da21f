"""Wall time of ``plan()`` on a full-size model lowered without weights (prefill + decode programs), on the simulated
A100 + L40S pair and on A100 + L40S + H100 + RTX Pro 6000: throughput and latency policies, median of 3 (and the
first call), with the gap to each plan's own lower bound, the method and the machine's load average.

Usage: ``PYTHONPATH=. python bench/time_real_plans.py [llama|moe|mamba] [prefill_tokens]``

``llama`` and ``moe`` are lowered with the static KV cache (prefill 1x1024, decode 64x1 over 1088 positions).
``mamba`` is lowered cacheless (as ``tessera plan`` does) with a short prefill, default 16 tokens: transformers' torch
path of the selective scan is a Python loop over the sequence, so the prefill program grows with its length.
"""
import os
import statistics
import sys
import time

from torch_tessera.backend.workload import model_workload
from torch_tessera.target.devices import parse_devices
from torch_tessera.scheduler import plan

model = sys.argv[1] if len(sys.argv) > 1 else "llama"
kw = {}
if len(sys.argv) > 2 or model == "mamba":
    kw["prefill_tokens"] = int(sys.argv[2]) if len(sys.argv) > 2 else 16
t = time.perf_counter()
base = model_workload(model, parse_devices("sim:a100,sim:l40s"), size="full", **kw)
print(model, "lower+cost", round(time.perf_counter() - t, 1), "s; launches",
      [p.dag.num_kernels for p in base.workload.programs], kw, flush=True)
for devs in ("sim:a100,sim:l40s", "sim:a100,sim:l40s,sim:h100,sim:rtxpro6000"):
    mw = base if devs.count(",") == 1 else base.on_devices(parse_devices(devs))
    for pol in ("throughput", "latency"):
        ts = []
        for i in range(3):
            t = time.perf_counter()
            p = plan(mw.workload, None, mw.topology, policy=pol, cache_dir=False)
            ts.append(time.perf_counter() - t)
        print(devs.count(",") + 1, "devices", pol, "median %.3f s" % statistics.median(ts), "first %.3f s" % ts[0],
              "value %.6g s" % p.predicted_seconds, "gap %.3f %%" % (100 * p.gap), p.solver.method,
              "load", os.getloadavg()[0], flush=True)
