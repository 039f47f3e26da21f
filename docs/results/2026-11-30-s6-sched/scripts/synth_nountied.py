import sys, time, numpy as np
sys.path.insert(0, "/work/wt-sched/bench")
import bench_scheduler as bs
bs.HOP_US = 52.0
import torch_tessera.scheduler.solve as solve
from torch_tessera.scheduler import plan
mode = sys.argv[1]
if mode == "nountied":
    solve.untied_fits = lambda *a: False
for D in (2, 3, 4):
    for size in (50, 100, 200, 500, 1000, 1500):
        dag, costs, tp = bs.case("layers", size, D)
        plan(dag, costs, tp, cache_dir=False)
        ts = []
        for _ in range(2):
            t = time.perf_counter(); p = plan(dag, costs, tp, cache_dir=False); ts.append(time.perf_counter() - t)
        print(f"{mode} D={D} kernels={dag.num_kernels} {min(ts)*1e3:.1f} ms cycle {p.predicted_seconds*1e6:.2f} us gap {100*p.gap:.2f} % {p.solver.method}", flush=True)
