import sys, time
from pathlib import Path
sys.path.insert(0, "/work/wt-sched/bench"); sys.path.insert(0, "/work/wt-sched")
import replan_hop as rh
import torch_tessera.scheduler.solve as solve
from torch_tessera.scheduler import plan
real = solve.untied_fits
for model in ["llama", "mamba", "dit"]:
    progs = rh.lowered(model, Path("/tmp/merge-bench/replan-cache"))
    wl, tp = rh.workload(model, 24, progs)
    out = []
    for mode in ("untied", "no-untied"):
        solve.untied_fits = real if mode == "untied" else (lambda *a: False)
        t = time.perf_counter()
        p = plan(wl, None, tp, policy="throughput", cache_dir=False, micro_batches=1)
        out.append(f"{mode}: {p.predicted_seconds:.7g} {p.solver.method} gap {100*p.gap:.2f}% {time.perf_counter()-t:.2f}s")
    print(model, " | ".join(out), flush=True)
