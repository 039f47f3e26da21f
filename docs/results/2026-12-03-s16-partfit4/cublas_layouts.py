"""cuBLAS GEMMs of the held-out models' exact shapes and weight layout on the H200's green-context partitions.

Analysis for issue 21 (the kernel model's library GEMMs, target/library_grid.py), not a tool. The session-16 table
(docs/results/2026-12-03-s16/cublas_partitions.txt) timed ``torch.mm(a, b)`` with a row-major ``b`` (K x N). The
models' linear layers reach cuBLAS as ``mm(x, w.t())`` / ``addmm(bias, x, w.t())``, the weight ``w`` (N x K)
row-major, so ``b`` is column-major; their launch times disagree with the table where M is 1 (the MMDiT's 12-tile
GEMVs: 24.8 us of kernel on 16 SMs measured in the program, 7.9 us in the table) and M = 333 (the MMDiT's 36-tile
addmm at K = 4,096: 73.5 against 56.1 us). This times every shape below in both layouts (``nn``: b row-major, as the
table; ``tn``: b = w.t(), as the models) on the whole GPU and on 72-, 24- and 16-SM partitions: median seconds of 50
launches back to back (events around them; host-bound for small GEMMs), the same 50 launches replayed as one CUDA
graph (the launch-time runs' setting), and every kernel's name, grid and duration from ``torch.profiler``. The
384-row shape beside the 333-row ones separates the row count from the layout.

Usage, from the repository root on a GPU machine with cuda-python or a torch with ``torch.cuda.GreenContext`` (184
cases, each well under a second: about 1-3 minutes on one H200; works on torch 2.11 + triton 3.6 and later):

    python docs/results/2026-12-03-s16-partfit4/cublas_layouts.py --out "$OUT"

Writes ``cublas_layouts.json`` and ``cublas_layouts.txt`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

#: (M, K, N, bias): the library GEMMs of at most 132 output tiles of the held-out models (MMDiT, Llama, Mamba, MoE;
#: docs/results/2026-12-03-s16-partfit4/NOTES.md lists them with their measured launch times).
SHAPES = [(1, 256, 1536, True), (1, 1536, 1536, True), (1, 2048, 1536, True), (1, 1536, 3072, True),
          (1, 1536, 9216, True), (1, 1536, 13824, True), (333, 1536, 1536, True), (333, 4096, 1536, True),
          (333, 6144, 1536, True), (384, 4096, 1536, True), (4096, 1536, 64, True), (64, 4096, 1024, False),
          (64, 4096, 4096, False), (64, 14336, 4096, False), (64, 4096, 14336, False), (1024, 4096, 1024, False),
          (64, 5120, 192, False), (32, 5120, 192, False), (64, 5120, 2560, False), (64, 2560, 10240, False),
          (64, 160, 5120, False), (64, 4096, 8, False), (1024, 4096, 8, False)]
LAYOUTS = ("nn", "tn")
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


def time_graph(a, b, bias, stream: torch.cuda.Stream, reps: int = 50) -> float | None:
    """Median seconds per launch of ``reps`` launches captured in one CUDA graph and replayed on ``stream`` (the
    launch-time runs' setting: no host launch cost between kernels); ``None`` when the capture fails."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            _launch(a, b, bias)
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(reps):
                    _launch(a, b, bias)
            graph.replay()
            stream.synchronize()
            runs = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                graph.replay()
                end.record(stream)
                end.synchronize()
                runs.append(start.elapsed_time(end) * 1e-3 / reps)
        return statistics.median(runs)
    except RuntimeError as e:  # a capture refused on this stream: the eager timing and the profiler still stand
        print(f"graph capture failed ({str(e).splitlines()[0][:120]}); graph us left empty", flush=True)
        torch.cuda.synchronize()
        return None


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
    parser.add_argument("--out", required=True, help="directory for cublas_layouts.json and .txt")
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
             f"{'M':>5} {'K':>6} {'N':>5} bias lay {'tiles':>5} {'SMs':>4} {'us':>8} {'graph us':>8} {'kern us':>8} "
             f"{'CTAs':>5} "
             f"{'waves':>5} {'us/wave':>8}  kernels"]
    for (m, k, n, has_bias), layout in [(s, lay) for s in SHAPES for lay in LAYOUTS]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = (torch.randn(k, n, device="cuda", dtype=torch.bfloat16) if layout == "nn"
             else torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t())
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None
        tiles = math.ceil(m / 128) * math.ceil(n / 128)
        for key in PARTITIONS:
            stream, sms = streams[key]
            seconds = time_launches(a, b, bias, stream)
            graph_s = time_graph(a, b, bias, stream)
            ks = kernels(a, b, bias, stream, out)
            main_k = ks[0] if ks else {"grid": None, "us": 0.0, "name": ""}
            ctas = math.prod(main_k["grid"]) if main_k.get("grid") else 0
            waves = math.ceil(ctas / sms) if ctas else 0
            kern_us = sum(x["us"] or 0.0 for x in ks)
            rows.append({"M": m, "K": k, "N": n, "bias": has_bias, "layout": layout, "tiles": tiles, "sms": sms,
                         "seconds": seconds, "graph_seconds": graph_s,
                         "kernels": ks, "ctas": ctas, "waves": waves})
            lines.append(f"{m:5d} {k:6d} {n:5d} {'yes' if has_bias else 'no':>4} {layout:>3} {tiles:5d} {sms:4d} "
                         f"{seconds * 1e6:8.1f} {graph_s * 1e6 if graph_s else math.nan:8.1f} {kern_us:8.1f} "
                         f"{ctas:5d} {waves:5d} "
                         f"{(main_k['us'] or 0.0) / max(waves, 1):8.2f}  "
                         + "; ".join(f"{x['name'][:48]}: {x['grid']}" for x in ks))
            print(lines[-1], flush=True)
    (out / "cublas_layouts.json").write_text(json.dumps({"sms": total, "torch": torch.__version__, "rows": rows},
                                                        indent=1))
    (out / "cublas_layouts.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
