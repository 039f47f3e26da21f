import sys, time, numpy as np
sys.path.insert(0, "/tmp/s6")
from common import *
from torch_tessera.scheduler.blocks import block_loads_many, layer_units
model, dev, f = sys.argv[1], sys.argv[2], sys.argv[3]
mw, pb = problem(model, {"2": D2, "4": D4}[dev])
groups = aggregate(pb, pb.group)
place = np.load(f)
gp = np.zeros(groups.B, np.int64); gp[pb.group] = place
d, l = block_loads_many(groups, gp[None])
print("programs", pb.programs, "freq", pb.freq, "devices", pb.devices)
print("cycle", block_cycle(groups, gp), "dev loads ms", np.round(d[0]*1e3, 3), "max link ms", np.round(l[0].max()*1e3, 3))
print("hop us", pb.hop*1e6)
units = np.array([-1 if u is None else u for u in layer_units(pb)])
for p in range(len(pb.programs)):
    ks = pb.program_slice(p)
    s = ""
    for u in np.unique(units[ks]):
        kk = ks[units[ks] == u]
        c = np.bincount(place[kk], minlength=pb.D)
        s += f" {u}:" + "".join(str(x) for x in np.flatnonzero(c)) 
    print(pb.programs[p], len(ks), "kernels; per-unit devices:", s)
    cut = (place[pb.esrc] != place[pb.edst]) & (pb.prog[pb.esrc] == p) & (pb.ewbytes > 0)
    print("  cut edges", cut.sum(), "homo cost per device ms", np.round(pb.wcost[ks].sum(0)*1e3, 3))
