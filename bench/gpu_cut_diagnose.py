"""Where a pipelined step loses its time at the cuts: one plan's explicit schedule measured in four modes.

For each plan (the planner's plan with the per-cut charge set to ``--hop-us``, a random placement, the ``af`` plan),
the modulo scheduler's schedule over ``--micro-batches`` micro-batches is replayed by the runtime
(:mod:`torch_tessera.runtime.replay`) and its steady-state step (one replay: every micro-batch once) is timed:

* ``executed``: as the runtime runs it (results checked against the single-call executor);
* ``null-hop``: every wait kept, no bytes moved (differs from ``executed`` only across memory domains);
* ``no-wait``: every record and wait dropped (results wrong; timing only);
* ``alone-D``: device D's share of the steps alone (no waits, the other device idle).

Every mode runs in the buffers of one executed replay (so a mode that drops steps still reads real values, and no
mode pays for allocations).

The lost time ``executed - max(alone)`` is split into:

* waits: ``executed - no-wait`` (waits and what they serialise);
* issue order: ``max(0, min(no-wait, host issue) - max(alone))``, the time the streams wait for the host to issue
  their steps (``host issue``: host seconds to issue one replay, without the final wait);
* shared bandwidth: the rest of ``no-wait - max(alone)`` (both partitions running at once, sharing DRAM).

Per cut edge overhead: ``(executed - max(alone)) / (cut edges x micro-batches)``, and the same for the waits alone.
Modes are timed in ``--rounds`` interleaved rounds (order reversed every round), median per mode.

Usage (one H200 split in two green-context partitions; < 8 min)::

    python bench/gpu_cut_diagnose.py --out DIR --model llama --layers 8 --devices cuda:0@104sm,cuda:0@24sm
    python bench/gpu_cut_diagnose.py --out DIR --devices cpu:0,cpu:1 --size tiny   # CPU dry run (plumbing only)

Writes ``DIR/cut_diagnose.json`` and ``DIR/cut_diagnose.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("gpu_cut_diagnose")

MODES = ("executed", "null-hop", "no-wait")


def build(args) -> tuple[Any, Any, tuple, list]:
    """The model (``--layers`` kept), its inputs, its runner on ``--devices`` and the program's input template."""
    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.measure.programs import cut_layers
    from torch_tessera.models import build_module, get_model

    spec = get_model(args.model)
    on_cuda = args.devices.startswith("cuda")
    dtype = torch.float32 if args.size == "tiny" else torch.bfloat16
    model = build_module(args.model, args.size, device="cuda" if on_cuda else None, dtype=dtype)
    if args.layers and hasattr(model, "model"):  # the registry's wrappers hold the transformers / diffusers module
        cut_layers(model.model, spec.family, args.layers)
    inputs = spec.example_inputs(args.size, device="cuda" if on_cuda else "cpu", dtype=dtype, seed=0)
    backend = RecordingBackend(devices=args.devices, policy="home")
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(*inputs)
    runner = backend.executors[0]
    seen: list = []
    ex = runner.executor
    run = ex.run
    ex.run = lambda a: (seen.append(list(a)), run(a))[1]
    with torch.no_grad():
        compiled(*inputs)
    del ex.run
    return model, runner, inputs, seen[0]


def micro_batches(spec, args, template, inputs, n: int, device: str) -> list[list]:
    """``n`` micro-batches of fresh inputs in the program's input order (weights shared)."""
    out = []
    for k in range(n):
        fresh = spec.example_inputs(args.size, device=device, seed=100 + k,
                                    dtype=torch.float32 if args.size == "tiny" else torch.bfloat16)
        batch = list(template)
        for old, new in zip(inputs, fresh):
            batch = [new if a is old else a for a in batch]
        out.append(batch)
    return out


def launch_costs(runner, batch: list, repeats: int = 3):
    """Seconds of each launch on each device alone: CUDA events around every launch of the program placed whole on
    that device (minimum of ``repeats`` runs); on CPU the roofline model (plumbing only)."""
    from torch_tessera.backend.pipeline import estimate
    from torch_tessera.runtime.schedule import LaunchStep
    from torch_tessera.target.costs import CostTable

    specs = [d.spec for d in runner.devices]
    if runner.devices[0].torch_device.type != "cuda":
        return estimate(runner.program, specs)[0]
    n = len(runner.program.launches)
    secs = np.zeros((n, len(specs)))
    for g, dev in enumerate(runner.devices):
        runner.set_placement({i: g for i in range(n)})
        ex = runner.executor
        with torch.no_grad():
            ex.run(list(batch))  # places the weights, compiles for this device
            best = np.full(n, np.inf)
            for _ in range(repeats):
                ctx = ex.call_context(ex.bind_call(list(batch)), ex.streams)
                stream = ex.streams[g]
                marks = []
                for item in ex.items:
                    if isinstance(item.step, LaunchStep):
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record(stream)
                        item.run(ctx)
                        b.record(stream)
                        marks.append((item.step.launch, a, b))
                    else:
                        item.run(ctx)
                dev.synchronize()
                for launch, a, b in marks:
                    best[launch] = min(best[launch], a.elapsed_time(b) / 1e3)
        secs[:, g] = best
    return CostTable(tuple(s.name for s in specs), tuple(range(n)), secs, source="cuda events, gpu_cut_diagnose")


