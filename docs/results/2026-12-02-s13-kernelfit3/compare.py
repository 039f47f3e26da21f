import pickle, sys
from collections import defaultdict
sys.path.insert(0,'/tmp/kf3')
from h import kind
a = pickle.load(open(f'/tmp/kf3/rows_{sys.argv[1]}.pkl','rb')); b = pickle.load(open(f'/tmp/kf3/rows_{sys.argv[2]}.pkl','rb'))
model = sys.argv[3]; kinds = sys.argv[4].split(',') if len(sys.argv) > 4 else None
devs = ["sim:h200", "sim:h200@72sm", "sim:h200@24sm", "sim:h200@16sm"]
g = defaultdict(dict)
for (m, d, f, t, e), (_, _, _, _, e2) in zip(a, b):
    if m != model or (kinds and kind(f) not in kinds): continue
    g[(kind(f), f.label[-24:], f.blocks, round(f.flops/1e9,3), round(f.nbytes/1e6,2))][d] = (t, e, e2)
for k in sorted(g):
    print(f"{k[0]:9} {k[1]:24} b{k[2]:6d} GF{k[3]:8.3f} MB{k[4]:7.2f} " + " ".join(f"{g[k][d][0]*1e6:6.1f}({g[k][d][1]*100:+4.0f}>{g[k][d][2]*100:+4.0f})" if d in g[k] else " "*18 for d in devs))
