"""Iterated local search offline: perturb (an interval of layers to a random device, or a few random groups), then
the untied local search; keep the best. Seeds: the given placement files."""
import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from torch_tessera.scheduler.chains import Units
from torch_tessera.scheduler.heuristics import local_search
from torch_tessera.scheduler.blocks import block_memory_ok
model, dev, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = sys.argv[4:]
mw, pb = problem(model, {"2": D2, "4": D4}[dev])
groups = aggregate(pb, pb.group)
u = Units(pb, groups)
rng = np.random.default_rng(0)
best = None
for f in files:
    place = np.load(f)
    gp = np.zeros(groups.B, np.int64); gp[pb.group] = place
    v = block_cycle(groups, gp)
    print(f, v, flush=True)
    if best is None or v < best[0]: best = (v, gp)
v0 = best[0]
cur = best
T = time.perf_counter() + secs
it = 0
while time.perf_counter() < T:
    it += 1
    gp = cur[1].copy()
    r = rng.random()
    if r < 0.6:
        ch = u.chains[rng.integers(len(u.chains))]
        L = int(rng.integers(1, 9)); lo = int(rng.integers(0, max(1, len(ch) - L + 1)))
        g = int(rng.integers(pb.D))
        sel = np.isin(u.of_group, ch[lo:lo + L])
        gp[sel & (groups.pinned < 0)] = g
    else:
        k = int(rng.integers(2, 12))
        idx = rng.choice(groups.B, k, replace=False)
        idx = idx[groups.pinned[idx] < 0]
        gp[idx] = rng.integers(pb.D, size=len(idx))
    gp = local_search(pb, groups, gp, time.perf_counter() + 5)
    if not block_memory_ok(pb, groups, gp):
        continue
    v = block_cycle(groups, gp)
    if v < cur[0] * (1 - 1e-12) or (v <= cur[0] * (1 + 1e-9) and rng.random() < 0.3):
        cur = (v, gp)
    if v < best[0] * (1 - 1e-12):
        best = (v, gp)
        print(f"it {it}: {v:.7g} ({100*(v/v0-1):+.3f} % vs start)", flush=True)
print(f"{model} {dev}: {it} iterations, best {best[0]:.7g}, start {v0:.7g}, {100*(best[0]/v0-1):+.3f} %", flush=True)
np.save(f"/tmp/s6/ils_{model}_{dev}.npy", groups.expand(best[1]))
