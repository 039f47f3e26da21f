#!/usr/bin/env python
"""Per-kernel-class times of a Llama-3.1-8B decoder layer on a whole H200, on green-context partitions, and with the
bandwidth-throttling streamer; the GPU0 <-> GPU1 link table; and the roofline cost model's error on the partitions
after calibrating it on the whole GPU.

Run on the 2x H200 machine (torch 2.11, triton 3.6, cuda-python) from the repository root::

    python bench/gpu_layer_profile.py --out results/gpu_layer_profile

It writes ``results.json`` and ``results.md`` under ``--out`` and prints the markdown. It finishes in under five
minutes (``--budget-s``, default 270 s: configurations left when the budget runs out are skipped and reported), every
part catches and reports its own failure, and nothing changes the cards' settings (green contexts and the streamer
are process-level objects).

Method. Random bf16 weights of one layer (hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, vocab 128256 for the
per-step reductions). Shapes: decode, batch 64 against a 1024-token KV cache; prefill, 4 x 1024 tokens. Every op is
one eager PyTorch call (mostly one kernel). Each op is timed with CUDA events on the device's stream around ``inner``
back-to-back calls, after a ``torch.cuda._sleep`` spin that lets the CPU queue them all first (so Python dispatch is
not measured); the median of ``repeats`` such batches is kept. Activations rotate among three copies; weights and the
KV cache exceed the 50 MB L2 anyway. The whole GPU is GPU 0; partitions and profiles are made on GPU 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from torch_tessera.measure.layer_profile import BF16, SHAPES, build_ops, model_error, markdown

CONFIGS = [
    ("whole", "cuda:0"),
    ("24sm", "cuda:1@24sm"),
    ("72sm", "cuda:1@72sm"),
    ("96sm+throttle36", "cuda:1@96sm+throttle36"),
    ("a100-like", "cuda:1@a100-like"),
    ("l40s-like", "cuda:1@l40s-like"),
    ("rtxpro-like", "cuda:1@rtxpro-like"),
]
def gpu_seconds(fn: Callable[[int], object], stream, inner: int = 8, repeats: int = 9, warmup: int = 3) -> float:
    """Median GPU seconds of one ``fn(i)`` call on ``stream`` (see the module docstring for the method)."""
    with torch.cuda.stream(stream):
        for i in range(warmup):
            fn(i)
        stream.synchronize()
        times = []
        for r in range(repeats):
            torch.cuda._sleep(3_000_000)  # ~1.5 ms at H200 clocks: the CPU queues the batch meanwhile
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for i in range(inner):
                fn(r * inner + i)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def measure_peaks(dev: torch.device, stream) -> dict:
    """bf16 GEMM 8192^3 (TFLOP/s) and a streaming elementwise copy of 512 MiB (GB/s read + written)."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    bmat = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    s = gpu_seconds(lambda i: a @ bmat, stream, inner=3, repeats=5, warmup=2)
    src = torch.empty(256 << 20, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    c = gpu_seconds(lambda i: torch.neg(src, out=dst), stream, inner=4, repeats=5, warmup=2)
    return {"gemm_tflops": 2 * 8192**3 / s / 1e12, "copy_gbps": 2 * src.numel() * BF16 / c / 1e9}


def run_config(label: str, device_str: str, repeats: int) -> dict:
    from torch_tessera.target.devices import open_device

    out: dict = {"device": device_str}
    with open_device(device_str) as device:
        spec = device.spec
        out["spec"] = {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(spec).items()}
        stream = device.default_stream if device.partition is not None else device.new_stream()
        if device.streamer is not None:
            time.sleep(0.2)  # let the streamer reach its steady state
        with device.guard():
            out["peaks"] = measure_peaks(device.torch_device, stream)
            out["shapes"] = {}
            for shape_name, shape in SHAPES.items():
                ops = build_ops(shape, device.torch_device)
                rows = []
                for op in ops:
                    sec = gpu_seconds(op.fn, stream, repeats=repeats)
                    rows.append({"op": op.name, "class": op.kclass, "count": op.count, "seconds": sec,
                                 "flops": op.flops, "bytes": op.nbytes, "tensor_core": op.tensor_core})
                out["shapes"][shape_name] = rows
                del ops
                torch.cuda.empty_cache()
        if device.streamer is not None:
            device.streamer.stop()
            out["streamer_gbps"] = device.streamer.achieved_bytes_per_s / 1e9
    return out


def measure_link_table() -> list[dict]:
    from torch_tessera.target.devices import open_device
    from torch_tessera.target.links import link_table_rows, measure_links

    with open_device("cuda:0") as d0, open_device("cuda:1") as d1:
        return link_table_rows(measure_links([d0, d1], repeats=8, progress=False))


def triton_on_green_context(gpu: int = 1) -> dict:
    """Can an (Inductor-style) Triton kernel launch on a green-context stream? The executor needs the answer."""
    import triton
    import triton.language as tl

    from torch_tessera.target.devices import open_device

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    out = {}
    for dev_str in (f"cuda:{gpu}", f"cuda:{gpu}@24sm"):
        try:
            with open_device(dev_str) as d, d.guard():
                x = torch.zeros(1 << 20, device=d.torch_device)
                stream = d.default_stream if d.partition is not None else d.new_stream()
                with torch.cuda.stream(stream):
                    add_one[(1 << 20) // 1024,](x, 1 << 20, BLOCK=1024)
                stream.synchronize()
                out[dev_str] = "ok" if bool((x == 1).all()) else "ran but wrong result"
        except Exception as exc:  # noqa: BLE001 - a probe: report any failure
            out[dev_str] = f"failed: {type(exc).__name__}: {exc}"
    return out


# --------------------------------------------------------------------------------------------------------- report

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for results.json and results.md")
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop starting new parts after this many seconds")
    ap.add_argument("--repeats", type=int, default=9, help="timed batches per op (median kept)")
    ap.add_argument("--configs", default=",".join(c for c, _ in CONFIGS), help="subset of configurations")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                              "python": platform.python_version()}, "configs": {}, "errors": {}}
    try:
        import triton
        results["meta"]["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version
        results["meta"]["cuda_python"] = version("cuda-python")
    except Exception:  # noqa: BLE001
        results["meta"]["cuda_python"] = "not installed"
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    part_gpu = 1 if n_gpus >= 2 else 0  # with one GPU, partitions are carved from GPU0 (measured one at a time)
    if n_gpus == 0:
        results["errors"]["setup"] = "needs a CUDA GPU"
    else:
        results["meta"]["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]

    def part(name: str, fn: Callable[[], object]) -> object:
        if time.monotonic() - t0 > args.budget_s:
            results["errors"][name] = f"skipped: the {args.budget_s:.0f} s budget was spent"
            return None
        print(f"[{time.monotonic() - t0:6.1f}s] {name}", flush=True)
        try:
            return fn()
        except Exception:  # noqa: BLE001 - each part reports its own failure and the rest go on
            results["errors"][name] = traceback.format_exc()
            print(results["errors"][name], file=sys.stderr)
            return None
        finally:
            torch.cuda.empty_cache()

    if "setup" not in results["errors"]:
        wanted = set(args.configs.split(","))
        for label, dev in CONFIGS:
            if label in wanted:
                dev = dev.replace("cuda:1", f"cuda:{part_gpu}")
                cfg = part(f"config {label}", lambda dev=dev, label=label: run_config(label, dev, args.repeats))
                if cfg is not None:
                    results["configs"][label] = cfg
        links = part("links", measure_link_table) if n_gpus >= 2 else None
        if links is not None:
            results["links"] = links
        probe = part("triton_on_green_context", lambda: triton_on_green_context(part_gpu))
        if probe is not None:
            results["triton_on_green_context"] = probe
        if "whole" in results["configs"]:
            model = part("model", lambda: model_error(results))
            if model is not None:
                results["model"] = model
    results["meta"]["wall_s"] = time.monotonic() - t0
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    md = markdown(results)
    (out_dir / "results.md").write_text(md)
    print(md)
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
