"""``tessera report step-model``: the measured bench's step model against saved runs.

1. **Fill/drain.** For every executed plan of a run that saved per-launch costs (``kernel_seconds``) and placements,
   the predicted step (the plan's recorded ``cycle_seconds``: cycle model with the per-hop charge) with and without
   :func:`torch_tessera.scheduler.evaluate.fill_drain_seconds` (``M`` = the run's ``micro_batches``) against the
   measured step (``output_per_step / output_per_s``): mean |predicted / measured throughput - 1| per results
   directory, over all plans and over plans with a program spanning both GPUs. Then, per run, the placement
   :func:`torch_tessera.measure.execute.step_score` (cycle + fill/drain) ranks best among the executed planner's and
   homo-*/af/layer placements, its measured step, and the fastest measured of them.
2. **Concurrent call counts.** For request-streams plans timed with their programs at once, each thread's calls at
   their measured serial call time alone, with the counts of the earlier timing (``round(frequency x 8)``) and of
   :func:`torch_tessera.measure.execute.concurrent_counts`, against the measured concurrent step.

Streams plans (programs ``<name>@<r>``) are left out of the first check: they are timed with their threads at once.
Runs are grouped by their results directory: the nearest enclosing directory whose name starts with a date
(``YYYY-MM-DD...``), else the directory given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from torch_tessera.errors import ConfigError
from torch_tessera.measure.execute import MIN_CONCURRENT_CALLS, TAKEOVER_BASELINES, concurrent_counts
from torch_tessera.measure.report import with_nan
from torch_tessera.scheduler.evaluate import fill_drain_seconds
from torch_tessera.target.costs import CostTable

_DATED = re.compile(r"\d{4}-\d{2}-\d{2}")


def workload(meta: dict) -> SimpleNamespace:
    """The saved per-launch costs as the workload :func:`fill_drain_seconds` reads (programs with costs)."""
    progs = []
    for name, per_device in meta["kernel_seconds"].items():
        secs = np.asarray(per_device, dtype=float).T  # saved [device][launch]
        costs = CostTable(tuple(meta["devices"]), tuple(range(secs.shape[0])), secs)
        progs.append(SimpleNamespace(name=name, costs=costs, frequency=meta["programs"][name]["frequency"]))
    return SimpleNamespace(programs=tuple(progs))


def plan_of(meta: dict, name: str) -> SimpleNamespace:
    """The saved plan ``name`` as the plan :func:`fill_drain_seconds` reads."""
    p = meta["plans"][name]
    return SimpleNamespace(placements={pr: dict(enumerate(pl)) for pr, pl in p["placements"].items()},
                           frequencies=p.get("frequencies") or {}, cycle_seconds=p["cycle_seconds"])


def _shown(p: Path) -> str:
    """``p`` relative to the working directory when it lies below it, else as given."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _group(f: Path, given: Path) -> str:
    for d in f.resolve().parents:
        if _DATED.match(d.name):
            return d.name
    return (given if given.is_dir() else given.parent).resolve().name


def records(paths: list[Path]) -> list[dict]:
    """One record per executed plan of every run under ``paths`` that saved per-launch costs and plans.

    Raises:
        ConfigError: a path that does not exist.
    """
    found = []
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p}: no such file or directory (pass bench.json files or directories holding them)")
        found += [(f, p) for f in (p.rglob("bench.json") if p.is_dir() else [p])]
    out = []
    for f, given in sorted(found):
        measured = with_nan(json.loads(f.read_text())).get("measured", {})
        meta = measured.get("meta", {})
        if "kernel_seconds" not in meta or "plans" not in meta:
            continue
        wl, m = workload(meta), max(1, int(meta.get("micro_batches") or 1))
        for r in measured["rows"]:
            if not r["applies"] or not r["how"].startswith("run") or r["plan"] not in meta["plans"]:
                continue
            p = plan_of(meta, r["plan"])
            out.append(dict(set=_group(f, given), run=_shown(f.parent), plan=r["plan"],
                            streams=any("@" in n for n in p.placements), how=r["how"],
                            measured=meta["output_per_step"] / r["output_per_s"], cycle=p.cycle_seconds,
                            fill=fill_drain_seconds(p, wl, m), plan_obj=p, meta=meta, row=r))
    return out


