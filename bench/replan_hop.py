"""What the per-hop charge (issue 9) does to the plans of the measured bench's workloads, on CPU, without a GPU.

The ``bench.json`` files of 2026-11-29 hold each program's measured, calibrated total per device, not the per-launch
costs (runs from now on save them: ``kernel_seconds``). So each workload is rebuilt as the measured bench builds it
(8 layers; Llama prefill 1 x 1024 / decode 64 x 1 over a static KV cache of 1088 positions; Mamba prefill 1 x 16 /
decode 64 x 1 with its SSM state; the MMDiT's denoising step), lowered here without weights (Triton for CPU tensors:
the DAG differs from the GPU's in detail, e.g. Llama 178 launches here vs 148 on the H200, whose attention is one
cuDNN call), costed by the roofline model for an H200 and an H200 partition of 24 or 72 SMs, and each device's column
scaled to the measured total of that program on that device (``measured_kernel_seconds``: the same calibration the
bench applies to its one-by-one timings). Then every baseline and tessera are planned twice: with the topology's
per-hop charge (after) and without it (before, the model of 2026-11-29), micro-batches 1 as the measured bench plans;
every plan is scored by both models; the last column is each plan's solve time (``Plan.solver.wall_seconds``) and
method.

Usage: ``PYTHONPATH=. python bench/replan_hop.py [--models llama,mamba,dit] [--profiles 24,72] [--cache DIR]``
(lowering takes ~2.5 min for the three models on a 2-core machine; ``--cache`` keeps the lowered programs).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

#: Measured totals per (model, GPU1 SMs): the bench.json whose ``measured_kernel_seconds`` calibrate the costs
#: (session 4 where it ran that profile, else session 3).
MEASURED = {("llama", 24): "2026-11-29-s4/e/l24", ("llama", 72): "2026-11-29-s4/c/l72",
            ("mamba", 24): "2026-11-29-s4/d/m24", ("mamba", 72): "2026-11-29-s3/c/mamba72",
            ("dit", 24): "2026-11-29-s4/a/d24", ("dit", 72): "2026-11-29-s3/c/dit72"}


def _llama(batch: int, tokens: int, layers: int = 8, context: int = 1088):
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model
    from torch_tessera.static_cache import StaticCacheLM

    lm = build_module("llama", "full", device="meta", dtype=torch.bfloat16).model
    cut_layers(lm, "llm", layers)
    (ids,) = get_model("llama").example_inputs("full", batch, tokens, device="meta")
    pos = torch.arange(context - tokens, context, device="meta").expand(batch, tokens).contiguous()
    return StaticCacheLM(lm, batch, context).eval(), (ids, pos)


def _mamba(batch: int, tokens: int, layers: int = 8):
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model
    from torch_tessera.ssm_state import SSMStateLM

    lm = build_module("mamba", "full", device="meta", dtype=torch.bfloat16).model
    cut_layers(lm, "ssm", layers)
    return SSMStateLM(lm, batch).eval(), get_model("mamba").example_inputs("full", batch, tokens, device="meta")


def _dit(layers: int = 8):
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model

    module = build_module("dit", "full", device="meta", dtype=torch.bfloat16)
    cut_layers(module.model, "diffusion", layers)
    return module, get_model("dit").example_inputs("full", 1, device="meta", dtype=torch.bfloat16)


#: model -> [(program, builder, runs per step)], output per step, unit
WORKLOADS = {"llama": ([("prefill", lambda: _llama(1, 1024), 1.0), ("decode", lambda: _llama(64, 1), 129 / 64)],
                       129.0, "tok/s"),
             "mamba": ([("prefill", lambda: _mamba(1, 16), 1.0), ("decode", lambda: _mamba(64, 1), 129 / 64)],
                       129.0, "tok/s"),
             "dit": ([("denoise", _dit, 1.0)], 60 / 28, "images/min")}


def lowered(model: str, cache: Path | None) -> list[tuple[str, object, object, float]]:
    """``[(program name, KernelProgram, DAG, runs per step)]`` of ``model``'s workload (lowered once, cached)."""
    from torch_tessera.backend.pipeline import analyze
    from torch_tessera.lowering.fake import lower_without_weights

    out = []
    for name, build, freq in WORKLOADS[model][0]:
        path = cache / f"{model}-{name}.dag2.pkl" if cache else None  # dag2: DAG nodes hold KernelNode records
        if path is not None and path.exists():
            program, dag = pickle.loads(path.read_bytes())
        else:
            t0 = time.perf_counter()
            program = lower_without_weights(build).program
            dag = analyze(program)
            print(f"lowered {model} {name}: {len(program.launches)} launches in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(pickle.dumps((program, dag)))
        out.append((name, program, dag, freq))
    return out


def workload(model: str, sms: int, progs) -> tuple[object, object]:
    """The scheduler's workload on ``cuda:0,cuda:1@<sms>sm`` (emulated H200s) with each device's column scaled to
    the measured total, and the topology (with the per-hop charge)."""
    from torch_tessera.target.costmodel import estimate_costs
    from torch_tessera.target.costs import CostTable
    from torch_tessera.target.devices import parse_devices
    from torch_tessera.target.links import build_topology
    from torch_tessera.scheduler import Workload, WorkloadProgram

    specs = parse_devices(f"cuda:0,cuda:1@{sms}sm", assume_gpu="h200")
    meta = json.loads((ROOT / "docs/results" / MEASURED[(model, sms)] / "bench.json").read_text())["measured"]["meta"]
    wps = []
    for name, program, dag, freq in progs:
        table = estimate_costs(program, specs)
        total = np.asarray(meta["measured_kernel_seconds"][name])
        sec = table.seconds * (total / table.seconds.sum(0))[None]
        table = CostTable(table.devices, table.kernels, sec, f"roofline scaled to {MEASURED[(model, sms)]} totals")
        wps.append(WorkloadProgram(name, dag, table, freq, name if name in ("prefill", "decode") else ""))
    return Workload(tuple(wps)), build_topology(specs)


def cuts(p) -> str:
    per = {}
    for e in p.cut_edges:
        if e.kind != "STATE":
            per[e.program] = per.get(e.program, 0) + 1
    return "+".join(str(per.get(name, 0)) for name in p.placements)


def main(argv: list[str] | None = None) -> int:
    from torch_tessera.benchmark import plan_names
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, plan
    from torch_tessera.scheduler.evaluate import cycle_seconds
    from torch_tessera.scheduler.problem import compile_problem

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama,mamba,dit")
    ap.add_argument("--profiles", default="24,72")
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = []
    print("| model | GPU1 | plan | model | cuts (per program) | predicted before | predicted after | "
          "vs homo-L (after) | vs layer (after) | solve |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.models.split(","):
        progs = lowered(model, args.cache)
        out_step, unit = WORKLOADS[model][1], WORKLOADS[model][2]
        for sms in (int(x) for x in args.profiles.split(",")):
            wl, topo = workload(model, sms, progs)
            scored = {}
            for which, tp in (("before", topo.without_overheads()), ("after", topo)):
                pb_before = compile_problem(wl, topo.without_overheads(), micro_batches=1)
                pb_after = compile_problem(wl, topo, micro_batches=1)
                for name in plan_names(2):
                    try:
                        p = plan(wl, None, tp, policy="throughput" if name == "tessera" else name, cache_dir=False,
                                 micro_batches=1)
                    except (NotApplicableError, InfeasiblePlanError):
                        continue
                    if p.replicas:  # request-dist: a replica per device, throughputs add up (no cuts)
                        b, a = p.cycle_seconds, p.cycle_seconds
                    else:
                        place = np.array([p.placements[pb_after.programs[pr]][k]
                                          for pr, k in zip(pb_after.prog.tolist(), pb_after.launch.tolist())])
                        b, a = cycle_seconds(pb_before, place), cycle_seconds(pb_after, place)
                    scored[(which, name)] = (p, b, a)
            homo_a = scored[("after", "homo-L")][2]
            layer_a = scored.get(("after", "layer"), (None, np.nan, np.nan))[2]
            for (which, name), (p, b, a) in scored.items():
                if which == "before" and name not in ("tessera", "layer"):
                    continue  # the other baselines are fixed rules: the same placement either way
                label = f"{name} (planned {which})" if name in ("tessera", "layer") else name
                row = dict(model=model, sms=sms, plan=label, cuts=cuts(p), before=out_step / b, after=out_step / a,
                           vs_homo=homo_a / a, vs_layer=layer_a / a, unit=unit, solve_s=p.solver.wall_seconds,
                           method=p.solver.method)
                rows.append(row)
                print(f"| {model} | {sms} SMs | {label} | {unit} | {row['cuts']} | {row['before']:,.1f} | "
                      f"{row['after']:,.1f} | {row['vs_homo']:.2f}x | {row['vs_layer']:.2f}x | "
                      f"{row['solve_s']:.3f} s ({row['method']}) |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
