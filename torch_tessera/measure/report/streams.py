"""``tessera report streams``: how the request-stream plans of measured runs executed.

Per run (runs that record ``concurrent_threads``), Markdown:

1. request-dist (executed) against the sum of the homo-* runs timed alone, tessera against request-dist, whether the
   two have the same placement, and the homo-R call (median seconds, bytes copied per call by purpose, kernel and
   copy milliseconds per GPU of one profiled call);
2. per streams plan (``request-dist``, and ``tessera`` when it is one): per program its runs per workload step, the
   calls its thread made in the concurrent timing, the seconds until that thread's work had finished, seconds per
   call there and alone (``seconds``), and the plan's modelled cycle against the measured concurrent step.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch_tessera.measure.report import load_run


def report(path: str | Path) -> list[str]:
    """Markdown lines for the run at ``path`` (a ``bench.json`` or its directory).

    Raises:
        ConfigError: not a measured bench output.
        KeyError: the run lacks a field this report reads (a run older than the request streams).
    """
    m = load_run(path)["measured"]
    meta, rows = m["meta"], {r["plan"]: r for r in m["rows"]}
    k, unit = meta.get("display_factor", 1.0), meta.get("display_unit", "output/s")
    out = [f"## {path}: {meta['model']} on {', '.join(meta['devices'])}", ""]
    rd, t = rows.get("request-dist", {}), rows.get("tessera", {})
    homo_sum = rd.get("derived_output_per_s", float("nan"))
    executed = bool(rd.get("applies")) and not rd["how"].startswith("derived")
    if executed:
        out.append(f"- request-dist {k * rd['output_per_s']:,.1f} {unit} ({rd['how'].split(' (')[0]}); the homo-* runs "
                   f"alone sum to {k * homo_sum:,.1f}: ratio {rd['output_per_s'] / homo_sum:.3f}")
    elif rd.get("applies"):
        out.append(f"- request-dist {k * rd['output_per_s']:,.1f} {unit} ({rd['how']})")
    if t.get("applies") and rd.get("applies"):
        same = meta["plans"]["tessera"]["placements"] == meta["plans"]["request-dist"]["placements"]
        out.append(f"- tessera {k * t['output_per_s']:,.1f} {unit}, {t['output_per_s'] / rd['output_per_s']:.3f}x "
                   f"request-dist" + (f"; same placement as request-dist: {same}" if executed else ""))
    h = meta["runs"].get("homo-R", {})
    if "seconds" in h:
        calls = ", ".join(f"{n} {1e3 * s:.2f} ms" for n, s in h["seconds"].items())
        busy = {n: {g: v for g, v in b.items() if g.startswith("gpu")} for n, b in h.get("device_busy", {}).items()}
        out.append(f"- homo-R: call {calls}; bytes per call {h.get('bytes_per_call')}; one profiled call "
                   f"{json.dumps(busy)}")
    for name in ("request-dist", "tessera"):
        out += _threads(name, meta)
    return out + [""]


def _threads(name: str, meta: dict) -> list[str]:
    """The per-program table of streams plan ``name`` timed at once (no lines when it was not)."""
    r, plan = meta["runs"].get(name, {}), meta["plans"].get(name, {})
    threads = r.get("concurrent_threads")
    if not threads:
        return []
    freq = plan["frequencies"]
    out = ["", f"{name}: modelled cycle {1e3 * plan['cycle_seconds']:.3f} ms/step, measured concurrent step "
           f"{1e3 * r['concurrent_step_seconds']:.3f} ms/step", "",
           "| program | runs/step | calls | thread s | ms per call at once | ms per call alone |",
           "| --- | --- | --- | --- | --- | --- |"]
    for prog, th in threads.items():
        out.append(f"| {prog} | {freq[prog]:.3f} | {th['calls']} | {th['seconds']:.4f} | "
                   f"{1e3 * th['seconds'] / th['calls']:.2f} | {1e3 * r['seconds'][prog]:.2f} |")
    return out
