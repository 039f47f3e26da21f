"""Session 18 (analysis, not a tool): the registry's convolution launches (and launches whose label has "conv")
measured back to back in session 11 (DIR = /tmp/cal18, as heldout.py) against CALIBRATED's prediction.

    python registry_convs.py
"""
import sys, dataclasses, ast
from torch_tessera.commands import calibrate as cal
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import KernelModel, CALIBRATED
samples, _ = cal.load_launch_time_samples('/tmp/cal18', 5e-6)
specs = {d: parse_device(d) for d in {s.device for s in samples}}
m = CALIBRATED
for s in samples:
    if 'conv' in s.features.label:
        f=s.features
        print(f"{s.model:6s} {s.program:8s} {s.device:16s} tc{int(f.tensor_core)} blk {f.blocks} M{f.rows} N{f.cols} K{f.depth} passes {[round(p/1e6,2) for p in f.passes]} {s.seconds*1e6:8.1f}us pred {m.predict(f, specs[s.device])*1e6:8.1f} {m.predict(f, specs[s.device])/s.seconds-1:+.3f}")
