"""Held-out residuals of the kernel model grouped by launch kind, grid against SMs and bytes (analysis, not a tool).

    PYTHONPATH=$PWD python docs/results/2026-12-02-s12-kernelfit2/analyze.py DIR [-v]

DIR holds the extracted ``*.launch_times.json`` (docs/results/2026-12-02-s11/call1_kt and call2/kt tarballs).
"""
import sys
from collections import defaultdict

import numpy as np

from torch_tessera.commands.calibrate import fit, load_launch_time_samples
from torch_tessera.target.devices import parse_device

samples, _ = load_launch_time_samples(sys.argv[1], 5e-6)
specs = {d: parse_device(d) for d in {s.device for s in samples}}
verbose = "-v" in sys.argv
rows = []
for held in sorted({s.model for s in samples}):
    m = fit([s for s in samples if s.model != held], specs)
    for s in samples:
        if s.model == held:
            rows.append((s, m.predict(s.features, specs[s.device]) / s.seconds - 1))


def kind(f):
    if f.scores:
        return "attn-fused"
    return f"{f.kernel_class.name[:5].lower()}{'-tc' if f.tensor_core else ''}"


def grid(s):
    sms = specs[s.device].sm_count
    b = s.features.blocks
    return "b<sm" if b < sms else ("b<4sm" if b < 4 * sms else ("b<32sm" if b < 32 * sms else "b>=32sm"))


def size(s):
    mb = s.features.nbytes / 1e6
    return "<1MB" if mb < 1 else ("<16MB" if mb < 16 else ("<128MB" if mb < 128 else ">=128MB"))


for name, key in (("kind", lambda s: kind(s.features)), ("grid", grid), ("bytes", size),
                  ("model", lambda s: s.model), ("model x kind", lambda s: f"{s.model[:5]} {kind(s.features)}")):
    print(f"\n== by {name}: median signed / median |err| (n), whole GPU | partitions")
    g = defaultdict(lambda: ([], []))
    for s, e in rows:
        g[key(s)]["@" in s.device].append(e)
    for k in sorted(g):
        w, p = (np.array(x) for x in g[k])
        cell = lambda a: f"{np.median(a)*100:+6.1f} {np.median(np.abs(a))*100:5.1f} ({len(a):3d})" if len(a) else " " * 19
        print(f"  {k:12} {cell(w)} | {cell(p)}")
if verbose:
    for s, e in sorted(rows, key=lambda r: (r[0].model, kind(r[0].features), r[0].features.label, r[0].features.flops, r[0].device)):
        f = s.features
        print(f"{s.model[:5]:5} {s.device[8:] or 'all':6} {f.label[:36]:36} {kind(f):10} b{f.blocks:7d} "
              f"t{f.threads_per_block:4d} GF{f.flops/1e9:8.3f} MB{f.nbytes/1e6:8.2f} pMB{f.param_bytes/1e6:7.1f} "
              f"t {s.seconds*1e6:8.1f} err {e*100:+6.0f}%")
if "-g" in sys.argv:  # grids smaller than the SM count, by kind
    print("\n== grids below the SM count, by kind (whole | partitions)")
    g = defaultdict(lambda: ([], []))
    for s, e in rows:
        if s.features.blocks < specs[s.device].sm_count:
            g[kind(s.features)]["@" in s.device].append(e)
    for k in sorted(g):
        w, p = (np.array(x) for x in g[k])
        cell = lambda a: f"{np.median(a)*100:+6.1f} {np.median(np.abs(a))*100:5.1f} ({len(a):3d})" if len(a) else " " * 19
        print(f"  {k:12} {cell(w)} | {cell(p)}")
