"""Session 18 probe (analysis, not a tool): the kernels cuDNN runs for the registry's own convolutions (the MMDiT's
patchify, Mamba's depthwise conv1d in prefill and decode), and cuDNN's unmasked attention at sequence lengths that are
and are not multiples of 128 (the MMDiT's 4,096 and 4,429), on the whole GPU and a 16-SM partition.

    python3 docs/results/2026-12-03-s18/probe.py --out OUT
"""
import argparse, json, statistics, sys
import torch
sys.path.insert(0, "bench")
from gpu_convolution import _kernels, _time

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
from torch_tessera.target.green import create_partition
part, _ = create_partition(0, 16)
devices = [("cuda:0", torch.cuda.current_stream()), (f"cuda:0@{part.granted_sms}sm", part.stream)]
res = {"conv": [], "attention": []}
conv = [((1, 16, 128, 128), (1536, 16, 2, 2), [2, 2], [0, 0], 1),
        ((1, 5120, 32), (5120, 1, 4), [1], [3], 5120),
        ((64, 5120, 5), (5120, 1, 4), [1], [0], 5120)]
for xs, ws, st, pad, groups in conv:
    x = torch.randn(xs, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(ws, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(ws[0], device="cuda", dtype=torch.bfloat16)
    call = lambda: torch.ops.aten.convolution(x, w, b, st, pad, [1] * len(st), False, [0] * len(st), groups)
    ks = _kernels(call)
    times = {n: _time(call, s, 21, True) for n, s in devices}
    res["conv"].append({"input": xs, "weight": ws, "kernels": ks, "seconds": times})
    print(xs, ws, {k: f"{v*1e6:.1f}us" for k, v in times.items()})
    for k in ks:
        print("   ", k)
for h, L, layout in ((24, 4096, "blhd"), (24, 4429, "bhld"), (24, 4429, "blhd"), (24, 4096, "bhld"), (24, 4224, "bhld"),
                     (24, 4160, "bhld"), (24, 4352, "bhld"), (24, 4480, "bhld"), (24, 4608, "bhld")):
    def mk():
        if layout == "blhd":
            return torch.randn(1, L, h, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        return torch.randn(1, h, L, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = mk(), mk(), mk()
    call = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)
    times = {n: _time(call, s, 15, True) for n, s in devices}
    ks = _kernels(call)
    res["attention"].append({"heads": h, "length": L, "layout": layout, "seconds": times, "kernels": ks})
    print("attn", h, L, layout, {k: f"{v*1e6:.1f}us" for k, v in times.items()}, [(k["name"][:50], k["grid"]) for k in ks])
json.dump(res, open(f"{args.out}/probe.json", "w"), indent=1)
