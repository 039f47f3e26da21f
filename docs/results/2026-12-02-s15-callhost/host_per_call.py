"""Host seconds per call of a captured replay (runtime/captured.py), outside its graph, on this CPU.

Per model (tiny Mamba, Llama, the MMDiT; the largest compiled program, home placement on two CPU virtual devices,
2 micro-batches), the schedule is captured with the pointer-faithful stand-in graph (tests/runtime/graph_stand_in.py),
then the graph is swapped for one whose replay does nothing: what is left of ``CapturedReplay.run`` is the host work a
GPU call pays outside the graph (checks, input copies, the graph launch call, output clones, the wait). Median (and
10th / 90th percentiles) of ``--calls`` calls after ``--warm`` untimed ones, twice: the same input tensors every call
(a benchmark's loop), and new tensors for the copied inputs every call (a serving loop's fresh tokens); /proc/loadavg
before and after.

Run from the repo root::

    PYTHONPATH=$PWD python docs/results/2026-12-02-s15-callhost/host_per_call.py [--calls 2000] [--json OUT.json]

A sanity pass first replays the real stand-in graph once and compares its outputs with the capturing call's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import pytest
import torch


class NullGraph:
    """A graph whose replay issues nothing: the call's host work alone is timed."""

    def replay(self) -> None:
        return None


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split(" ")[:3].__str__()


def measure(name: str, calls: int, warm: int) -> dict:
    from bench import gpu_cut_diagnose as cd
    from torch_tessera.scheduler.modulo import build_pipelined_schedule

    args = SimpleNamespace(devices="cpu:0,cpu:1", size="tiny", layers=None, shape=None)
    spec, runner, inputs, template, err = cd.build(name, args)
    ex = runner.executor
    ex.set_cuda_graphs(True)
    placement = dict(ex.schedule.placement)
    sched = build_pipelined_schedule(runner.dag, placement, 2, domains=ex.domains, devices=len(ex.devices))
    batches = cd.micro_batches(spec, args, template, inputs, 2, "cpu")
    rep = ex.replay(sched, captured=True)
    with torch.no_grad():
        first = rep.run(batches)  # warm-up + capture
        again = rep.run(batches)  # one real (stand-in) replay
    for a, b in zip(first, again):
        for x, y in zip(a, b):
            if isinstance(x, torch.Tensor):
                torch.testing.assert_close(x, y)
    assert rep.captures == 1 and rep.replays == 1
    rep.graph = NullGraph()
    copied = sorted({k for s in rep.slots for k, _ in s.copy_list})
    out = {"inputs": len(ex.program.inputs), "outputs": len(ex.program.outputs), "launches": len(ex.program.launches),
           "copied_inputs": sum(len(s.copy_list) for s in rep.slots),
           "bound_inputs": sum(len(s.bound_list) for s in rep.slots), "calls": calls}
    for how in ("same", "fresh"):  # the same input tensors every call / new tensors for the copied inputs
        times = []
        with torch.no_grad():
            for k in range(warm + calls):
                if how == "fresh":
                    batches = [[a.clone() if i in copied else a for i, a in enumerate(b)] for b in batches]
                t0 = time.perf_counter()
                rep.run(batches)
                if k >= warm:
                    times.append(time.perf_counter() - t0)
        times.sort()
        q = statistics.quantiles(times, n=10)
        out[how] = {"median_us": statistics.median(times) * 1e6, "p10_us": q[0] * 1e6, "p90_us": q[-1] * 1e6,
                    "min_us": times[0] * 1e6}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--models", default="mamba,llama,dit")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from tests.runtime.graph_stand_in import install_stand_in

    out = {"load_before": load(), "torch": torch.__version__, "models": {}}
    with pytest.MonkeyPatch.context() as mp:
        install_stand_in(mp)
        for name in a.models.split(","):
            out["models"][name] = r = measure(name, a.calls, a.warm)
            print(f"{name}: {r['inputs']} inputs ({r['copied_inputs']} copied, {r['bound_inputs']} bound over 2 "
                  f"micro-batches), {r['outputs']} outputs", flush=True)
            for how in ("same", "fresh"):
                t = r[how]
                print(f"  {how} inputs: median {t['median_us']:.1f} us per call (p10 {t['p10_us']:.1f}, p90 "
                      f"{t['p90_us']:.1f}, min {t['min_us']:.1f})", flush=True)
    out["load_after"] = load()
    print("load before / after:", out["load_before"], out["load_after"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
