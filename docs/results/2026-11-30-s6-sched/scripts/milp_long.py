import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from torch_tessera.scheduler.counts import build_classes, solve_counts
from torch_tessera.scheduler.heuristics import local_search
model, dev, tl = sys.argv[1], sys.argv[2], float(sys.argv[3])
mw, pb = problem(model, {"2": D2, "4": D4}[dev])
groups = aggregate(pb, pb.group)
place = np.load(f"/tmp/s6/default_{model}_{dev}.npy")
gp0 = np.zeros(groups.B, np.int64); gp0[pb.group] = place
v0 = block_cycle(groups, gp0)
print(model, dev, "groups", groups.B, "default", v0, flush=True)
exact = build_classes(pb, groups, np.arange(groups.B))
t = time.perf_counter()
r, c = solve_counts(pb, exact, groups.forbidden, tl, upper=v0, mip_gap=1e-4)
print("milp", r.status, "bound", r.bound, "wall", time.perf_counter() - t, flush=True)
if c is not None:
    gp = c.argmax(1)
    v = block_cycle(groups, gp)
    gp2 = local_search(pb, groups, gp, time.perf_counter() + 30)
    v2 = block_cycle(groups, gp2)
    print("milp plan", v, "polished", v2, "vs default", v2 / v0 - 1, flush=True)
    np.save(f"/tmp/s6/milp_{model}_{dev}.npy", groups.expand(gp2))
