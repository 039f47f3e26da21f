"""What the throughput plan's transfer trimming (``scheduler.transfers``) costs in planning time and objective.

Usage: ``PYTHONPATH=. python bench/time_trim.py MODEL [DEVICES] [--pickle FILE] [--prefill-tokens N] [--runs N]
[--no-hop] [--trim-only]`` (defaults: sim:a100,sim:l40s; the prefill length of ``model_workload``, 1024; Mamba is
timed with ``--prefill-tokens 16``). Lowers the full-size model without weights as ``tessera plan`` does (or loads the
``ModelWorkload`` pickled in FILE by an earlier run, which then also writes it; a pickle lowered for other devices, or
before the topology carried the per-hop charge, is costed again on DEVICES), and times ``plan(policy="throughput")``
``--runs`` times (default 5) with the trimming off and on (median; ``--trim-only``: on only), printing each plan's
value, gap, method, solve notes and the machine's load average. ``--no-hop``: plan on the same links without the
per-hop charge (:meth:`Topology.without_overheads`, the model before issue 9). Synthetic 1000/1500-kernel cases:
``PYTHONPATH=. python bench/time_trim.py synthetic``.
"""

from __future__ import annotations

import os
import pickle
import statistics
import sys
import time

import torch_tessera.scheduler.solve as solve
from torch_tessera.scheduler import plan


def timed(wl, costs, topo, runs: int = 5, trim_only: bool = False) -> None:
    defaults = solve.solve_throughput.__defaults__
    try:
        for tol in ((solve.TRANSFER_TOLERANCE,) if trim_only else (None, solve.TRANSFER_TOLERANCE)):
            solve.solve_throughput.__defaults__ = defaults[:-1] + (tol,)
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                p = plan(wl, costs, topo, policy="throughput", cache_dir=False)
                ts.append(time.perf_counter() - t0)
            print(f"  trim {'on ' if tol else 'off'}: {statistics.median(ts) * 1e3:.1f} ms (median of {runs}; "
                  f"{min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}), value {p.predicted_seconds:.7g} s, gap "
                  f"{100 * p.gap:.2f} %, {p.solver.method}, load {os.getloadavg()[0]:.2f}; "
                  f"{' | '.join(p.solver.notes[1:]) or '-'}", flush=True)
    finally:
        solve.solve_throughput.__defaults__ = defaults


def main(argv: list[str]) -> None:
    model = argv[0] if argv else "llama"
    if model == "synthetic":
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
        if tuple(mw.topology.devices) != tuple(devices.split(",")) or getattr(mw.topology, "hop_overhead",
                                                                                 None) is None:
            # lowered once, costed on these devices (and with the per-hop charge a pickle from before it lacks)
            from torch_tessera.target.devices import parse_devices

            mw = mw.on_devices(parse_devices(devices))
    else:
        from torch_tessera.backend.workload import model_workload
        from torch_tessera.target.devices import parse_devices

        kw = {"prefill_tokens": int(argv[argv.index("--prefill-tokens") + 1])} if "--prefill-tokens" in argv else {}
        mw = model_workload(model, parse_devices(devices), size="full", **kw)
        if path:
            pickle.dump(mw, open(path, "wb"))
    topo = mw.topology.without_overheads() if "--no-hop" in argv else mw.topology
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 5
    hop = topo.hop_overhead[topo.hop_overhead > 0]
    print(f"{model} on {devices}: {sum(len(p.dag.graph) for p in mw.workload.programs)} launches, per-hop charge "
          + (f"{hop.min() * 1e6:.3g}-{hop.max() * 1e6:.3g} us" if len(hop) else "none"))
    timed(mw.workload, None, topo, runs, "--trim-only" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])
