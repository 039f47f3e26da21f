"""Where a call of the home plan as one CUDA graph spends its time, beside ``mode="reduce-overhead"`` (issue 5 (a)).

Target: everything on one device, run as one CUDA graph by our runtime, within 3 % of reduce-overhead (measured
2.08 vs 1.93 ms per forward, 8-layer Llama-3.1-8B-shaped model, batch 64 x 1; ``bench/gpu_runtime_check.py``).
Both are compiled from the same model; each quantity is a median over ``--repeats`` calls:

* ``call_ms``: call, then ``torch.cuda.synchronize()`` (the runtime check's timing);
* ``host_ms``: the call alone, up to its return (host work, plus any wait for the GPU inside the call);
* ``gpu_ms``: CUDA events recorded on the caller's stream just before and just after the call (the span the GPU
  sees, launch gaps included; reduce-overhead and our fast path both replay on that stream);
* ``replay_ms``: the captured graph alone, after copying this call's inputs into the graph's static input buffers
  (what a call does before replaying), then synchronise: ours from the executor (its ``copy_list``), reduce-
  overhead's from cudagraph trees' node (``CUDAGraphNode._copy_inputs_and_remove_from_src`` into its
  ``reconstructed_inputs``; skipped if those internals moved). The copy is needed: cudagraph trees hand the memory
  of a non-static input back to the graph's pool once it is dead, so after a replay that address holds activations,
  and replaying again without the copy read them as token ids (session 5, call B: a device-side index assert). The
  copied inputs are checked equal to the call's before the first replay;
* ours only: ``runner_ms`` (our runner called with the graph inputs directly, then synchronise: the call without
  Dynamo and AOTAutograd);
* graph nodes by type of both graphs (cuda-python), and every GPU kernel of 5 calls from ``torch.profiler``, with
  the kernels whose count or time differ between the two.

``call_ms`` / ``host_ms`` / ``gpu_ms`` are taken in ``--rounds`` interleaved rounds (ours and reduce-overhead
alternately, order reversed every round), each a median over ``--repeats`` calls; reported as the median over rounds
[quartiles], with the per-round ratio ours / reduce-overhead. Steps that can fail on a device (the replays) run last,
each guarded, so an error there is recorded in ``home_gap.json`` and the rest is kept.

Run: ``python3 bench/gpu_home_gap.py --out $OUT/gap --layers 8 [--devices cuda:0,cuda:1@72sm]`` (the runtime check
used both devices; only the first is used by the home plan). Run it on ``main`` and on a branch to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import torch

from torch_tessera.backend.recording import RecordingBackend
from torch_tessera.compat.cudagraph_trees import fresh_ro_replay, ro_graph, ro_node_and_inputs
from torch_tessera.measure.gpu_checks import fresh_ours_replay


def medians(fn, repeats: int) -> dict:
    """call / host / gpu milliseconds of ``fn`` (see the module docstring)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    call, host, gpu = [], [], []
    for _ in range(repeats):
        stream = torch.cuda.current_stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record(stream)
        fn()
        t1 = time.perf_counter()
        end.record(stream)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        call.append(t2 - t0)
        host.append(t1 - t0)
        gpu.append(start.elapsed_time(end) * 1e-3)
    return {"call_ms": statistics.median(call) * 1e3, "host_ms": statistics.median(host) * 1e3,
            "gpu_ms": statistics.median(gpu) * 1e3}


def synced(fn, repeats: int) -> float:
    """Median ms of ``fn(); synchronize()``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def node_types(graph: torch.cuda.CUDAGraph) -> dict:
    """Count of the graph's nodes by type (cuda-python over ``CUDAGraph.raw_cuda_graph``)."""
    from cuda.bindings import runtime as cudart

    raw = graph.raw_cuda_graph()
    err, _, n = cudart.cudaGraphGetNodes(raw, 0)
    err, nodes, n = cudart.cudaGraphGetNodes(raw, n)
    counts: dict = defaultdict(int)
    for node in nodes[:n]:
        err, kind = cudart.cudaGraphNodeGetType(node)
        counts[str(kind).split(".")[-1]] += 1
    edges = cudart.cudaGraphGetEdges(raw, 0)[-1]  # (err, from, to[, data], count) across CUDA versions
    return {"nodes": int(n), "by_type": dict(counts), "edges": int(edges)}


