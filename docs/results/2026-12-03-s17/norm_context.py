"""Why six MMDiT layer norms with the same features time 1.8x apart (session 17, issue 21; analysis, not a tool).

Kernels _19/_21/_24/_25/_26 of session 11's dumped MMDiT program are compiled from their Inductor source with plain
Triton and launched alone on fresh random inputs (their first launch's shapes), on the whole GPU and a 16-SM green
partition, timed three ways: back to back (inputs warm in L2), after a 256 MB L2 flush (read), and after a 50 MB
write (dirty lines in L2 that the kernel's own traffic must write back, as after the GEMM before it in the program).

    python3 docs/results/2026-12-03-s17/norm_context.py --program DIR/dit_denoise.program.json --out OUT
"""
import argparse, json, math, statistics, sys, tempfile, importlib.util, os
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--program", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--repeats", type=int, default=21)
args = ap.parse_args()
prog = json.load(open(args.program))
kernels = {k["name"]: k for k in prog["kernels"]}
want = ("_19", "_21", "_24", "_25", "_26")
DT = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def compile_kernel(name):
    src = kernels[name]["source"]
    body = src[src.index("@triton.jit"):]
    head = ("import triton\nimport triton.language as tl\nfrom torch._inductor.runtime import triton_helpers\n"
            "from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math\n")
    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    f.write(head + body)
    f.close()
    spec = importlib.util.spec_from_file_location(os.path.basename(f.name)[:-3], f.name)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return getattr(m, name)


def make_args(launch):
    out = []
    for a in launch["args"]:
        if a.get("$") == "tensor":
            n = max(1, math.prod(a["size"]) if a["size"] else 1)
            span = a["offset"] + sum((s - 1) * st for s, st in zip(a["size"], a["stride"])) + 1
            base = torch.randn(max(n, span), device="cuda", dtype=DT[a["dtype"]])
            out.append(torch.as_strided(base, a["size"], a["stride"], a["offset"]))
        else:
            out.append(a["value"])
    return out


flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
dirty = torch.empty(50 << 20, dtype=torch.uint8, device="cuda")
devices = [("cuda:0", None)]
from torch_tessera.target.green import create_partition
part, _ = create_partition(0, 16)
devices.append((f"cuda:0@{part.granted_sms}sm", part))
rows = []
for name in sorted(kernels):
    if not name.endswith(want):
        continue
    launch = next(l for l in prog["launches"] if l.get("kernel") == name)
    fn = compile_kernel(name)
    cfg = {k: v for k, v in launch["config"]["items"]}
    meta = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
    grid = tuple(launch["grid"])
    a = make_args(launch)
    for dev, p in devices:
        stream = p.stream if p is not None else torch.cuda.current_stream()
        res = {}
        for mode in ("warm", "flushed", "after_dirty_write"):
            ts = []
            for i in range(args.repeats + 3):
                with torch.cuda.stream(stream):
                    if mode == "flushed":
                        flush.zero_()
                    elif mode == "after_dirty_write":
                        flush.zero_()
                        dirty.fill_(1)
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn[grid](*a, **meta, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 1))
                    e.record()
                e.synchronize()
                if i >= 3:
                    ts.append(s.elapsed_time(e) * 1e3)
            res[mode] = statistics.median(ts)
        rows.append({"kernel": name, "device": dev, **{k + "_us": v for k, v in res.items()}})
        print(f"{name[-3:]} {dev:14} " + "  ".join(f"{k} {v:8.2f} us" for k, v in res.items()), flush=True)
os.makedirs(args.out, exist_ok=True)
json.dump(rows, open(os.path.join(args.out, "norm_context.json"), "w"), indent=1)
