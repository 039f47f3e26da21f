"""Wall time of ``plan()`` on a full-size model lowered without weights (prefill + decode with the KV cache), on the
simulated A100 + L40S pair and on A100 + L40S + H100 + RTX Pro 6000: throughput and latency policies, median of 3,
with the gap to each plan's own lower bound and the machine's load average.

Usage: ``PYTHONPATH=. python bench/time_real_plans.py [llama|moe]``
"""
import time, sys, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from torch_tessera.backend.workload import model_workload
from torch_tessera.runtime.devices import parse_devices
from torch_tessera.scheduler import plan
import os
model = sys.argv[1] if len(sys.argv) > 1 else "llama"
t=time.perf_counter()
base = model_workload(model, parse_devices("sim:a100,sim:l40s"), size="full")
print(model, "lower+cost", round(time.perf_counter()-t,1), "s; launches", sum(p.dag.num_kernels for p in base.workload.programs), flush=True)
for devs in ("sim:a100,sim:l40s", "sim:a100,sim:l40s,sim:h100,sim:rtxpro6000"):
    mw = base if devs.count(",") == 1 else base.on_devices(parse_devices(devs))
    for pol in ("throughput", "latency"):
        ts = []
        for i in range(3):
            t=time.perf_counter(); p = plan(mw.workload, None, mw.topology, policy=pol, cache_dir=False); ts.append(time.perf_counter()-t)
        print(devs.count(",")+1, "devices", pol, "median %.3f s" % statistics.median(ts), "gap %.3f %%" % (100*p.gap), p.solver.method, "load", os.getloadavg()[0], flush=True)
