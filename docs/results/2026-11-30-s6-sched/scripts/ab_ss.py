import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
import torch_tessera.scheduler.counts as counts
from torch_tessera.scheduler import plan
for model in ["llama", "moe", "mamba"]:
    for dev in ["2", "4"]:
        mw = load(model, {"2": D2, "4": D4}[dev])
        out = []
        for ss in (2, 1):
            counts.SPLIT_STARTS = ss
            ts = []
            for _ in range(5):
                t = time.perf_counter()
                p = plan(mw.workload, None, mw.topology, policy="throughput", cache_dir=False)
                ts.append(time.perf_counter() - t)
            out.append(f"{ss}: {p.predicted_seconds:.7g} {p.solver.method} {1e3*np.median(ts):.0f} ms")
        print(model, dev, " | ".join(out), flush=True)
