"""Executed against simulated for every plan of a session-14 ``gpu_cut_diagnose`` run, under each model of the
captured step (NOTES.md, "The model"), from the saved files only (no GPU).

    python docs/results/2026-12-02-s14-mambasim/analyze.py DIR [DIR ...]   # each holding cut_diagnose.json

Models of one captured call (one replay: every micro-batch once):

* ``raw``: the schedule simulated with the event-pair costs taken whole (the bench's ``simulated_s``, session 13's);
* ``overlap``: the same with the graph overlap (``scheduler.issue.GraphIssue``, 2.76 us per launch after a launch);
* ``plain``: the costs calibrated to each device's plain program graph, measured in the same run;
* ``overlap+call`` / ``plain+call``: those plus the call's work outside its graph: ``call_s`` (one constant, the
  median over every plan of the run of host wall minus graph replay minus the output clones; host prelude, input
  copies, the host's wake-up) and the output clones (``2 x output bytes x micro-batches / the home device's DRAM
  bandwidth``, read and written once each).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def clone_seconds(m: dict, micro_batches: int) -> float | None:
    """Seconds the call's output clones take on the home device (read + write at its DRAM bandwidth)."""
    nbytes = m.get("output_bytes")
    if nbytes is None:
        return None
    bw = m["sim_inputs"]["memory"]["device_bandwidth"][0]
    return 2.0 * nbytes * micro_batches / bw


def rows(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        res = json.loads((p / "cut_diagnose.json").read_text())
        M = res["micro_batches"]
        for name, m in res["models"].items():
            for plan, r in m.get("plans", {}).items():
                if "error" in r:
                    continue
                sec = r["seconds"]
                out.append({"model": name, "plan": plan, "host": sec.get("executed"),
                            "issue": sec.get("host-issue:executed"), "device": sec.get("device:executed"),
                            "graph": sec.get("device:executed@graph"),
                            "plain": max([v for k, v in sec.items() if k.startswith("device:plain-")], default=None),
                            "alone_graph": max([v for k, v in sec.items() if k.startswith("device:alone-")
                                                and k.endswith("@graph")], default=None),
                            "raw": r.get("simulated_s"), "overlap": r.get("simulated_overlap_s"),
                            "cal": r.get("simulated_plain_s"), "median": r.get("simulated_pair_median_s"),
                            "between": r.get("simulated_between_median_s"), "clone": clone_seconds(m, M)})
    return out


def main(argv: list[str]) -> int:
    data = rows([Path(a) for a in argv])
    outside = [r["host"] - r["graph"] - (r["clone"] or 0.0) for r in data if r["host"] and r["graph"]]
    call = statistics.median(outside) if outside else None
    print(f"call_s (median host - graph - clones over {len(outside)} plans): "
          f"{'-' if call is None else f'{call * 1e3:.3f} ms'}; per plan: "
          + ", ".join(f"{x * 1e3:.3f}" for x in outside))
    ms = lambda x: "-" if x is None else f"{x * 1e3:.3f}"  # noqa: E731
    models = {"raw": lambda r: r["raw"], "overlap": lambda r: r["overlap"], "plain": lambda r: r["cal"],
              "overlap+call": lambda r: None if call is None or r["overlap"] is None else
              r["overlap"] + call + (r["clone"] or 0.0),
              "plain+call": lambda r: None if call is None or r["cal"] is None else r["cal"] + call + (r["clone"] or 0.0)}
    print("\n| model | plan | host ms | host issue ms | device ms | graph ms | alone graph ms | plain ms | clones ms | "
          + " | ".join(f"{k} ms | host / {k}" for k in models) + " |")
    print("| --- | --- |" + " ---: |" * (7 + 2 * len(models)))
    within = {k: [0, 0] for k in models}
    for r in data:
        cells = []
        for k, f in models.items():
            s = f(r)
            ratio = None if s is None or r["host"] is None else r["host"] / s
            if ratio is not None:
                within[k][0] += abs(ratio - 1) <= 0.05
                within[k][1] += 1
            cells += [ms(s), "-" if ratio is None else f"{ratio:.3f}"]
        print(f"| {r['model']} | {r['plan']} | {ms(r['host'])} | {ms(r['issue'])} | {ms(r['device'])} | "
              f"{ms(r['graph'])} | {ms(r['alone_graph'])} | {ms(r['plain'])} | {ms(r['clone'])} | "
              + " | ".join(cells) + " |")
    print("\nwithin 5 %: " + ", ".join(f"{k} {a} of {n}" for k, (a, n) in within.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
