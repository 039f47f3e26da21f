"""Held-out harness (analysis, not a tool): the samples pickled by
`load_launch_time_samples('/tmp/pf4_kt', 5e-6)` into /tmp/pf4/samples.pkl; held-out fits of the working tree's
KernelModel, the by-class table, per-launch rows pickled under /tmp/pf4/."""
import json, pickle, sys, time
from collections import defaultdict
import numpy as np
from torch_tessera.commands import calibrate as cal
from torch_tessera.target.devices import parse_device

samples = pickle.load(open('/tmp/pf4/samples.pkl', 'rb'))
specs = {d: parse_device(d) for d in {s.device for s in samples}}
DEVS = ("sim:h200@16sm", "sim:h200@24sm", "sim:h200@72sm")


def kind(f):
    if f.scores: return "attn"
    k = f.kernel_class.name[:5].lower()
    if f.tensor_core: return k + "-tc"
    if f.label.startswith("triton"): return k + "-tri"
    return k + "-lib"


def heldout(tag, detail=False, start=None):
    t0 = time.time()
    rows, table = [], {}
    for held in sorted({s.model for s in samples}):
        m = cal.fit([s for s in samples if s.model != held], specs, start=start)
        res = [(s, m.predict(s.features, specs[s.device]) / s.seconds - 1) for s in samples if s.model == held]
        rows += res
        w = [abs(e) for s, e in res if "@" not in s.device]
        p = [abs(e) for s, e in res if "@" in s.device]
        per = {d: float(np.median([abs(e) for s, e in res if s.device == d])) for d in DEVS}
        table[held] = (float(np.median(w)), float(np.median(p)), per, {k: round(getattr(m, k), 4) for k in cal.FREE})
    over = sum(max(0, v * 100 - 15) for h in table.values() for v in h[:2])
    print(f"== {tag} ({time.time() - t0:.0f}s)  over15 {over:.2f}")
    for h, (w, p, per, c) in table.items():
        print(f"  {h:6} whole {w * 100:5.2f}  parts {p * 100:5.2f}   " + " ".join(f"{per[d] * 100:5.1f}" for d in per)
              + "   " + str(c))
    if detail:
        g = defaultdict(lambda: ([], []))
        for s, e in rows:
            g[(s.model[:5], kind(s.features))]["@" in s.device].append(e)
        def cell(a):
            return f"{np.median(a) * 100:+6.1f} {np.median(np.abs(a)) * 100:5.1f} ({len(a):3d})" if len(a) else " " * 19
        for k in sorted(g):
            w, p = (np.array(x) for x in g[k])
            print(f"   {k[0]:5} {k[1]:12} {cell(w)} | {cell(p)}")
    json.dump(table, open(f"/tmp/pf4/{tag}.json", "w"))
    pickle.dump([(s.model, s.program, s.device, s.features, s.seconds, e) for s, e in rows],
                open(f"/tmp/pf4/rows_{tag}.pkl", "wb"))
    return rows, table


if __name__ == "__main__":
    # FIXED=name=value,...: hold those constants at the value given (out of the fit), e.g. the table's per-wave terms
    import dataclasses, os
    from torch_tessera.target.kernelmodel import KernelModel
    start = None
    if os.environ.get("FIXED"):
        fixed = {k: float(v) for k, v in (kv.split("=") for kv in os.environ["FIXED"].split(","))}
        for k in fixed:
            cal.FREE.pop(k)
        start = dataclasses.replace(KernelModel(), **fixed)
    heldout(sys.argv[1] if len(sys.argv) > 1 else "base", detail=True, start=start)