def plans(runner, costs, hop_us: float) -> tuple[dict[str, dict], Any]:
    """Placements to diagnose: the planner's (per-cut charge ``hop_us``), a random one, the af plan."""
    from torch_tessera.backend.pipeline import place
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.target.links import build_topology

    specs = [d.spec for d in runner.devices]
    topo = build_topology(specs)
    charge = np.full((len(specs), len(specs)), hop_us * 1e-6)
    np.fill_diagonal(charge, 0.0)
    topo = dataclasses.replace(topo, hop_overhead=charge, overhead_source=f"gpu_cut_diagnose: {hop_us:g} us per cut")
    out = {}
    for name, policy in (("tessera", "throughput"), ("af", "af")):
        try:
            placement, _ = place(runner.program, runner.dag, specs, policy, costs=costs, topology=topo,
                                 cache_dir=False, micro_batches=2)
            out[name] = {"placement": dict(placement)}
        except Exception as e:  # noqa: BLE001 - a plan that does not apply is reported, the others still run
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    out["random"] = {"placement": random_placement(runner.dag, len(specs), 0)}
    return out, topo


def variants(sched, devices: int) -> dict[str, Any]:
    """The schedule with every wait (and record) dropped, and each device's share alone."""
    from torch_tessera.scheduler.pipeline_schedule import PipelinedSchedule, RecordStep, WaitStep

    def make(streams, source):
        return PipelinedSchedule(sched.devices, sched.micro_batches, tuple(tuple(s) for s in streams),
                                 sched.placement, sched.domains, sched.cut_edges, source=source)

    no_wait = [[s for s in st if not isinstance(s, (WaitStep, RecordStep))] for st in sched.streams]
    out = {"no-wait": make(no_wait, "no-wait")}
    for d in range(devices):
        out[f"alone-{d}"] = make([st if e == d else [] for e, st in enumerate(no_wait)], f"alone-{d}")
    return out


