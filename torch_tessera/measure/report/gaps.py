"""``tessera report gaps``: where a measured plan's step time goes against its model, per device and per program.

For one run that saved per-launch costs (``kernel_seconds``) and placements, and each plan named, Markdown:

1. the MODEL's step: per device, per program, the calibrated kernel seconds placed there, the per-hop charge
   ``h x cuts`` and the exposed copy time ``phi x bytes / bandwidth``, and the link load;
2. the MEASURED step: per program one call's kernel and copy time per GPU (``device_busy``), the pipelined calls
   (``pipelined_busy``: ``micro_batches`` calls in flight), serial / pipelined call times and the concurrent step,
   decomposed as: binding GPU's kernel time -> + idle inside the pipelined program chains -> + the programs
   contending when run at once;
3. the bound: the zero-communication bound recorded by the bench, the fractional lower bound over the per-launch
   costs (every launch split freely between the devices, no grouping, no cut costs), and what the model predicts for
   the best single placement under the charge (``tessera-single``, 1 micro-batch), ``request-dist`` and the streams
   plan.

Two-device runs only (the saved runs are GPU pairs).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.measure.report import load_run

#: Bytes per second of the link in the copy columns: the planner's NVLink figure (``target.links``, "nvlink4").
LINK_BW = 450e9 * 0.875

#: Plans reported when none is named.
DEFAULT_PLANS = ("tessera-single", "layer")

#: Fields of ``measured.meta`` this report reads.
NEEDED = ("kernel_seconds", "plans", "runs", "programs", "output_per_step", "hop_overhead_s", "copy_exposure")


def uncharged_cycle(meta: dict, plan: str) -> float | None:
    """Seconds per workload step of ``plan`` under the model WITHOUT the per-hop charge.

    The busier device's load ``sum_p f_p x sum of the per-launch costs placed on it`` (``meta["kernel_seconds"]``,
    calibrated); link loads are left out. None when the run saved no per-launch costs or no such plan.
    """
    ks, pl = meta.get("kernel_seconds"), meta.get("plans", {}).get(plan)
    if not ks or not pl:
        return None
    loads = np.zeros(len(meta["devices"]))
    for prog, place in pl["placements"].items():
        cost, where = np.asarray(ks[prog.split("@")[0]]), np.asarray(place)
        for d in range(len(loads)):
            loads[d] += pl["frequencies"][prog] * cost[d][where == d].sum()
    return float(loads.max())


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
    """The model's step of ``plan`` per program and device, as Markdown lines."""
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


def measured_table(meta: dict, plan: str, rows_by_plan: dict) -> tuple[list[str], dict]:
    """The measured step of ``plan`` per program and GPU as Markdown lines, and its totals (milliseconds)."""
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


def _check(path: str | Path, meta: dict, rows: dict, plans: tuple[str, ...]) -> None:
    missing = [k for k in NEEDED if k not in meta]
    if missing:
        raise ConfigError(f"{path}: the run saved no {', '.join(missing)} (a run older than the per-launch costs); "
                          f"`tessera report gaps` needs a run that saved them")
    if len(meta["devices"]) != 2:
        raise ConfigError(f"{path}: {len(meta['devices'])} devices; the gap breakdown reads two-device runs only")
    unknown = [p for p in plans if p not in rows or p not in meta["plans"] or p not in meta["runs"]]
    if unknown:
        known = [p for p in rows if p in meta["plans"] and p in meta["runs"]]
        raise ConfigError(f"{path}: no executed plan {', '.join(unknown)}; plans of this run: {', '.join(known)}")


def report(path: str | Path, plans: tuple[str, ...] = DEFAULT_PLANS) -> list[str]:
    """Markdown lines of the gap breakdown of ``plans`` in the run at ``path`` (see the module docstring).

    Raises:
        ConfigError: not a measured bench output, a run without per-launch costs, or a plan it did not execute.
    """
    data = load_run(path)
    meta, rows = data["measured"]["meta"], {r["plan"]: r for r in data["measured"]["rows"]}
    _check(path, meta, rows, plans)
    out: list[str] = []
    for plan in plans:
        out += _plan_section(meta, rows, plan)
    out += _bound_section(meta)
    return out


def _plan_section(meta: dict, rows: dict, plan: str) -> list[str]:
    r, ops = rows[plan], meta["output_per_step"]
    pred_step = ops / r["predicted_output_per_s"] * 1e3
    k = meta.get("display_factor", 1.0)  # output/s -> the display unit (images/min: x 60)
    out = [f"### {plan}: predicted {k * r['predicted_output_per_s']:,.0f} {meta['display_unit']} ({pred_step:.2f} "
           f"ms/step), measured {k * r['output_per_s']:,.0f} (measured / predicted "
           f"{r['output_per_s'] / r['predicted_output_per_s']:.2f})\n", "Model:\n", "\n".join(model_table(meta, plan)),
           "\nMeasured:\n"]
    lines, s = measured_table(meta, plan, rows)
    out.append("\n".join(lines))
    kern = s["busy"].max()
    longest = max(s["longest"], kern)
    out.append(f"\nDecomposition of the measured step (ms per step): predicted {pred_step:.2f} = uncharged compute + "
               f"charge; measured {s['step']:.2f} = binding GPU's kernels {kern:.2f} + idle {s['step'] - kern:.2f}, of "
               f"which the longest program chain alone ({s['longest']:.2f}: its runs per step x its pipelined call) "
               f"accounts for {longest - kern:.2f} above the kernels and running the programs at once adds "
               f"{s['step'] - longest:.2f}.\n")
    return out


def _bound_section(meta: dict) -> list[str]:
    ops, bound, frac = meta["output_per_step"], meta["zero_communication_bound_cycle_s"], fractional_bound(meta)
    k, unit = meta.get("display_factor", 1.0), meta.get("display_unit", "output/s")
    out = ["### Bound and the best single placement (model)\n",
           f"| quantity | ms per step | {unit} | share of the recorded bound |\n| --- | --- | --- | --- |"]
    uncut = ("homo-L", "homo-R", "request-dist", "pd")
    for label, cyc in [("zero-communication bound (recorded)", bound),
                       ("fractional LP bound over the per-launch costs (no grouping, free cuts)", frac)] + \
            [(f"{n}: model's prediction ({'charged' if n not in uncut else 'no cuts'})", meta["plans"][n]["cycle_seconds"])
             for n in ("tessera-single", "tessera", "request-dist", "layer", "pd", "homo-L") if n in meta["plans"]]:
        out.append(f"| {label} | {1e3 * cyc:.2f} | {k * ops / cyc:,.0f} | {100 * bound / cyc:.1f} % |")
    for n in ("tessera-single", "layer"):
        if n in meta["plans"]:
            u = uncharged_cycle(meta, n)
            out.append(f"| {n} placement without the charge (uncharged model) | {1e3 * u:.2f} | {k * ops / u:,.0f} | "
                       f"{100 * bound / u:.1f} % |")
    return out
