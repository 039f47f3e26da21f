import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
import torch_tessera.scheduler.solve as solve
from torch_tessera.scheduler import plan
for model in ["llama", "moe", "mamba"]:
    for dev in ["2", "4"]:
        mw = load(model, {"2": D2, "4": D4}[dev])
        out = []
        for ps, top in ((True, 2), (False, 2), (False, 1)):
            solve.POLISH_SPLITS, solve.CHAIN_TOP = ps, top
            t = time.perf_counter()
            p = plan(mw.workload, None, mw.topology, policy="throughput", cache_dir=False)
            out.append(f"{ps},{top}: {p.predicted_seconds:.7g} {p.solver.method} {1e3*(time.perf_counter()-t):.0f} ms")
        print(model, dev, " | ".join(out), flush=True)
