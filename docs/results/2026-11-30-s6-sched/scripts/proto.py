import sys, time, dataclasses, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from unitmilp import unit_label
from torch_tessera.scheduler.blocks import block_loads_many, moved_loads_many, block_memory_ok_many, layer_units, memory_binds
from torch_tessera.scheduler.heuristics import local_search
from torch_tessera.scheduler.counts import _key

def chains_of(pb, groups, glab):
    B = glab.max() + 1
    kb = glab[pb.group]
    first = np.full(B, pb.n); np.minimum.at(first, kb, np.arange(pb.n))
    bprog = pb.prog[first]
    multi = np.zeros(B, bool)
    multi[kb[pb.prog != bprog[kb]]] = True
    ch = []
    for p in range(len(pb.programs)):
        bs = np.flatnonzero((bprog == p) & ~multi)
        bs = bs[np.argsort(first[bs])]
        if len(bs) >= 2: ch.append(bs)
    return ch

def interval_descent(pb, ub, chains, up, deadline, max_steps=500):
    D = pb.D
    up = up.copy()
    movable = ub.pinned < 0
    binds = memory_binds(pb, ub)
    single = np.flatnonzero(movable)
    dev, link = (x[0] for x in block_loads_many(ub, up[None]))
    key = _key(dev[None], link[None])[:, 0]
    steps = 0
    while steps < max_steps and time.perf_counter() < deadline:
        move, grp, to = [], [], []
        m = 0
        # single moves of any block
        for g in range(D):
            s = single[up[single] != g]
            move.append(np.arange(m, m + len(s))); grp.append(s); to.append(np.full(len(s), g)); m += len(s)
        for ch in chains:
            x = up[ch]; U = len(ch)
            anchors = np.flatnonzero(np.r_[True, x[1:] != x[:-1], True])
            seen = set()
            for a in anchors.tolist():
                for lo, hi in [(a, b) for b in range(a + 2, U + 1)] + [(b, a) for b in range(0, a - 1)]:
                    if (lo, hi) in seen: continue
                    seen.add((lo, hi))
                    idx = ch[lo:hi]
                    for g in range(D):
                        sel = idx[(up[idx] != g) & movable[idx]]
                        if not len(sel): continue
                        move.append(np.full(len(sel), m)); grp.append(sel); to.append(np.full(len(sel), g)); m += 1
        move, grp, to = np.concatenate(move), np.concatenate(grp), np.concatenate(to)
        d1, l1 = moved_loads_many(ub, up, move, grp, to, m, dev, link)
        k = _key(d1, l1)
        better = (k[0] < key[0] * (1 - 1e-9)) | ((k[0] <= key[0] * (1 + 1e-12)) & (k[1] < key[1] * (1 - 1e-9)))
        cand = np.flatnonzero(better)
        if not len(cand): break
        order = cand[np.lexsort((k[1][cand], k[0][cand]))]
        t = int(order[0])
        sel = move == t
        up[grp[sel]] = to[sel]
        dev, link = (x[0] for x in block_loads_many(ub, up[None]))
        key = _key(dev[None], link[None])[:, 0]
        steps += 1
    return up, steps

if __name__ == "__main__":
    model, dev = sys.argv[1], sys.argv[2]
    mw, pb = problem(model, {"2": D2, "4": D4}[dev])
    groups = aggregate(pb, pb.group)
    glab = unit_label(pb)
    B = glab.max() + 1
    pin = np.full(B, -1); pin[glab[groups.pinned >= 0]] = groups.pinned[groups.pinned >= 0]
    pb2 = dataclasses.replace(pb, group=glab[pb.group], pinned=pin)
    ub = aggregate(pb2, pb2.group)
    chains = chains_of(pb, groups, glab)
    print("chains", [len(c) for c in chains], "unit blocks", ub.B)
    place = np.load(f"/tmp/s6/default_{model}_{dev}.npy")
    gp0 = np.zeros(groups.B, np.int64); gp0[pb.group] = place
    v0 = block_cycle(groups, gp0)
    # majority projection
    up = np.zeros(B, np.int64)
    cnt = np.zeros((B, pb.D)); np.add.at(cnt, glab, np.eye(pb.D)[gp0] * groups.cost.sum(1)[:, None] + 1e-12)
    up = cnt.argmax(1)
    starts = {"default-proj": up}
    for g in range(pb.D): starts[f"homo{g}"] = np.full(B, g)
    for name, s in starts.items():
        t = time.perf_counter()
        u2, steps = interval_descent(pb, ub, chains, s, time.perf_counter() + 20)
        t1 = time.perf_counter() - t
        gp = u2[glab]
        v = block_cycle(groups, gp)
        gp2 = local_search(pb, groups, gp, time.perf_counter() + 10)
        v2 = block_cycle(groups, gp2)
        print(f"{name}: start {block_cycle(ub, s):.7g} -> unit {v:.7g} ({steps} steps, {t1:.2f}s) -> polished {v2:.7g}  vs default {100*(v2/v0-1):+.2f}%", flush=True)

def whole_starts(pb, ub, chains, D):
    import itertools
    out = {}
    for devs in itertools.product(range(D), repeat=len(chains)):
        up = np.full(ub.B, devs[0])
        for c, g in zip(chains, devs): up[c] = g
        out[f"whole{devs}"] = up
    return out
