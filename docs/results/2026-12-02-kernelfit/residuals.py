"""Per-launch residuals of the kernel model on the back-to-back H200 launch times (analysis, not a tool).

    PYTHONPATH=$PWD python docs/results/2026-12-02-kernelfit/residuals.py /tmp/kernelfit_kt [fit|calibrated]
"""
import sys
from collections import defaultdict

import numpy as np

from torch_tessera.commands.calibrate import fit, load_launch_time_samples
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import CALIBRATED

samples, _ = load_launch_time_samples(sys.argv[1], 5e-6)
specs = {d: parse_device(d) for d in {s.device for s in samples}}
mode = sys.argv[2] if len(sys.argv) > 2 else "fit"
m = fit(samples, specs) if mode == "fit" else CALIBRATED
print(m)
rows = defaultdict(dict)
for s in samples:
    p = m.predict(s.features, specs[s.device])
    rows[(s.model, s.program, s.features.label, s.features.flops, s.features.nbytes, s.features.blocks, s.features.param_bytes)][s.device.replace("sim:h200", "") or "@132"] = (s.seconds, p)
    rows[(s.model, s.program, s.features.label, s.features.flops, s.features.nbytes, s.features.blocks, s.features.param_bytes)]["f"] = s.features
devs = ["@132", "@72sm", "@24sm", "@16sm"]
for key, r in rows.items():
    f = r["f"]
    cells = " ".join(f"{r[d][0]*1e6:8.1f}/{(r[d][1]/r[d][0]-1)*100:+5.0f}%" if d in r else " " * 15 for d in devs)
    print(f"{key[0][:3]} {key[1][:3]} {f.label[:34]:34} {f.kernel_class.name[:5]:5} tc{int(f.tensor_core)} {f.dtype:4} "
          f"GF{f.flops/1e9:8.2f} MB{f.nbytes/1e6:8.2f} pMB{f.param_bytes/1e6:7.1f} b{f.blocks:6d} t{f.threads_per_block:4d} | {cells}")
