"""How small cuBLAS GEMMs slow down on green-context partitions: each shape's kernels, grids and times on the whole
GPU and on partitions of 16, 24 and 72 SMs.

Analysis for issue 21 (the kernel model's library GEMMs on partitions), not a tool. For each bf16 ``torch.mm`` shape
below (the unsplit and split shapes of cublas_grids.json that the held-out models use, 8-64 output tiles of 128 x 128,
plus two M = 1 GEMVs and an ``addmm`` with a bias, as the MMDiT launches) it times 50 launches back to back between
two CUDA events on the partition's stream (median per launch) and reads every kernel's name, grid and duration from
``torch.profiler`` (Kineto's ``grid`` argument), on the whole GPU and on each partition. cuBLAS sizes its grid for the
SMs the device reports, so a grid of ``P`` CTAs on ``S`` SMs runs in ``ceil(P / S)`` waves: the table's
``us / wave`` is the kernel time over those waves.

Usage, from the repository root on a GPU machine with cuda-python or a torch with ``torch.cuda.GreenContext`` (about
1-2 minutes on one H200):

    python docs/results/2026-12-02-s15-partfit3/cublas_partitions.py --out "$OUT"

Writes ``cublas_partitions.json`` and ``cublas_partitions.txt`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

#: (M, K, N, bias): GEMMs of the held-out models' sizes (decode M = 64, the MMDiT's M = 1 and 36-tile addmm).
SHAPES = [(64, 4096, 1024, False), (64, 4096, 4096, False), (64, 14336, 4096, False), (64, 1536, 4096, False),
          (256, 4096, 1280, False), (256, 6144, 1280, False), (384, 1536, 1536, False), (384, 4096, 1536, False),
          (384, 4096, 1536, True), (768, 6144, 768, True), (1024, 4096, 1024, False), (1, 1536, 1536, False),
          (1, 1536, 1536, True), (1, 4096, 4096, False)]
PARTITIONS = (0, 72, 24, 16)  # 0: the whole GPU


def _launch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)


def time_launches(a, b, bias, stream: torch.cuda.Stream, reps: int = 50) -> float:
    """Median seconds per launch of ``reps`` launches back to back on ``stream`` (events around the whole run)."""
    with torch.cuda.stream(stream):
        for _ in range(5):
            _launch(a, b, bias)
        runs = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(reps):
                _launch(a, b, bias)
            end.record(stream)
            end.synchronize()
            runs.append(start.elapsed_time(end) * 1e-3 / reps)
    return statistics.median(runs)


def kernels(a, b, bias, stream: torch.cuda.Stream, tmp: Path) -> list[dict]:
    """Name, grid and duration (us) of every kernel one launch runs on ``stream``, from the profiler's trace."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(stream):
            _launch(a, b, bias)
        torch.cuda.synchronize()
    path = tmp / "trace.json"
    prof.export_chrome_trace(str(path))
    out = []
    for e in json.loads(path.read_text()).get("traceEvents", []):
        if e.get("cat") == "kernel":
            out.append({"name": e.get("name", ""), "grid": e.get("args", {}).get("grid"), "us": e.get("dur")})
    path.unlink(missing_ok=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for cublas_partitions.json and .txt")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: run it on the GPU machine (see the module docstring)")
    from torch_tessera.target.green import create_partition

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = torch.cuda.get_device_properties(0).multi_processor_count
    streams = {0: (torch.cuda.Stream(), total)}
    for sms in PARTITIONS[1:]:
        part, _ = create_partition(0, sms)
        streams[sms] = (part.stream, part.granted_sms)
    rows = []
    lines = [f"{torch.cuda.get_device_name(0)}, {total} SMs, torch {torch.__version__}",
             f"{'M':>5} {'K':>6} {'N':>5} bias {'tiles':>5} {'SMs':>4} {'us':>8} {'kern us':>8} {'CTAs':>5} "
             f"{'waves':>5} {'us/wave':>8}  kernels"]
    for m, k, n, has_bias in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None
        tiles = math.ceil(m / 128) * math.ceil(n / 128)
        for key in PARTITIONS:
            stream, sms = streams[key]
            seconds = time_launches(a, b, bias, stream)
            ks = kernels(a, b, bias, stream, out)
            main_k = ks[0] if ks else {"grid": None, "us": 0.0, "name": ""}
            ctas = math.prod(main_k["grid"]) if main_k.get("grid") else 0
            waves = math.ceil(ctas / sms) if ctas else 0
            kern_us = sum(x["us"] or 0.0 for x in ks)
            rows.append({"M": m, "K": k, "N": n, "bias": has_bias, "tiles": tiles, "sms": sms, "seconds": seconds,
                         "kernels": ks, "ctas": ctas, "waves": waves})
            lines.append(f"{m:5d} {k:6d} {n:5d} {'yes' if has_bias else 'no':>4} {tiles:5d} {sms:4d} "
                         f"{seconds * 1e6:8.1f} {kern_us:8.1f} {ctas:5d} {waves:5d} "
                         f"{(main_k['us'] or 0.0) / max(waves, 1):8.2f}  "
                         + "; ".join(f"{x['name'][:48]}: {x['grid']}" for x in ks))
            print(lines[-1], flush=True)
    (out / "cublas_partitions.json").write_text(json.dumps({"sms": total, "rows": rows}, indent=1))
    (out / "cublas_partitions.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