def error_table(recs: list[dict]) -> str:
    """Mean |predicted / measured - 1| per results directory, with and without the fill/drain term (Markdown)."""
    lines = ["| results | plans | mean error, cycle | with fill/drain | spanning plans | mean error, cycle | "
             "with fill/drain | signed, with |", "|" + " --- |" * 8]
    for s in sorted({r["set"] for r in recs}):
        rs = [r for r in recs if r["set"] == s and not r["streams"]]
        span = [r for r in rs if r["fill"] > 0]

        def mean_abs(group: list[dict], fill: bool) -> float:
            return 100 * float(np.mean([abs(r["measured"] / (r["cycle"] + (r["fill"] if fill else 0)) - 1)
                                        for r in group])) if group else float("nan")

        signed = 100 * float(np.mean([r["measured"] / (r["cycle"] + r["fill"]) - 1 for r in span])) if span else 0
        lines.append(f"| {s} | {len(rs)} | {mean_abs(rs, False):.1f} % | {mean_abs(rs, True):.1f} % | {len(span)} | "
                     f"{mean_abs(span, False):.1f} % | {mean_abs(span, True):.1f} % | {signed:+.1f} % |")
    return "\n".join(lines)


def choice_table(recs: list[dict]) -> str:
    """Per run, the placement cycle + fill/drain takes as tessera against the fastest measured one (Markdown)."""
    lines = ["| run | planner's placement, measured ms/step | taken by cycle + fill/drain | its measured ms/step | "
             "fastest measured candidate |", "|" + " --- |" * 5]
    for run in sorted({r["run"] for r in recs}):
        rs = [r for r in recs if r["run"] == run and not r["streams"]]
        own = [r for r in rs if r["plan"] == "tessera-single"] or [r for r in rs if r["plan"] == "tessera"]
        if not own:
            continue
        cands = own[:1] + [r for r in rs if r["plan"].startswith(TAKEOVER_BASELINES)]
        taken = min(cands, key=lambda r: (r["cycle"] + r["fill"], r is not own[0]))
        fastest = min(cands, key=lambda r: r["measured"])
        lines.append(f"| {run} | {own[0]['plan']} {1e3 * own[0]['measured']:.2f} | {taken['plan']} | "
                     f"{1e3 * taken['measured']:.2f} | {fastest['plan']} {1e3 * fastest['measured']:.2f} |")
    return "\n".join(lines)


def counts_table(recs: list[dict]) -> str:
    """Per concurrently timed streams plan, the step its call counts cover, earlier counts and current (Markdown)."""
    lines = ["| run | frequencies | calls, old | alone, old, ms/step | calls, now | alone, now, ms/step | "
             "measured, ms/step |", "|" + " --- |" * 7]
    for r in recs:
        if not r["streams"] or "concurrent" not in r["how"]:
            continue
        freq = {n: float(f) for n, f in r["plan_obj"].frequencies.items()}
        secs = r["row"]["seconds"]
        cells = []
        for counts in (concurrent_counts(freq, 8), concurrent_counts(freq, 8, MIN_CONCURRENT_CALLS)):
            steps = min(counts[n] / freq[n] for n in freq)
            cells += [str(counts), f"{1e3 * max(counts[n] * secs[n] for n in freq) / steps:.2f}"]
        conc = r["meta"]["runs"][r["plan"]]["concurrent_step_seconds"]
        lines.append(f"| {r['run']} | { {n: round(f, 3) for n, f in freq.items()} } | " + " | ".join(cells)
                     + f" | {1e3 * conc:.2f} |")
    return "\n".join(lines)


def report(paths: list[Path]) -> list[str]:
    """The three tables over every run under ``paths`` (Markdown lines).

    Raises:
        ConfigError: a path that does not exist.
    """
    recs = records(paths)
    return ["Fill/drain: mean |predicted / measured throughput - 1|\n\n" + error_table(recs),
            "\nThe placement taken as tessera\n\n" + choice_table(recs),
            "\nConcurrent call counts (request-streams plans)\n\n" + counts_table(recs)]
