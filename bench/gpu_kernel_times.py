"""Every launch of the registry models' programs timed back to back on the whole GPU and on green-context partitions:
the data ``tessera calibrate`` fits the kernel cost model to (issue 21).

For each model (the measured bench's programs: ``measure/programs.py``, 8 layers at full size, random bf16 weights)
the programs are lowered on the GPU by the tessera backend (home placement over ``--devices``), each saved with
``lowering/serialize.py``'s ``dump_program`` as ``<model>_<program>.program.json`` (the features come from the
program the GPU ran, no name matching), and every launch is timed back to back in program order on every device
(``torch_tessera.measure.kernel_times``: CUDA events between launches issued behind a GEMM backlog, so the GPU never
waits for the host; the median of ``--repeats`` runs). One file per (model, device):
``<model>_<device>.launch_times.json`` (format in ``measure/kernel_times.py``); ``summary.json`` has, per file, the
sum over launches against the program replayed as one CUDA graph, the starved chunks, and the seconds each step took.
By default (``--pack``) the files are written to a scratch folder and packed, after every model, into
``--out/kernel_times.tar.gz`` (the device tool returns at most 8 files from ``$OUT``); ``summary.json`` stays beside
it. ``tar xzf kernel_times.tar.gz -C DIR`` gives the files back, for ``tessera calibrate --results DIR``.

    python3 bench/gpu_kernel_times.py --out $OUT

Models run in ``--models`` order until ``--budget-s`` is spent (a model not started is listed as skipped). Dry run
without a GPU (tiny models, CPU virtual devices, host clock):

    TRITON_INTERPRET=1 python bench/gpu_kernel_times.py --out /tmp/kt --size tiny --devices cpu:0,cpu:1 \
        --models llama --repeats 1
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import torch

from torch_tessera.errors import TesseraError

log = logging.getLogger("gpu_kernel_times")


def _file_tag(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_")


def _sim_device(spec, gpu_key: str | None) -> str:
    """The catalog device a measured one stands for: ``cuda:0@24sm`` on an H200 -> ``sim:h200@24sm`` (granted SMs)."""
    if not spec.is_gpu or gpu_key is None:
        return spec.name
    return f"sim:{gpu_key}@{spec.sm_count}sm" if spec.sm_count != spec.total_sms else f"sim:{gpu_key}"


def time_model(model: str, args, out: Path, gpu_key: str | None, summary: dict) -> None:
    from torch_tessera.lowering.serialize import dump_program, load_program
    from torch_tessera.measure.kernel_times import CudaClock, HostClock, features_json, time_back_to_back, \
        write_launch_times
    from torch_tessera.measure.profile import graph_total, prepare_launches
    from torch_tessera.measure.programs import build_programs, compile_program
    from torch_tessera.measure.settings import MeasureSettings
    from torch_tessera.target.costmodel import program_features

    t0 = time.time()
    s = MeasureSettings(model=model, devices=args.devices, size=args.size, layers=args.layers,
                        prefill_tokens=args.prefill_tokens if model != "mamba" else None)
    gpu = args.devices.split(",")[0].startswith("cuda")
    progs = build_programs(s, "cuda:0" if gpu else "cpu")
    steps = summary.setdefault("steps", {}).setdefault(model, {})
    steps["build_s"] = round(time.time() - t0, 1)
    per_device: dict[int, dict] = {}
    for prog in progs:
        t1 = time.time()
        compile_program(prog, args.devices, cuda_graphs=False)
        program = prog.runner.program
        dump = out / f"{model}_{prog.name}.program.json"
        dump_program(program, dump)
        try:
            load_program(dump)
            loads = True
        except TesseraError as e:
            loads = f"{type(e).__name__}: {e}"
        feats = features_json(program_features(program))
        steps[f"{prog.name}_compile_s"] = round(time.time() - t1, 1)
        print(f"{model} {prog.name}: {len(program.launches)} launches lowered on {program.device} in "
              f"{time.time() - t1:.1f} s; dump loads: {loads}", flush=True)
        for g, dev in enumerate(prog.runner.devices):
            t2 = time.time()
            d = prepare_launches(prog, g)
            clock = CudaClock(d.stream, dev.torch_device) if dev.torch_device.type == "cuda" else HostClock()
            launches = program.launches
            with torch.no_grad():
                bb = time_back_to_back(len(launches), lambda i: d.run(launches[i], d.stream), d.restore, clock,
                                       repeats=args.repeats, chunk=args.chunk)
                graph = None
                if dev.torch_device.type == "cuda":
                    try:
                        graph = graph_total(d, 10)
                    except Exception as e:  # noqa: BLE001 - the check is optional; say why it is missing
                        print(f"  {dev.name}: the CUDA-graph check failed ({type(e).__name__}: {e})", flush=True)
            entry = {"program": dump.name, "seconds": list(bb.seconds), "spread": list(bb.spread),
                     "starved": list(bb.starved), "starved_chunks": bb.starved_chunks, "chunks": bb.chunks,
                     "sum_s": float(sum(bb.seconds)), "graph_total_s": graph, "dump_loads": loads is True,
                     "features": feats}
            per_device.setdefault(g, {"device": dev, "programs": {}})["programs"][prog.name] = entry
            ratio = f"{entry['sum_s'] / graph:.3f}" if graph else "-"
            print(f"  {dev.name}: sum {entry['sum_s'] * 1e3:.3f} ms, graph {graph * 1e3 if graph else float('nan'):.3f}"
                  f" ms (sum/graph {ratio}), starved chunks {bb.starved_chunks}/{bb.chunks * args.repeats}, "
                  f"{time.time() - t2:.1f} s", flush=True)
            del d, clock
        prog.fn = prog.runner = None
        if gpu:
            torch.cuda.empty_cache()
    versions = {"torch": torch.__version__, "triton": _triton_version()}
    for g, v in per_device.items():
        dev = v["device"]
        path = out / f"{model}_{_file_tag(dev.name)}.launch_times.json"
        write_launch_times(path, model=model, device=dev.name, sim_device=_sim_device(dev.spec, gpu_key),
                           gpu=torch.cuda.get_device_name(0) if gpu else "cpu", settings=vars(args) | {"model": model},
                           programs=v["programs"], method="back to back, CUDA events behind a GEMM backlog "
                           "(torch_tessera.measure.kernel_times)", versions=versions)
        summary.setdefault("files", {})[path.name] = {
            p: {"launches": len(e["seconds"]), "sum_ms": e["sum_s"] * 1e3,
                "graph_ms": e["graph_total_s"] * 1e3 if e["graph_total_s"] else None,
                "starved_chunks": e["starved_chunks"]} for p, e in v["programs"].items()}
    steps["total_s"] = round(time.time() - t0, 1)


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "-"


def _save(summary: dict, out: Path, top: Path, pack: bool) -> None:
    """Write ``summary.json`` (in ``top``) and, with ``pack``, every file of ``out`` into ``top/kernel_times.tar.gz``
    (rewritten whole, so a run stopped later keeps the models done)."""
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if not pack:
        return
    (top / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    tmp = top / "kernel_times.tar.gz.part"
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(out.iterdir()):
            tar.add(f, arcname=f.name)
    tmp.replace(top / "kernel_times.tar.gz")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama,dit,mamba,moe")
    ap.add_argument("--devices", default="cuda:0,cuda:0@16sm,cuda:0@24sm,cuda:0@72sm",
                    help="the whole GPU and its partitions (the first is the home the programs are lowered for)")
    ap.add_argument("--size", default="full", choices=("full", "tiny"))
    ap.add_argument("--layers", type=int, default=None, help="repeated blocks kept (default: 8 at full size)")
    ap.add_argument("--prefill-tokens", type=int, default=None,
                    help="LLM prompt tokens (default: the measured bench's; Mamba keeps its own default)")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per launch (median kept)")
    ap.add_argument("--chunk", type=int, default=96, help="launches timed behind one backlog")
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no model after this many seconds")
    ap.add_argument("--model-s", type=float, default=60.0, help="seconds a model is assumed to need at least")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                    help="pack the files into --out/kernel_times.tar.gz (default) instead of writing them there")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    top = Path(args.out)
    top.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="kernel_times_")) if args.pack else top
    gpu_key = None
    if torch.cuda.is_available() and args.devices.startswith("cuda"):
        from torch_tessera.target.catalog import match_gpu_name

        e = match_gpu_name(torch.cuda.get_device_name(0))
        gpu_key = e.key if e else None
    summary: dict = {"args": vars(args), "torch": torch.__version__, "triton": _triton_version(), "gpu_key": gpu_key,
                     "skipped": [], "failed": {}}
    from torch_tessera.models import get_model

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in models:  # an unknown name fails here, naming the registry, before any work
        get_model(model)
    start = time.time()
    for model in models:
        if time.time() - start > args.budget_s - args.model_s:
            summary["skipped"].append(model)
            print(f"{model}: skipped (budget {args.budget_s:.0f} s)", flush=True)
            continue
        try:
            time_model(model, args, out, gpu_key, summary)
        except Exception as e:  # noqa: BLE001 - one model's failure must not lose the others' results
            summary["failed"][model] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _save(summary, out, top, args.pack)
    summary["seconds"] = round(time.time() - start, 1)
    _save(summary, out, top, args.pack)
    print(json.dumps({k: summary[k] for k in ("skipped", "failed", "seconds")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
