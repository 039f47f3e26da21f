"""Session 18 probe 2 (analysis, not a tool): the kernels of the registry's own convolutions (the MMDiT's patchify,
Mamba's depthwise conv1d in prefill and decode) on the whole GPU and 16/24/72-SM partitions, with their GPU-only time
(events behind a spin, as bench/gpu_convolution.py).

    python3 docs/results/2026-12-03-s18/probe2.py --out OUT
"""
import argparse, json, sys
import torch
sys.path.insert(0, "bench")
from gpu_convolution import _kernels, _time
from torch_tessera.target.green import create_partition

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
devices = [("cuda:0", torch.cuda.current_stream())]
for n in (16, 24, 72):
    part, _ = create_partition(0, n)
    devices.append((f"cuda:0@{part.granted_sms}sm", part.stream))
res = []
conv = [((1, 16, 128, 128), (1536, 16, 2, 2), [2, 2], [0, 0], 1),
        ((1, 5120, 32), (5120, 1, 4), [1], [3], 5120),
        ((64, 5120, 5), (5120, 1, 4), [1], [0], 5120)]
for xs, ws, st, pad, groups in conv:
    x = torch.randn(xs, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(ws, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(ws[0], device="cuda", dtype=torch.bfloat16)
    call = lambda: torch.ops.aten.convolution(x, w, b, st, pad, [1] * len(st), False, [0] * len(st), groups)
    for name, stream in devices:
        ks = _kernels(call, stream)
        t = _time(call, stream, 21, True)
        res.append({"input": xs, "weight": ws, "device": name, "seconds": t, "kernels": ks})
        print(xs, name, f"{t*1e6:.1f}us", [(k["name"][:30], round(k["us"], 1), k["grid"]) for k in ks], flush=True)
json.dump(res, open(f"{args.out}/probe2.json", "w"), indent=1)
