"""How the request-stream plans of measured bench runs executed (issue 9): per run, each executed streams plan's
threads against their calls timed alone, and what the homo-R run copied per call.

For every ``bench.json`` of ``tessera bench --measure`` given (runs of 2026-11-30 session 8 on: they record
``concurrent_threads``), prints (Markdown):

1. per run: request-dist (executed) against the sum of the homo-* runs timed alone, tessera against request-dist,
   whether the two have the same placement, and the homo-R call (median seconds, bytes copied per call by purpose,
   kernel and copy milliseconds per GPU of one profiled call);
2. per streams plan (``request-dist``, and ``tessera`` when it is one): per program its runs per workload step, the
   calls its thread made in the concurrent timing, the seconds until that thread's work had finished, seconds per
   call there and alone (``seconds``), and the plan's modelled cycle against the measured concurrent step.

Usage: ``python bench/streams_report.py BENCH_JSON_OR_DIR [...]``. Reads JSON only (no torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: str) -> dict:
    """The ``measured`` section of a bench.json (or of the one in directory ``path``)."""
    p = Path(path)
    p = p / "bench.json" if p.is_dir() else p
    return json.loads(p.read_text())["measured"]


def report(path: str) -> list[str]:
    """Markdown lines for one run (see the module docstring)."""
    m = load(path)
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
        r, plan = meta["runs"].get(name, {}), meta["plans"].get(name, {})
        threads = r.get("concurrent_threads")
        if not threads:
            continue
        freq = plan["frequencies"]
        out += ["", f"{name}: modelled cycle {1e3 * plan['cycle_seconds']:.3f} ms/step, measured concurrent step "
                f"{1e3 * r['concurrent_step_seconds']:.3f} ms/step", "",
                "| program | runs/step | calls | thread s | ms per call at once | ms per call alone |",
                "| --- | --- | --- | --- | --- | --- |"]
        for prog, th in threads.items():
            out.append(f"| {prog} | {freq[prog]:.3f} | {th['calls']} | {th['seconds']:.4f} | "
                       f"{1e3 * th['seconds'] / th['calls']:.2f} | {1e3 * r['seconds'][prog]:.2f} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="bench.json files or --out directories")
    args = ap.parse_args(argv)
    rc = 0
    for path in args.runs:  # one unreadable run does not hide the others
        try:
            print("\n".join(report(path)))
        except (OSError, KeyError, ValueError) as e:
            print(f"error: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
