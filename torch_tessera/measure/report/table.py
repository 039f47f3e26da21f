"""``tessera report table``: a Markdown table of measured runs, with the targets checked.

One row per run: model, profile (the ``--devices`` string), every plan's throughput in the run's display unit
(tok/s, images/min), the zero-communication bound, tessera's share of it, tessera's ratio to each baseline, and
whether the targets are met:

* tessera >= 95 % of the zero-communication bound;
* tessera ahead of every baseline that applies;
* for every baseline the bound beats by >= 1.3x, tessera >= 1.3x that baseline.

A run on CPU virtual devices is marked: its timings test the plumbing only. A plan whose result differed from eager is
marked ``DIFF`` and fails the targets.
"""

from __future__ import annotations

import math

#: Target share of the zero-communication bound, and the speed-up owed where the bound allows it.
BOUND_SHARE, SPEEDUP, ROOM = 0.95, 1.3, 1.3

#: A ``--streams`` run's single placement (``torch_tessera.benchmark.SINGLE``): shown as a column, not compared as a
#: baseline.
SINGLE = "tessera-single"


def _num(x: float) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def targets(rows: dict[str, dict], bound: float) -> str:
    """``"yes"``, or ``"no: "`` and every target missed (see the module docstring).

    Args:
        rows: plan name -> its measured row (``applies``, ``output_per_s`` in outputs per second, ``equal``).
        bound: the zero-communication bound, outputs per second.
    """
    t = rows.get("tessera")
    if t is None or not t["applies"]:
        return "no: tessera has no number"
    if t.get("equal") is False:
        return "no: tessera differs from eager"
    tp = t["output_per_s"]
    missed = []
    if not tp >= BOUND_SHARE * bound:
        missed.append(f"{100 * tp / bound:.1f} % of bound < {100 * BOUND_SHARE:.0f} %")
    for name, r in rows.items():
        if name in ("tessera", SINGLE) or not r["applies"]:  # tessera-single is tessera's own, not a baseline
            continue
        b = r["output_per_s"]
        if not tp > b:
            missed.append(f"behind {name} ({tp / b:.2f}x)")
        elif bound >= ROOM * b and tp < SPEEDUP * b:
            missed.append(f"{name}: bound {bound / b:.2f}x, tessera {tp / b:.2f}x < {SPEEDUP}x")
    return "yes" if not missed else "no: " + "; ".join(missed)


def single_placement(run: dict) -> dict:
    """``run`` with its single placement as ``tessera``: a ``--streams`` run's ``tessera-single`` row replaces its
    ``tessera`` row (the streams plan), to report the default planner (no change without one)."""
    rows = run["measured"]["rows"]
    single = [r for r in rows if r["plan"] == SINGLE]
    if not single:
        return run
    rows = [dict(single[0], plan="tessera") if r["plan"] == "tessera" else r for r in rows
            if r["plan"] != SINGLE]
    return {**run, "measured": {**run["measured"], "rows": rows}}


def table(runs: list[dict]) -> str:
    """The Markdown table of ``runs`` (loaded ``bench.json`` contents); plans in the first run's order."""
    plans: list[str] = []
    for run in runs:
        for r in run["measured"]["rows"]:
            if r["plan"] not in plans:
                plans.append(r["plan"])
    baselines = [p for p in plans if p not in ("tessera", SINGLE)]
    head = ["model", "profile", "unit", *plans, "bound", "tessera % of bound", "tessera vs baselines", "target met?"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for run in runs:
        meta = run["measured"]["meta"]
        rows = {r["plan"]: r for r in run["measured"]["rows"]}
        k = meta.get("display_factor", 1.0)
        bound = meta["zero_communication_bound_output_per_s"]
        layers = "" if meta.get("layers") is None else f", {meta['layers']} layers"
        model = f"{meta['model']} ({meta['size']}{layers})"
        profile = str(run.get("devices", ",".join(meta["devices"])))
        if not meta.get("timings_meaningful", True):
            profile += " (CPU: plumbing only)"
        cells = []
        for p in plans:
            r = rows.get(p)
            if r is None or not r["applies"]:
                cells.append("n/a")
                continue
            mark = " DIFF" if r.get("equal") is False else (" (derived)" if r["how"].startswith("derived") else "")
            cells.append(_num(k * r["output_per_s"]) + mark)
        t = rows.get("tessera", {})
        tp = t.get("output_per_s", math.nan) if t.get("applies") else math.nan
        ratios = ", ".join(f"{p} {tp / rows[p]['output_per_s']:.2f}x" for p in baselines
                           if p in rows and rows[p]["applies"] and rows[p]["output_per_s"] > 0)
        share = f"{100 * tp / bound:.1f} %" if tp == tp and bound > 0 else "-"
        lines.append("| " + " | ".join([model, profile, meta.get("display_unit", "tok/s"), *cells, _num(k * bound),
                                          share, ratios or "-", targets(rows, bound)]) + " |")
    return "\n".join(lines)
