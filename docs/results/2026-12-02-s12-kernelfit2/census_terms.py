"""Which launches carry a census's time share, and which kernel-model term decides each (analysis, not a tool).

    PYTHONPATH=$PWD python docs/results/2026-12-02-s12-kernelfit2/census_terms.py MODEL [sim:a100,sim:l40s [PREFILL_TOKENS]]

Per program: launches grouped by (op class, the term that is largest on each device: tensor / cuda / memory / fixed),
with the A100 time they take and the share of it faster on the L40S; then the launches with the most A100 time.
"""
import math
import sys
from collections import defaultdict

from torch_tessera.backend.workload import model_workload
from torch_tessera.lowering.op_class import classify
from torch_tessera.target import catalog
from torch_tessera.target.costmodel import program_features
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import CALIBRATED as M, _grid

model = sys.argv[1]
specs = [parse_device(d) for d in (sys.argv[2] if len(sys.argv) > 2 else "sim:a100,sim:l40s").split(",")]


def terms(f, d):
    """(total, {term: seconds}) mirroring KernelModel.predict."""
    e = catalog.CATALOG[d.catalog_key]
    clock = e.kernel.boost_clock_hz.value
    blocks, slots, occ, eff = _grid(f, d.sm_count, int(e.kernel.max_threads_per_sm.value))
    t = {"tensor": M._tensor_seconds(f, e, d, clock, math.ceil(blocks / slots), occ, eff),
         "cuda": f.flops / (e.peak_fp32_flops.value * d.sm_count / d.total_sms * M.eta_cuda * eff)
         if f.flops and not f.tensor_core else 0.0,
         "memory": M._memory_seconds(f, e, d, clock, occ)}
    fixed = M.floor_s + M.latency_cycles / clock
    total = fixed + max(t.values())
    t["fixed"] = fixed
    return total, t


mw = model_workload(model, specs, prefill_tokens=int(sys.argv[3]) if len(sys.argv) > 3 else 1024)
for wp, prog in zip(mw.workload.programs, mw.programs):
    feats = program_features(prog)
    groups = defaultdict(lambda: [0, 0.0, 0.0, 0])
    rows = []
    total_a = 0.0
    for launch, f in zip(prog.launches, feats):
        (ta, pa), (tb, pb) = terms(f, specs[0]), terms(f, specs[1])
        da = max(("tensor", "cuda", "memory"), key=pa.get)
        db = max(("tensor", "cuda", "memory"), key=pb.get)
        da = da if pa[da] > pa["fixed"] else "fixed"
        db = db if pb[db] > pb["fixed"] else "fixed"
        g = groups[(classify(launch).value, da, db)]
        g[0] += 1
        g[1] += ta
        g[2] += ta if tb < ta else 0.0
        g[3] += tb < ta
        total_a += ta
        rows.append((ta, tb, f, da, db))
    faster = sum(g[2] for g in groups.values())
    print(f"\n{model} {wp.name} (x{wp.frequency:g}): {len(rows)} launches, A100 {total_a*1e3:.3f} ms, "
          f"faster on the L40S: {sum(g[3] for g in groups.values())} launches, {100*faster/total_a:.1f} % of A100 time")
    print(f"  {'class':12} {'A100 term':8} {'L40S term':9} {'n':>5} {'A100 ms':>8} {'% A100':>7} {'n faster':>8} "
          f"{'faster ms':>9}")
    for (c, da, db), (n, ta, tf, nf) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"  {c:12} {da:8} {db:9} {n:5d} {ta*1e3:8.3f} {100*ta/total_a:6.1f}% {nf:8d} {tf*1e3:9.3f}")
    print("  largest launches (A100 us, L40S us, ratio, terms):")
    for ta, tb, f, da, db in sorted(rows, key=lambda r: -r[0])[:12]:
        print(f"    {f.label[:40]:40} {f.kernel_class.value:11} {ta*1e6:9.1f} {tb*1e6:9.1f} {tb/ta:5.2f} {da}/{db} "
              f"GF {f.flops/1e9:8.2f} MB {f.nbytes/1e6:8.2f} b {f.blocks}")
