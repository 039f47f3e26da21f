"""Session 18 (analysis, not a tool): the kernel cost model's predictions for bench/gpu_convolution.py's measured
convolutions (shapes of none of the registry models, never fitted on), per kind and device.

    python docs/results/2026-12-03-s18/conv_check.py docs/results/2026-12-03-s18/call2/conv/convolution.json
"""
import json, math, statistics, sys
import torch
from torch_tessera.lowering.program import ExternLaunch, TensorArg
from torch_tessera.target.costmodel import launch_features
from torch_tessera.target.devices import parse_device
from torch_tessera.target.kernelmodel import CALIBRATED


def view(name, size):
    stride = tuple(math.prod(size[i + 1:]) for i in range(len(size)))
    return TensorArg(name, 0, tuple(size), stride, torch.bfloat16)


data = json.load(open(sys.argv[1]))
errs = {}
for r in data["rows"]:
    args = (view("x", r["input"]), view("w", r["weight"]), view("b", (r["weight"][0],)), r["stride"], r["padding"],
            [1] * len(r["stride"]), False, [0] * len(r["stride"]), r["groups"])
    f = launch_features(ExternLaunch(0, "aten::convolution.default", args, {}, (), (view("out", r["output"]),)))
    dev = "sim:h200" if r["sms"] == 132 else f"sim:h200@{r['sms']}sm"
    p = CALIBRATED.predict(f, parse_device(dev))
    e = p / r["seconds"] - 1
    errs.setdefault((r["kind"], "whole" if r["sms"] == 132 else "partitions"), []).append(abs(e))
    print(f"{r['kind']:9} {str(r['input']):20} {dev:14} measured {r['seconds'] * 1e6:8.1f} us  predicted {p * 1e6:8.1f} us"
          f"  {e:+.2f}")
for (kind, where), v in sorted(errs.items()):
    print(f"{kind:9} {where:10} n {len(v):2d}  median |err| {statistics.median(v) * 100:5.1f} %")