def time_modes(ex, sched, batches, args) -> dict[str, Any]:
    """Median seconds of one replay per mode, modes interleaved in rounds; the host issue time of ``executed``."""
    devices = len(ex.devices)
    var = variants(sched, devices)
    replays = {"executed": ex.replay(sched), "null-hop": ex.replay(sched, move_bytes=False)}
    replays.update({k: ex.replay(v, check=False) for k, v in var.items()})
    names = list(replays)
    times: dict[str, list[float]] = {k: [] for k in names}
    issue: list[float] = []
    sync = (lambda: torch.cuda.synchronize()) if ex.devices[0].torch_device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        replays["executed"].run(batches)
        pools = replays["executed"].last_pools  # every mode runs in these: each buffer exists and holds real values
        for r in names:
            replays[r].run(batches, pools)  # warm-up (autotuning)
        for rnd in range(args.rounds):
            for r in (names if rnd % 2 == 0 else names[::-1]):
                for _ in range(args.calls):
                    sync()
                    t0 = time.perf_counter()
                    replays[r].run(batches, pools)
                    times[r].append(time.perf_counter() - t0)
                    if r == "executed":
                        issue.append(replays[r].last_issue_seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    med["host-issue"] = statistics.median(issue)
    return med


def split(med: dict, devices: int, cuts: int, m: int) -> dict[str, float]:
    """The lost time and its parts (module docstring), per step and per cut edge."""
    alone = max(med[f"alone-{d}"] for d in range(devices))
    lost = med["executed"] - alone
    waits = med["executed"] - med["no-wait"]
    issue = max(0.0, min(med["no-wait"], med["host-issue"]) - alone)
    shared = max(0.0, med["no-wait"] - alone - issue)
    per = max(cuts * m, 1)
    return {"alone_max_s": alone, "lost_s": lost, "waits_s": waits, "issue_order_s": issue, "shared_bandwidth_s": shared,
            "per_cut_edge_us": lost / per * 1e6, "waits_per_cut_edge_us": waits / per * 1e6}


def diagnose(args) -> dict:
    from torch_tessera.models import get_model
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.simulate import simulate

    t0 = time.perf_counter()
    model, runner, inputs, template = build(args)
    device = "cuda" if args.devices.startswith("cuda") else "cpu"
    spec = get_model(args.model)
    batches = micro_batches(spec, args, template, inputs, args.micro_batches, device)
    costs = launch_costs(runner, batches[0])
    chosen, topo = plans(runner, costs, args.hop_us)
    res = {"model": args.model, "size": args.size, "layers": args.layers, "devices": args.devices,
           "micro_batches": args.micro_batches, "hop_us": args.hop_us, "launches": len(runner.program.launches),
           "torch": torch.__version__, "cost_source": costs.source, "plans": {}}
    for name, p in chosen.items():
        if "error" in p:
            res["plans"][name] = p
            continue
        placement = p["placement"]
        runner.set_placement(placement)
        ex = runner.executor
        sched = build_pipelined_schedule(runner.dag, placement, args.micro_batches, costs=costs, topology=topo,
                                         domains=ex.domains, devices=len(ex.devices))
        with torch.no_grad():
            got = ex.run_pipelined(batches, schedule=sched)
            want = [ex.run(list(b)) for b in batches]
        ok = all(torch.allclose(g[0].float(), w[0].float(), rtol=2e-2, atol=2e-2) for g, w in zip(got, want))
        med = time_modes(ex, sched, batches, args)
        cuts = len(sched.cut_edges)
        row = {"cut_edges": cuts, "waits": sched.num_waits, "transfer_bytes": sched.transfer_bytes,
               "launches_per_device": [sum(1 for v in placement.values() if v == d) for d in range(len(ex.devices))],
               "correct": ok, "seconds": med, "split": split(med, len(ex.devices), cuts, args.micro_batches)}
        try:
            row["simulated_s"] = simulate(sched, costs, topo).step_seconds
        except Exception as e:  # noqa: BLE001 - the prediction is context, not the measurement
            row["simulated_error"] = str(e)[:200]
        res["plans"][name] = row
        print(f"{name}: {cuts} cut edges, step {med['executed'] * 1e3:.3f} ms, lost "
              f"{row['split']['lost_s'] * 1e3:.3f} ms = waits {row['split']['waits_s'] * 1e3:.3f} + issue "
              f"{row['split']['issue_order_s'] * 1e3:.3f} + shared bandwidth {row['split']['shared_bandwidth_s'] * 1e3:.3f}"
              f"; {row['split']['per_cut_edge_us']:.1f} us per cut edge; results {'ok' if ok else 'WRONG'}")
    res["seconds_total"] = time.perf_counter() - t0
    return res


def markdown(res: dict) -> str:
    lines = [f"# Cut diagnosis: {res['model']} {res['size']}, {res['layers']} layers on {res['devices']}", "",
             f"{res['micro_batches']} micro-batches per step, per-cut charge {res['hop_us']} us when planning; "
             f"costs: {res['cost_source']}; torch {res['torch']}.", "",
             "| plan | cut edges | executed ms | null hop ms | no wait ms | alone max ms | host issue ms | waits ms | "
             "issue order ms | shared bw ms | per cut edge us | simulated ms | correct |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in res["plans"].items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |" + " |" * 11)
            continue
        s, x = r["seconds"], r["split"]
        sim = f"{r['simulated_s'] * 1e3:.3f}" if "simulated_s" in r else "-"
        lines.append(f"| {name} | {r['cut_edges']} | {s['executed'] * 1e3:.3f} | {s['null-hop'] * 1e3:.3f} | "
                     f"{s['no-wait'] * 1e3:.3f} | {x['alone_max_s'] * 1e3:.3f} | {s['host-issue'] * 1e3:.3f} | "
                     f"{x['waits_s'] * 1e3:.3f} | {x['issue_order_s'] * 1e3:.3f} | {x['shared_bandwidth_s'] * 1e3:.3f} | "
                     f"{x['per_cut_edge_us']:.1f} | {sim} | {r['correct']} |")
    lines += ["", "Modes and the split: see the docstring of bench/gpu_cut_diagnose.py."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for cut_diagnose.json / .md")
    ap.add_argument("--model", default="llama")
    ap.add_argument("--size", default="full", choices=("tiny", "full"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--devices", default="cuda:0@104sm,cuda:0@24sm")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--hop-us", type=float, default=5.0, help="per-cut charge the planner prices (us)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10, help="replays timed per mode per round")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    res = diagnose(args)
    (args.out / "cut_diagnose.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / "cut_diagnose.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
