"""Held-out residuals by kernel class and device (analysis, not a tool).

    PYTHONPATH=$PWD python docs/results/2026-12-02-kernelfit/heldout.py /tmp/kernelfit_kt [-v]
"""
import sys
from collections import defaultdict

import numpy as np

from torch_tessera.commands.calibrate import fit, load_launch_time_samples
from torch_tessera.target.devices import parse_device

samples, _ = load_launch_time_samples(sys.argv[1], 5e-6)
specs = {d: parse_device(d) for d in {s.device for s in samples}}
verbose = "-v" in sys.argv
for held in ("dit", "llama"):
    m = fit([s for s in samples if s.model != held], specs)
    print(f"held out {held}: {m}")
    groups = defaultdict(list)
    for s in samples:
        if s.model != held:
            continue
        e = m.predict(s.features, specs[s.device]) / s.seconds - 1
        f = s.features
        kind = f"{f.kernel_class.name[:5]}{'-tc' if f.tensor_core else ''}"
        groups[(kind, s.device.replace('sim:h200', '') or '@all')].append(e)
        if verbose:
            import dataclasses
            nocomp = m.predict(dataclasses.replace(f, flops=0.0), specs[s.device]) / s.seconds - 1
            print(f"  nocomp {nocomp*100:+5.0f}%", end="")
            print(f"  {s.device[8:] or 'all':6} {f.label[:40]:40} {kind:8} b{f.blocks:6d} GF{f.flops/1e9:8.3f} MB{f.nbytes/1e6:8.2f} "
                  f"t {s.seconds*1e6:8.1f} err {e*100:+6.0f}%")
    for (kind, dev), es in sorted(groups.items()):
        es = np.array(es)
        print(f"  {kind:8} {dev:6} n{len(es):3d} median {np.median(es)*100:+6.0f}%  |err| median {np.median(np.abs(es))*100:5.0f}%")
