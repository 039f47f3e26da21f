"""Scheduler solve time on real model DAGs (lowered without weights), 2 and 4 simulated devices.

For each model (full size): the throughput plan (default options) and the latency plan, their solve times, and the
gap to the proven lower bound; for the throughput plan also the objective of the untied MILP given ``--untied-limit``
seconds (exact when it finishes) as the best known objective. Prints a markdown table; ``--json`` writes the rows.
Each row records the 1-minute load average when it was measured: on a shared 2-core machine other processes stretch
solve times.

Mamba's prefill is lowered at ``--mamba-prefill-tokens`` (default 16): transformers' torch path of the selective scan
is a Python loop over the sequence (``for index in range(seq_len)`` in ``mamba_selective_scan``), so the lowered
program grows with the prompt (64 layers x tokens x a few kernels) and lowering 1024 tokens did not finish in
10 minutes. The timed DAG is the one lowered, at that prompt length.

Usage: ``PYTHONPATH=. python bench/bench_real_dags.py [--models llama,moe,mamba] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama,moe,mamba")
    ap.add_argument("--json", default=None)
    ap.add_argument("--prefill-tokens", type=int, default=1024, help="prompt length of the prefill program")
    ap.add_argument("--mamba-prefill-tokens", type=int, default=16, help="prompt length for mamba (see docstring)")
    ap.add_argument("--untied-limit", type=float, default=60.0, help="seconds for the untied reference MILP")
    args = ap.parse_args()
    from tqdm import tqdm

    from torch_tessera.backend.workload import model_workload
    from torch_tessera.target.devices import parse_devices
    from torch_tessera.scheduler import plan

    pairs = {2: "sim:a100,sim:l40s", 4: "sim:a100,sim:l40s,sim:h100,sim:rtxpro6000"}
    rows = []
    models = args.models.split(",")
    bar = tqdm(total=len(models) * len(pairs), desc="real DAGs", unit="solve set")
    for model in models:
        tokens = args.mamba_prefill_tokens if model == "mamba" else args.prefill_tokens
        t0 = time.perf_counter()
        base = model_workload(model, parse_devices(pairs[2]), size="full", prefill_tokens=tokens)
        lower_s = time.perf_counter() - t0
        for n, devs in pairs.items():
            mw = base if n == 2 else base.on_devices(parse_devices(devs))
            kernels = sum(p.dag.num_kernels for p in mw.workload.programs)
            row = {"model": model, "devices": n, "kernels": kernels, "lower_s": round(lower_s, 1),
                   "prefill_tokens": tokens}
            for policy in ("throughput", "latency"):
                t0 = time.perf_counter()
                p = plan(mw.workload, None, mw.topology, policy=policy, cache_dir=False)
                if policy == "throughput":
                    p_thr = p
                row[f"{policy}_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
                row[f"{policy}_gap_pct"] = round(100 * p.gap, 2)
                row[f"{policy}_s"] = p.predicted_seconds
            row["load_avg"] = round(os.getloadavg()[0], 1)
            row["throughput_method"] = p_thr.solver.method
            t0 = time.perf_counter()
            exact = plan(mw.workload, None, mw.topology, policy="throughput", cache_dir=False, tie_layers=False,
                         time_limit=args.untied_limit)
            row["untied_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            row["untied_status"] = exact.solver.status
            row["vs_untied_pct"] = round(100 * (row["throughput_s"] / exact.predicted_seconds - 1), 2)
            row["untied_gap_pct"] = round(100 * exact.gap, 2)
            rows.append(row)
            bar.update(1)
            print(row, flush=True)
    bar.close()
    print(f"\n| model | devices | kernels | throughput solve | gap to bound | latency solve | gap "
          f"| untied MILP ({args.untied_limit:g} s limit) | ours vs untied | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['devices']} | {r['kernels']} | {r['throughput_ms']} ms | "
              f"{r['throughput_gap_pct']} % | {r['latency_ms']} ms | {r['latency_gap_pct']} % | "
              f"{r['untied_ms']} ms ({r['untied_status']}, gap {r['untied_gap_pct']} %) | {r['vs_untied_pct']:+} % "
              f"| {r['load_avg']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
