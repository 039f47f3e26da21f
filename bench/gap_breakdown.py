"""Where a measured plan's step time goes against its model, per device and per program (issue 9).

For one ``bench.json`` of ``tessera bench --measure`` that saved per-launch costs and placements (session 5 calls C,
D onwards) and the plans named, prints (Markdown):

1. the MODEL's step: per device, per program, the calibrated kernel seconds placed there (``kernel_seconds``), the
   per-hop charge ``h x cuts`` and the exposed copy time ``phi x bytes / bandwidth``, and the link load;
2. the MEASURED step: per program one call's kernel and copy time per GPU (``device_busy``), the pipelined calls
   (``pipelined_busy``: ``micro_batches`` calls in flight), serial / pipelined call times and the concurrent step,
   decomposed as: binding GPU's kernel time -> + idle inside the pipelined program chains -> + the programs
   contending when run at once;
3. the bound: the zero-communication bound recorded by the bench, the fractional lower bound over the per-launch
   costs (every launch split freely between the devices, no grouping, no cut costs), and what the model predicts for
   the best single placement under the charge (``tessera-single``, 1 micro-batch), ``request-dist`` and the streams
   plan.

Usage: ``python bench/gap_breakdown.py BENCH_JSON [PLAN ...]`` (default plans: tessera-single layer). Reads JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

LINK_BW = 450e9 * 0.875  # the planner's NVLink figure (target.links "nvlink4")


def fractional_bound(meta: dict) -> float:
    """Seconds per step of the LP relaxation with free transfers: every launch of every program may be split
    between the two devices in any proportion (no STATE grouping, no cuts charged). Exact for two devices: sort by
    the cost ratio and balance."""
    f = {p: v["frequency"] for p, v in meta["programs"].items()}
    c = np.concatenate([np.asarray(meta["kernel_seconds"][p]).T * f[p] for p in f])  # [n, 2] seconds per step
    lo, hi = 0.0, float(c[:, 0].sum())
    for _ in range(100):  # bisection on T: can every launch fit with device loads <= T?
        t = (lo + hi) / 2
        # give device 0 the launches with the smallest c0 / c1 first (fractional knapsack)
        order = np.argsort(c[:, 0] / np.maximum(c[:, 1], 1e-30))
        load0, load1 = 0.0, float(c[:, 1].sum())
        for k in order:
            if load1 <= t:
                break
            room = t - load0
            if room <= 0:
                break
            share = min(1.0, room / c[k, 0]) if c[k, 0] > 0 else 1.0
            load0 += share * c[k, 0]
            load1 -= share * c[k, 1]
        if load1 <= t + 1e-12:
            hi = t
        else:
            lo = t
    return hi


def model_table(meta: dict, plan: str) -> list[str]:
    pl, run = meta["plans"][plan], meta["runs"][plan]
    h, phi = np.asarray(meta["hop_overhead_s"])[0, 1], np.asarray(meta["copy_exposure"])[0, 1]
    rows = ["| program | runs/step | segments (device: ms per call) | kernels on GPU0, ms/step | on GPU1 | "
            "cuts/run | charge h x cuts, ms/step (each GPU) | exposed copy phi x bytes/bw, ms/step | link, ms/step |",
            "| " + " | ".join(["---"] * 9) + " |"]
    tot = np.zeros(2)
    charge = expo = link = 0.0
    for prog, place in pl["placements"].items():
        f, ks, pa = pl["frequencies"][prog], np.asarray(meta["kernel_seconds"][prog.split("@")[0]]), np.asarray(place)
        loads = np.array([f * ks[d][pa == d].sum() for d in range(2)])
        segs, i = [], 0
        for d, g in itertools.groupby(place):
            n = len(list(g))
            segs.append(f"{d}: {1e3 * ks[d][i:i + n].sum():.2f}")
            i += n
        cuts = pl["cut_edges"].get(prog, 0)
        nbytes = run.get("bytes_per_call", {}).get(prog, {}).get("cut", 0)
        ch, ex, li = f * cuts * h, f * phi * nbytes / LINK_BW, f * nbytes / LINK_BW
        tot += loads
        charge, expo, link = charge + ch, expo + ex, link + li
        rows.append(f"| {prog} | {f:.3f} | {', '.join(segs)} | {1e3 * loads[0]:.2f} | {1e3 * loads[1]:.2f} | {cuts} | "
                    f"{1e3 * ch:.2f} | {1e3 * ex:.3f} | {1e3 * li:.3f} |")
    dev = tot + charge + expo
    rows.append(f"| **step** | | | {1e3 * tot[0]:.2f} (+{1e3 * (charge + expo):.2f} = {1e3 * dev[0]:.2f}) | "
                f"{1e3 * tot[1]:.2f} (+{1e3 * (charge + expo):.2f} = {1e3 * dev[1]:.2f}) | | {1e3 * charge:.2f} | "
                f"{1e3 * expo:.3f} | {1e3 * link:.3f} |")
    rows.append(f"\nmodel cycle {1e3 * pl['cycle_seconds']:.2f} ms (recorded; recomputed {1e3 * max(dev.max(), link):.2f}), "
                f"uncharged {1e3 * tot.max():.2f} ms")
    return rows


def measured_table(meta: dict, plan: str, rows_by_plan: dict) -> list[str]:
    run, pl = meta["runs"][plan], meta["plans"][plan]
    m = meta["micro_batches"]
    out = ["| program | runs/step | serial call, ms | pipelined, ms per call | one call: GPU0 kernel / copy, ms | "
           "GPU1 kernel / copy | wall | pipelined (" + str(m) + " in flight): GPU0 kernel per call | GPU1 kernel per call "
           "| idle on the busier GPU in the pipelined chain, ms per call |", "| " + " | ".join(["---"] * 10) + " |"]
    busy_step = np.zeros(2)
    chain = idle_chain = 0.0
    for prog in pl["placements"]:
        f = pl["frequencies"][prog]
        db, pb = run["device_busy"][prog], run.get("pipelined_busy", {}).get(prog)
        k = np.array([db.get(f"gpu{g}", {}).get("kernel_ms", 0.0) for g in range(2)])
        cp = np.array([db.get(f"gpu{g}", {}).get("copy_ms", 0.0) for g in range(2)])
        busy_step += f * k
        ser = 1e3 * run["seconds"][prog]
        pip = 1e3 * run["pipelined_seconds"].get(prog, run["seconds"][prog])
        if pb:
            pk = np.array([pb.get(f"gpu{g}", {}).get("kernel_ms", 0.0) for g in range(2)]) / m
            idle = pip - pk.max()
            pcols = f"{pk[0]:.2f} | {pk[1]:.2f} | {idle:.2f}"
        else:
            idle = pip - k.max()
            pcols = f"- | - | {idle:.2f} (serial)"
        chain += f * pip
        idle_chain += f * idle
        out.append(f"| {prog} | {f:.3f} | {ser:.2f} | {pip:.2f} | {k[0]:.2f} / {cp[0]:.3f} | {k[1]:.2f} / {cp[1]:.3f} | "
                   f"{db['wall_ms']:.2f} | {pcols} |")
    r = rows_by_plan[plan]
    step = meta["output_per_step"] / r["output_per_s"] * 1e3
    conc = 1e3 * run.get("concurrent_step_seconds", float("nan"))
    longest = max(pl["frequencies"][p] * 1e3 * run["pipelined_seconds"].get(p, run["seconds"][p])
                  for p in pl["placements"])
    out.append(f"\nmeasured step {step:.2f} ms ({r['how']}); concurrent step {conc:.2f} ms; kernels per step "
               f"GPU0 {busy_step[0]:.2f}, GPU1 {busy_step[1]:.2f} ms (binding GPU busy {100 * busy_step.max() / step:.0f} % "
               f"of the step); longest program chain alone (runs/step x pipelined call) {longest:.2f} ms; "
               f"sum of the chains {chain:.2f} ms; idle inside the chains {idle_chain:.2f} ms/step")
    return out, dict(step=step, busy=busy_step, longest=longest, chain=chain, idle_chain=idle_chain, conc=conc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("plans", nargs="*", default=["tessera-single", "layer"])
    args = ap.parse_args(argv)
    data = json.loads(args.bench_json.read_text())
    meta, rows = data["measured"]["meta"], {r["plan"]: r for r in data["measured"]["rows"]}
    ops = meta["output_per_step"]
    for plan in args.plans:
        r = rows[plan]
        pred_step = ops / r["predicted_output_per_s"] * 1e3
        k = meta.get("display_factor", 1.0)  # output/s -> the display unit (images/min: x 60)
        print(f"### {plan}: predicted {k * r['predicted_output_per_s']:,.0f} {meta['display_unit']} ({pred_step:.2f} "
              f"ms/step), measured {k * r['output_per_s']:,.0f} (measured / predicted "
              f"{r['output_per_s'] / r['predicted_output_per_s']:.2f})\n")
        print("Model:\n")
        print("\n".join(model_table(meta, plan)))
        print("\nMeasured:\n")
        lines, s = measured_table(meta, plan, rows)
        print("\n".join(lines))
        kern = s["busy"].max()
        longest = max(s["longest"], kern)
        print(f"\nDecomposition of the measured step (ms per step): predicted {pred_step:.2f} = uncharged compute + "
              f"charge; measured {s['step']:.2f} = binding GPU's kernels {kern:.2f} + idle {s['step'] - kern:.2f}, of "
              f"which the longest program chain alone ({s['longest']:.2f}: its runs per step x its pipelined call) "
              f"accounts for {longest - kern:.2f} above the kernels and running the programs at once adds "
              f"{s['step'] - longest:.2f}.\n")
    bound = meta["zero_communication_bound_cycle_s"]
    frac = fractional_bound(meta)
    print("### Bound and the best single placement (model)\n")
    k, unit = meta.get("display_factor", 1.0), meta.get("display_unit", "output/s")
    print(f"| quantity | ms per step | {unit} | share of the recorded bound |\n| --- | --- | --- | --- |")
    for label, cyc in [("zero-communication bound (recorded)", bound),
                       ("fractional LP bound over the per-launch costs (no grouping, free cuts)", frac)] + \
            [(f"{n}: model's prediction ({'charged' if n not in ('homo-L', 'homo-R', 'request-dist', 'pd') else 'no cuts'})",
              meta["plans"][n]["cycle_seconds"]) for n in ("tessera-single", "tessera", "request-dist", "layer", "pd",
                                                            "homo-L") if n in meta["plans"]]:
        print(f"| {label} | {1e3 * cyc:.2f} | {k * ops / cyc:,.0f} | {100 * bound / cyc:.1f} % |")
    for n in ("tessera-single", "layer"):
        if n in meta["plans"]:
            from fit_hop_overhead import uncharged_cycle
            u = uncharged_cycle(meta, n)
            print(f"| {n} placement without the charge (uncharged model) | {1e3 * u:.2f} | {k * ops / u:,.0f} | "
                  f"{100 * bound / u:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
