import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from torch_tessera.scheduler import plan
from torch_tessera.scheduler.evaluate import cycle_many
model, dev = sys.argv[1], sys.argv[2]
mw, pb = problem(model, {"2": D2, "4": D4}[dev])
t = time.perf_counter()
p = plan(mw.workload, None, mw.topology, policy="throughput", cache_dir=False)
t = time.perf_counter() - t
# kernel placement in global order
place = np.concatenate([[p.placements[name][k] for k in range(len(p.placements[name]))] for name in pb.programs])
print(model, dev, f"{t*1e3:.0f} ms", p.predicted_seconds, p.gap, p.solver.method, "check", cycle_many(pb, place[None])[0])
np.save(f"/tmp/s6/default_{model}_{dev}.npy", place)
