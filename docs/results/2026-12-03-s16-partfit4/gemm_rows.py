"""Per-launch table of the library GEMMs (analysis, not a tool): for each distinct library GEMM of the held-out runs,
the measured seconds on each device and the held-out error before (main's model) and after (this branch), from the
rows heldout.py pickled (/tmp/pf4/rows_TAG.pkl). Usage: python gemm_rows.py BEFORE_TAG AFTER_TAG."""
import collections, pickle, sys
from torch_tessera.target.library_grid import library_grid

def load(tag):
    return {(m, p, d, f.label, f.flops, f.nbytes, f.blocks): (s, e, f)
            for m, p, d, f, s, e in pickle.load(open(f"/tmp/pf4/rows_{tag}.pkl", "rb"))}

before, after = load(sys.argv[1]), load(sys.argv[2])
g = collections.defaultdict(dict)
for k, (s, e, f) in after.items():
    if f.depth > 0 and f.tensor_core:
        lg = library_grid(f, 132)
        key = (k[0], k[1][:7], f.rows, f.depth, f.cols, f.blocks,
               f"{lg.ctas} {lg.tile_n}x{lg.tile_m}/{lg.splits}" if lg else "per tile")
        g[key][k[2].replace("sim:h200", "") or "132"] = (s * 1e6, before[k][1] * 100, e * 100)
print("model program M K N tiles | rule: CTAs tile/splits | per device: measured us (error before -> after, %)")
for k, v in sorted(g.items()):
    print(f"{k[0]:5} {k[1]:7} {k[2]:5} {k[3]:6} {k[4]:6} {k[5]:5} | {k[6]:16} | " + "  ".join(
        f"{d} {v[d][0]:.1f} ({v[d][1]:+.0f} -> {v[d][2]:+.0f})" for d in ("132", "@72sm", "@24sm", "@16sm") if d in v))
