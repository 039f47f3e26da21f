import sys, time, dataclasses, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from torch_tessera.scheduler.counts import build_classes, solve_counts
from torch_tessera.scheduler.heuristics import local_search
from torch_tessera.scheduler.blocks import layer_units, block_memory_ok

def unit_label(pb):
    units = np.array([-1 if u is None else u for u in layer_units(pb)])
    G = int(pb.group.max()) + 1
    U = units.max() + 2
    node = np.where(units >= 0, G + pb.prog * U + units, pb.group)
    # connect each kernel's group with its (prog, unit) node
    n = G + len(pb.programs) * U
    a, b = pb.group, node
    _, lab = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    glab = lab[:G]
    _, glab = np.unique(glab, return_inverse=True)
    return glab  # block of each group

if __name__ == "__main__":
    model, dev, tl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    mw, pb = problem(model, {"2": D2, "4": D4}[dev])
    groups = aggregate(pb, pb.group)
    t = time.perf_counter()
    glab = unit_label(pb)
    B = glab.max() + 1
    pin = np.full(B, -1); pin[glab[groups.pinned >= 0]] = groups.pinned[groups.pinned >= 0]
    pb2 = dataclasses.replace(pb, group=glab[pb.group], pinned=pin)
    ub = aggregate(pb2, pb2.group)
    cls = build_classes(pb2, ub, np.arange(ub.B))
    t1 = time.perf_counter()
    r, c = solve_counts(pb2, cls, ub.forbidden, tl, mip_gap=1e-4)
    t2 = time.perf_counter()
    gp_u = c.argmax(1)
    gp = gp_u[glab]
    v = block_cycle(groups, gp)
    gp2 = local_search(pb, groups, gp, time.perf_counter() + 30)
    v2 = block_cycle(groups, gp2)
    t3 = time.perf_counter()
    place = np.load(f"/tmp/s6/default_{model}_{dev}.npy")
    gp0 = np.zeros(groups.B, np.int64); gp0[pb.group] = place
    v0 = block_cycle(groups, gp0)
    print(f"{model} {dev}: {ub.B} unit blocks, {len(ub.esrc)} edges; build {t1-t:.2f}s milp {r.status} {t2-t1:.2f}s value {r.value if hasattr(r,'value') else ''} bound {r.bound:.7g}; realised {v:.7g} polished {v2:.7g} ({t3-t2:.2f}s) default {v0:.7g} -> {100*(v2/v0-1):+.2f}% mem {block_memory_ok(pb, groups, gp2)}")
    np.save(f"/tmp/s6/unit_{model}_{dev}.npy", groups.expand(gp2))
