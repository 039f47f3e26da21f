"""Held-out harness for session 17 (analysis): samples regenerated from /tmp/pf4_kt with the working tree's features;
HELPER_OPS='welford_reduce=14,exp=16' overrides per-helper counts (experiment)."""
import json, os, pickle, sys, time, re
from collections import defaultdict
import numpy as np
from torch_tessera.target import triton_work as tw
over = {k: int(v) for k, v in (kv.split("=") for kv in os.environ.get("HELPER_OPS", "").split(",") if kv)}
if over:
    orig = tw._LIBRARY
    def ops_per_element(body, _o=tw.ops_per_element):
        return _o(body)
    # patch: count each library call by name
    base_ops = tw.LIBRARY_CALL_OPS
    def patched(body):
        per_row=set(); ops=len(tw._MEMORY.findall(body))
        for line in body.splitlines():
            m=tw._ASSIGN.match(line)
            if m is None: continue
            targets=[t.strip() for t in m.group(1).split(",")]; expr=m.group(2)
            if expr.startswith("tl.full("): per_row.update(targets); continue
            refs=set(tw._TMP.findall(expr))
            if tw._REDUCE.search(expr) or ("tl.load(" not in expr and refs and refs <= per_row):
                per_row.update(targets); ops += 1 if tw._REDUCE.search(expr) else 0; continue
            calls=re.findall(r"\b(?:libdevice|tl_math|triton_helpers)\.(\w+)\(", expr)
            ops += 1 + sum(over.get(c, base_ops) for c in calls)
        return max(1, ops)
    tw.ops_per_element = patched
    import torch_tessera.target.costmodel as cm
    cm.ops_per_element = patched
from torch_tessera.commands import calibrate as cal
from torch_tessera.target.devices import parse_device
t0=time.time()
samples, _ = cal.load_launch_time_samples('/tmp/pf4_kt', 5e-6)
print(f"samples {len(samples)} in {time.time()-t0:.0f}s", flush=True)
specs = {d: parse_device(d) for d in {s.device for s in samples}}
DEVS = ("sim:h200@16sm", "sim:h200@24sm", "sim:h200@72sm")
def kind(f):
    if f.scores: return "attn"
    k = f.kernel_class.name[:5].lower()
    if f.tensor_core: return k + "-tc"
    if f.label.startswith("triton"): return k + "-tri"
    return k + "-lib"
tag = sys.argv[1]
rows, table = [], {}
for held in sorted({s.model for s in samples}):
    import dataclasses
    from torch_tessera.target.kernelmodel import KernelModel
    fixed = {k: float(v) for k, v in (kv.split("=") for kv in os.environ.get("FIXED", "").split(",") if kv)}
    for k in fixed: cal.FREE.pop(k, None)
    m = cal.fit([s for s in samples if s.model != held], specs, start=dataclasses.replace(KernelModel(), **fixed))
    print(held, {k: round(getattr(m, k), 4) for k in list(cal.FREE) + list(fixed)}, flush=True)
    res = [(s, m.predict(s.features, specs[s.device]) / s.seconds - 1) for s in samples if s.model == held]
    rows += res
    w = [abs(e) for s, e in res if "@" not in s.device]; p = [abs(e) for s, e in res if "@" in s.device]
    per = {d: float(np.median([abs(e) for s, e in res if s.device == d])) for d in DEVS}
    table[held] = (float(np.median(w)), float(np.median(p)), per)
over15 = sum(max(0, v * 100 - 15) for h in table.values() for v in h[:2])
print(f"== {tag} {os.environ.get('HELPER_OPS','')} ({time.time() - t0:.0f}s)  over15 {over15:.2f}")
for h, (w, p, per) in table.items():
    print(f"  {h:6} whole {w * 100:5.2f}  parts {p * 100:5.2f}   " + " ".join(f"{per[d] * 100:5.1f}" for d in per))
g = defaultdict(lambda: ([], []))
for s, e in rows: g[(s.model[:5], kind(s.features))]["@" in s.device].append(e)
def cell(a): return f"{np.median(a) * 100:+6.1f} {np.median(np.abs(a)) * 100:5.1f} ({len(a):3d})" if len(a) else " " * 19
for k in sorted(g):
    w, p = (np.array(x) for x in g[k]); print(f"   {k[0]:5} {k[1]:12} {cell(w)} | {cell(p)}")
pickle.dump([(s.model, s.program, s.device, s.features, s.seconds, e) for s, e in rows], open(f"/tmp/s17/rows_{tag}.pkl", "wb"))
