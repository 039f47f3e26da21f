"""What the throughput plan's transfer trimming (``scheduler.transfers``) costs in planning time and objective.

Usage: ``PYTHONPATH=. python bench/time_trim.py MODEL [DEVICES] [--pickle FILE] [--prefill-tokens N]`` (defaults:
sim:a100,sim:l40s; the prefill length of ``model_workload``, 1024; Mamba is timed with ``--prefill-tokens 16``).
Lowers the full-size model without weights as ``tessera plan`` does (or loads the ``ModelWorkload`` pickled in FILE
by an earlier run, which then also writes it; a pickle lowered for other devices is costed again on DEVICES), and
times ``plan(policy="throughput")`` five times with the trimming off and on (median), printing each plan's value,
gap, method and the machine's load average. Synthetic 1000/1500-kernel cases:
``PYTHONPATH=. python bench/time_trim.py synthetic``.
"""

from __future__ import annotations

import os
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch_tessera.scheduler.solve as solve  # noqa: E402
from torch_tessera.scheduler import plan  # noqa: E402


def timed(wl, costs, topo) -> None:
    defaults = solve.solve_throughput.__defaults__
    try:
        for tol in (None, solve.TRANSFER_TOLERANCE):
            solve.solve_throughput.__defaults__ = defaults[:-1] + (tol,)
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                p = plan(wl, costs, topo, policy="throughput", cache_dir=False)
                ts.append(time.perf_counter() - t0)
            print(f"  trim {'on ' if tol else 'off'}: {statistics.median(ts) * 1e3:.1f} ms (median of 5), value "
                  f"{p.predicted_seconds:.7g} s, gap {100 * p.gap:.2f} %, {p.solver.method}, load "
                  f"{os.getloadavg()[0]:.2f}; {p.solver.notes[-1]}", flush=True)
    finally:
        solve.solve_throughput.__defaults__ = defaults


def main(argv: list[str]) -> None:
    model = argv[0] if argv else "llama"
    if model == "synthetic":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_scheduler import case

        for size in (1000, 1500):
            for d in (2, 4):
                print(f"synthetic transformer, {size} kernels, {d} devices")
                timed(*case("layers", size, d))
        return
    devices = argv[1] if len(argv) > 1 and not argv[1].startswith("--") else "sim:a100,sim:l40s"
    path = argv[argv.index("--pickle") + 1] if "--pickle" in argv else None
    if path and os.path.exists(path):
        mw = pickle.load(open(path, "rb"))
        if tuple(mw.topology.devices) != tuple(devices.split(",")):  # lowered once, costed on these devices
            from torch_tessera.runtime.devices import parse_devices

            mw = mw.on_devices(parse_devices(devices))
    else:
        from torch_tessera.backend.workload import model_workload
        from torch_tessera.runtime.devices import parse_devices

        kw = {"prefill_tokens": int(argv[argv.index("--prefill-tokens") + 1])} if "--prefill-tokens" in argv else {}
        mw = model_workload(model, parse_devices(devices), size="full", **kw)
        if path:
            pickle.dump(mw, open(path, "wb"))
    print(f"{model} on {devices}: {sum(len(p.dag.graph) for p in mw.workload.programs)} launches")
    timed(mw.workload, None, mw.topology)


if __name__ == "__main__":
    main(sys.argv[1:])
