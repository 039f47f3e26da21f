"""What a library convolution launches and how long it takes: cuDNN's convolutions timed on the whole GPU and on
green-context partitions, and the kernels each one runs (issue 21, the kernel cost model's convolutions).

The registry's MMDiT embeds its latent with a strided ("patchify") 2-D convolution and Mamba mixes each channel with
a depthwise causal 1-D convolution; both are ``aten::convolution`` on NCHW (channels-first) bf16 tensors. This script
measures convolutions of the same two kinds on shapes that are none of the registry models' own (so held-out figures
stay held out): for each shape and device, the median of ``--repeats`` launches timed with CUDA events behind a spin
(GPU time only: cuDNN's host dispatch outlasts the small kernels); and, on each device, the CUDA kernels one call runs (names, grids, blocks, microseconds) from the PyTorch profiler. One JSON
file, ``convolution.json``: per row the kind (``patchify`` or ``depthwise``), the input, weight and output sizes, the
stride, padding and groups, the device (``cuda:0`` or ``cuda:0@Nsm``), the granted SMs and the seconds; per shape the
kernels.

    python3 bench/gpu_convolution.py --out $OUT/conv

Dry run without a GPU (CPU, host clock, no profile; the numbers mean nothing):

    python bench/gpu_convolution.py --out /tmp/conv --dry-run
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_attention_mask import _time, sweep_setup  # noqa: E402  (the same command line and GPU-only timing)

#: ``(kind, input size, C_out, kernel, stride, padding, groups)``: 2-D patchify convolutions (kernel = stride) and
#: depthwise 1-D convolutions (groups = channels, Mamba's kernel of 4), none a registry model's shape.
SHAPES = (
    ("patchify", (1, 4, 96, 96), 1152, (2, 2), (2, 2), (0, 0), 1),
    ("patchify", (2, 8, 64, 64), 768, (2, 2), (2, 2), (0, 0), 1),
    ("patchify", (1, 32, 64, 64), 2048, (2, 2), (2, 2), (0, 0), 1),
    ("patchify", (1, 16, 96, 96), 1024, (2, 2), (2, 2), (0, 0), 1),
    ("patchify", (1, 3, 224, 224), 768, (16, 16), (16, 16), (0, 0), 1),
    ("patchify", (4, 16, 64, 64), 1536, (2, 2), (2, 2), (0, 0), 1),
    ("depthwise", (1, 4096, 64), 4096, (4,), (1,), (3,), 4096),
    ("depthwise", (1, 2048, 512), 2048, (4,), (1,), (3,), 2048),
    ("depthwise", (32, 4096, 4), 4096, (4,), (1,), (0,), 4096),
    ("depthwise", (16, 2560, 4), 2560, (4,), (1,), (0,), 2560),
    ("depthwise", (128, 3072, 4), 3072, (4,), (1,), (0,), 3072),
    ("depthwise", (4, 8192, 128), 8192, (4,), (1,), (3,), 8192),
)
DRY = (("patchify", (1, 2, 8, 8), 16, (2, 2), (2, 2), (0, 0), 1),
       ("depthwise", (1, 8, 16), 8, (4,), (1,), (3,), 8))


def _kernels(fn, stream=None) -> list[dict]:
    """The CUDA kernels one call of ``fn`` on ``stream`` runs, from the PyTorch profiler (after two warm-up calls)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        fn()
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    out = []
    for ev in prof.events():
        if getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
            out.append({"name": ev.name, "us": float(getattr(ev, "device_time", 0.0) or ev.cuda_time),
                        "grid": list(getattr(ev, "grid", []) or []) if hasattr(ev, "grid") else None})
    try:  # grids and blocks from the trace, where this torch exposes them
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.load(open(f.name))
        kern = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
        out = [{"name": e["name"], "us": float(e.get("dur", 0.0)), "grid": e.get("args", {}).get("grid"),
                "block": e.get("args", {}).get("block"),
                "registers": e.get("args", {}).get("registers per thread"),
                "shared_bytes": e.get("args", {}).get("shared memory")} for e in kern] or out
    except (OSError, ValueError, KeyError):
        pass
    return out


def main() -> int:
    setup = sweep_setup(__doc__.split("\n\n")[0], "convolution.json", 21)
    if setup == 2:
        return 2
    args, out, devices = setup
    cuda = not args.dry_run
    rows, kernels = [], []
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    for kind, size, c_out, kernel, stride, padding, groups in (SHAPES if cuda else DRY):
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(size, device=dev, dtype=dtype, generator=g)
        w = torch.randn((c_out, size[1] // groups, *kernel), device=dev, dtype=dtype, generator=g)
        b = torch.randn(c_out, device=dev, dtype=dtype, generator=g)

        def call():
            return torch.ops.aten.convolution(x, w, b, list(stride), list(padding), [1] * len(kernel), False,
                                              [0] * len(kernel), groups)

        y = call()
        shape = {"kind": kind, "input": list(size), "weight": list(w.shape), "output": list(y.shape),
                 "stride": list(stride), "padding": list(padding), "groups": groups}
        for name, part in devices:
            stream = part.stream if part is not None else (torch.cuda.current_stream() if cuda else None)
            if cuda:
                kernels.append({**shape, "device": name, "kernels": _kernels(call, stream)})
                names = ", ".join(f"{k['name'][:40]} {k['us']:.1f}us grid {k.get('grid')}"
                                  for k in kernels[-1]["kernels"])
                print(f"{kind:9} {str(tuple(size)):22} -> {str(tuple(y.shape)):24} {name:12} kernels: {names}",
                      flush=True)
            seconds = _time(call, stream, args.repeats, cuda)
            sms = part.granted_sms if part is not None else (
                torch.cuda.get_device_properties(0).multi_processor_count if cuda else 0)
            rows.append({**shape, "device": name, "sms": sms, "seconds": seconds})
            print(f"{kind:9} {str(tuple(size)):22} {name:14} {seconds * 1e6:9.1f} us", flush=True)
    meta = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)",
            "cudnn": torch.backends.cudnn.version() if cuda else None, "repeats": args.repeats}
    (out / "convolution.json").write_text(json.dumps({"meta": meta, "rows": rows, "kernels": kernels}, indent=1))
    print(f"wrote {out / 'convolution.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
