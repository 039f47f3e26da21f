"""A markdown table of measured ``tessera bench --measure`` runs, with the issue's targets checked.

Usage: ``python bench/readme_table.py OUT_DIR_OR_JSON [...]`` (each ``--out DIR`` of the measured bench holds a
``bench.json``). One row per run: model, profile (the ``--devices`` string), every plan's throughput in the run's
display unit (tok/s, images/min), the zero-communication bound, tessera's share of it, tessera's ratio to each
baseline, and whether the targets are met:

* tessera >= 95 % of the zero-communication bound;
* tessera ahead of every baseline that applies;
* for every baseline the bound beats by >= 1.3x, tessera >= 1.3x that baseline.

A run on CPU virtual devices is marked: its timings test the plumbing only. A plan whose result differed from eager is
marked ``DIFF`` and fails the targets. Only reads JSON: no torch needed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

#: Target share of the zero-communication bound, and the speed-up owed where the bound allows it.
BOUND_SHARE, SPEEDUP, ROOM = 0.95, 1.3, 1.3

#: A ``--streams`` run's single placement (``torch_tessera.benchmark.SINGLE``; this script reads JSON only): shown as
#: a column, not compared as a baseline
SINGLE = "tessera-single"


def load(path: str) -> dict:
    """One measured run: ``bench.json`` itself or the ``--out`` directory holding it.

    Raises:
        ValueError: the file is not a measured bench's output.
    """
    p = Path(path)
    p = p / "bench.json" if p.is_dir() else p
    data = json.loads(p.read_text())
    if "measured" not in data:
        raise ValueError(f"{p}: no 'measured' section (not a `tessera bench --measure` output)")
    return data


def _num(x: float) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def targets(rows: dict[str, dict], bound: float) -> str:
    """``"yes"``, or ``"no: "`` and every target missed (see the module docstring)."""
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
    ``tessera`` row (the streams plan), as the README's table reports the default planner (no change without one)."""
    rows = run["measured"]["rows"]
    single = [r for r in rows if r["plan"] == SINGLE]
    if not single:
        return run
    rows = [dict(single[0], plan="tessera") if r["plan"] == "tessera" else r for r in rows
            if r["plan"] != SINGLE]
    return {**run, "measured": {**run["measured"], "rows": rows}}


def table(runs: list[dict]) -> str:
    """The markdown table of ``runs`` (loaded ``bench.json`` contents); plans in the first run's order."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="--out directories of `tessera bench --measure`, or their bench.json")
    parser.add_argument("--single", action="store_true",
                        help="report each run's single placement (tessera-single) as tessera, as the README does")
    args = parser.parse_args(argv)
    try:
        runs = [load(p) for p in args.runs]
        if args.single:
            runs = [single_placement(r) for r in runs]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