def kernels(fn, calls: int = 5) -> dict:
    """GPU microseconds per call and calls per call of every kernel name over ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = getattr(e, "self_cuda_time_total", 0) if us is None else us
        if us > 0 and not e.key.startswith("## Call") and e.key != "Activity Buffer Request":
            out[e.key] = {"count": e.count / calls, "us": us / calls}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--devices", default="cuda:0")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per step (per round for the call timings)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds of ours / reduce-overhead calls")
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from gpu_runtime_check import build
    from torch_tessera.measure.paired_timing import judge_ratio, paired_ratios, spread

    from torch_tessera.runtime.runner import TesseraRunner

    res: dict = {"args": vars(args), "torch": torch.__version__, "errors": {}}
    model, ids = build(args.layers, args.seq, args.batch)
    with torch.no_grad():
        backend = RecordingBackend(devices=args.devices, policy="home", cuda_graphs=True)
        ours = torch.compile(model, backend=backend, dynamic=False)
        ours(ids)
        ours(ids)
        runner = backend.executors[0]
        ex = runner.executor
        state = ex.graphs.entry()
        res["ours"] = {"launches": len(ex.program.launches), "inputs": len(ex.program.inputs),
                       "copied_in_per_call": len(state.copy_list),
                       "static_inputs": list(getattr(ex.program, "static_inputs", ())),
                       "replays_on_caller_stream": getattr(state, "on_caller_stream", None),
                       "host_wait": getattr(state, "host_wait", None)}
        seen = {}
        orig = TesseraRunner.__call__

        def spy(self, a):
            seen["args"] = list(a)
            return orig(self, a)

        TesseraRunner.__call__ = spy
        try:
            ours(ids)
        finally:
            TesseraRunner.__call__ = orig
        ro = torch.compile(model, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            ro(ids)
        res["equal_outputs"] = bool(torch.allclose(ours(ids).float(), ro(ids).float(), rtol=2e-2, atol=2e-2))
        calls = {"reduce-overhead": lambda: ro(ids), "ours": lambda: ours(ids)}
        for r in range(args.rounds):  # interleaved: both see the same machine state
            for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                res.setdefault(name, {}).setdefault("runs", []).append(medians(calls[name], args.repeats))
        res["call_summary"] = {}
        for key in ("call_ms", "host_ms", "gpu_ms"):
            o = [x[key] for x in res["ours"]["runs"]]
            r_ = [x[key] for x in res["reduce-overhead"]["runs"]]
            ratios = paired_ratios(o, r_)
            res["call_summary"][key] = {"ours": spread(o), "reduce-overhead": spread(r_), "ratio": spread(ratios),
                                        "within_3_percent": judge_ratio(ratios, 0.03)}
        # before the replays: a device-side error there would end every CUDA call after it
        for name, graph in (("ours", lambda: state.whole), ("reduce-overhead", ro_graph)):
            try:
                res[name]["graph"] = node_types(graph())
            except Exception:  # noqa: BLE001
                res["errors"][f"{name} graph nodes"] = traceback.format_exc()
        try:
            k_ours, k_ro = kernels(lambda: ours(ids)), kernels(lambda: ro(ids))
            res["kernels"] = {"ours": k_ours, "reduce-overhead": k_ro}
            res["kernel_us_per_call"] = {"ours": sum(v["us"] for v in k_ours.values()),
                                         "reduce-overhead": sum(v["us"] for v in k_ro.values())}
            diff = []
            for k in sorted(set(k_ours) | set(k_ro)):
                a, b = k_ours.get(k, {"count": 0, "us": 0}), k_ro.get(k, {"count": 0, "us": 0})
                if a["count"] != b["count"] or abs(a["us"] - b["us"]) > 1.0:
                    diff.append({"kernel": k, "ours_count": a["count"], "ro_count": b["count"],
                                 "ours_us": a["us"], "ro_us": b["us"]})
            res["kernel_differences"] = sorted(diff, key=lambda d: -abs(d["ours_us"] - d["ro_us"]))
        except Exception:  # noqa: BLE001
            res["errors"]["kernels"] = traceback.format_exc()
        steps = {"ours runner": lambda: lambda: runner(list(seen["args"])),
                 "ours replay": lambda: fresh_ours_replay(state, seen["args"])}

        def ro_step():
            node, inputs = ro_node_and_inputs(ro, ids)
            replay, n_copied = fresh_ro_replay(node, inputs)
            res["reduce-overhead inputs copied per replay"] = n_copied
            return replay

        steps["reduce-overhead replay"] = ro_step
        for name, make in steps.items():
            try:
                res[name] = synced(make(), args.repeats)
            except Exception:  # noqa: BLE001 - internals of another torch, or a device error: report and go on
                res["errors"][name] = traceback.format_exc()
                print(name, "FAILED\n", res["errors"][name][-2000:], file=sys.stderr, flush=True)
        try:  # the replays left both graphs' outputs as a call would: one more call of each must still agree
            res["equal_outputs_after_replays"] = bool(torch.allclose(ours(ids).float(), ro(ids).float(),
                                                                     rtol=2e-2, atol=2e-2))
        except Exception:  # noqa: BLE001
            res["errors"]["after replays"] = traceback.format_exc()
    (out / "home_gap.json").write_text(json.dumps(res, indent=1, default=str))
    lines = report_lines(res, args)
    (out / "home_gap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not res["errors"] else 1


def _q(s: dict, fmt: str = ".3f") -> str:
    return f"{s['median']:{fmt}} [{s['p25']:{fmt}}-{s['p75']:{fmt}}]" if s.get("n") else "-"


def report_lines(res: dict, args) -> list[str]:
    """The markdown report of :func:`main`'s results."""
    nan = float("nan")
    lines = [f"home plan as one CUDA graph vs reduce-overhead: {args.layers} layers, batch {args.batch} x {args.seq}, "
             f"devices {args.devices}, torch {torch.__version__}; {res['ours']}", "",
             f"{args.rounds} interleaved rounds of {args.repeats} calls each: median over rounds [quartiles]; ratio "
             "ours / reduce-overhead per round (3 % target: met = upper quartile <= 1.03)", "",
             "| what | ours | reduce-overhead | ratio | within 3 % |", "| --- | --- | --- | --- | --- |"]
    for key, c in res.get("call_summary", {}).items():
        lines.append(f"| {key} | {_q(c['ours'])} | {_q(c['reduce-overhead'])} | {_q(c['ratio'])} | "
                     f"{c['within_3_percent']} |")
    lines.append(f"| replay only, fresh inputs copied in, ms | {res.get('ours replay', nan):.3f} | "
                 f"{res.get('reduce-overhead replay', nan):.3f} | | |")
    lines.append(f"| runner only (no Dynamo/AOT), ms | {res.get('ours runner', nan):.3f} | - | | |")
    if "kernel_us_per_call" in res:
        k = res["kernel_us_per_call"]
        lines.append(f"| kernel time per call, us | {k['ours']:.1f} | {k['reduce-overhead']:.1f} | | |")
    for name in ("ours", "reduce-overhead"):
        if "graph" in res.get(name, {}):
            lines.append(f"| graph of {name} | {res[name]['graph']} | | | |")
    lines += ["", f"outputs agree (allclose 2e-2): before the replays {res.get('equal_outputs')}, after them "
                  f"{res.get('equal_outputs_after_replays')}"]
    lines += ["", "kernels whose count or time differ (per call):", "", "| kernel | ours calls | ro calls | ours us | "
              "ro us |", "| --- | --- | --- | --- | --- |"]
    for d in res.get("kernel_differences", [])[:25]:
        lines.append(f"| {d['kernel'][:90]} | {d['ours_count']:g} | {d['ro_count']:g} | {d['ours_us']:.1f} | "
                     f"{d['ro_us']:.1f} |")
    if res["errors"]:
        lines += ["", f"errors: {sorted(res['errors'])} (tracebacks in home_gap.json)"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
