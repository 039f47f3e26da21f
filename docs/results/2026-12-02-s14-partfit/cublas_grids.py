"""Which bf16 GEMMs cuBLAS splits along K on this GPU: the grid of every kernel a ``torch.mm`` launches, and its time.

Analysis for issue 21 (the kernel model's ``SPLIT_K_SHARE``), not a tool. For every shape ``(M, K, N)`` of a sweep over
the output's 128 x 128 tiles (8-192) and the reduction length K (256-14,336), it times ``torch.mm`` back to back with
CUDA events (median of 50) and reads each kernel's name and grid from ``torch.profiler`` (Kineto's ``grid`` and
``block`` arguments). A launch whose CTAs outnumber its output tiles, or a second (reduction) kernel, is a split.

Usage, from the repository root on a GPU machine (about 1 minute on one H200):

    python docs/results/2026-12-02-s14-partfit/cublas_grids.py --out "$OUT"

Writes ``cublas_grids.json`` (one record per shape) and ``cublas_grids.txt`` (the table) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

#: (M, N) pairs giving 1-96 output tiles of 128 x 128, for small-M (decode-like) and large-M shapes.
MN = [(1, 1536), (1, 4096), (64, 1024), (64, 2048), (64, 4096), (64, 8192), (256, 1024), (256, 1280), (256, 1536),
      (256, 1792), (384, 1024), (256, 2048), (384, 1536),
      (512, 1024), (768, 768), (512, 2048), (1024, 1024), (768, 1536), (1024, 1536), (1024, 2048), (1536, 1536),
      (1024, 3072)]
KS = [256, 1536, 4096, 6144, 14336]


def time_mm(a: torch.Tensor, b: torch.Tensor, reps: int = 50) -> float:
    """Median seconds of ``a @ b`` over ``reps`` launches, each between two CUDA events."""
    for _ in range(5):
        torch.mm(a, b)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def kernels_with_grids(a: torch.Tensor, b: torch.Tensor, tmp: Path) -> list[dict]:
    """Name, grid, block and duration (us) of every GPU kernel one ``a @ b`` launches, from the profiler's Chrome
    trace (written to ``tmp/trace.json``)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.mm(a, b)
        torch.cuda.synchronize()
    path = tmp / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text()).get("traceEvents", [])
    out = []
    for e in events:
        if e.get("cat") == "kernel":
            args = e.get("args", {})
            out.append({"name": e.get("name", ""), "grid": args.get("grid"), "block": args.get("block"),
                        "us": e.get("dur")})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for cublas_grids.json and cublas_grids.txt")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: run it on the GPU machine (see the module docstring)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, lines = [], [f"{torch.cuda.get_device_name(0)}, {sms} SMs, torch {torch.__version__}",
                       f"{'M':>5} {'K':>6} {'N':>5} {'tiles':>5} {'us':>8} {'CTAs':>6}  kernels (name: grid)"]
    for m, n in MN:
        for k in KS:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            tiles = math.ceil(m / 128) * math.ceil(n / 128)
            seconds = time_mm(a, b)
            kernels = kernels_with_grids(a, b, out)
            ctas = sum(math.prod(x["grid"]) for x in kernels if x.get("grid"))
            rows.append({"M": m, "K": k, "N": n, "tiles": tiles, "seconds": seconds, "kernels": kernels, "ctas": ctas})
            lines.append(f"{m:5d} {k:6d} {n:5d} {tiles:5d} {seconds * 1e6:8.1f} {ctas:6d}  "
                         + "; ".join(f"{x['name'][:60]}: {x.get('grid')}" for x in kernels))
    (out / "trace.json").unlink(missing_ok=True)
    (out / "cublas_grids.json").write_text(json.dumps({"sms": sms, "rows": rows}, indent=1))
    (out / "cublas_grids.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
