"""Fit the throughput model's per-hop charge to the measured ``tessera bench --measure`` runs (issue 9).

Reads every ``bench.json`` given (default: ``docs/results/2026-11-29-s3`` and ``-s4``, two H200s, GPU 1 restricted
to 24 or 72 SMs) and, for every plan that was EXECUTED, compares the measured time of one workload step with the
plan's predicted cycle time (the model over the measured, calibrated costs, as the bench printed it).

Model fitted (seconds per workload step; ``f_p`` runs of program ``p`` per step):

    S_measured ~= S_predicted + h x C + phi x X + kappa x N
    C = sum_p f_p x cuts_p,   X = sum_p f_p x cut_bytes_p / link bandwidth,   N = sum_p f_p

``h``: seconds each cut edge costs per program run, charged on the timelines of both devices it joins (on two
devices every cut edge has one end on each, so it adds ``h x C`` to the busier device's load, hence to the cycle);
``phi``: the share of each copy's link time that also lands on both devices (copies the runtime does not overlap);
``kappa``: seconds per program call whatever the placement (host side, graph launch, the caller's input and output
copies), which no placement changes, so the planner leaves it out. ``h`` and ``phi`` go into the planner
(:data:`torch_tessera.target.links.HOP_FIGURES`). Least squares on RELATIVE errors (step times range from 1.7 ms
to 75 ms), over the session-4 runs (``s4/``: every plan's state kept on its owner, as the model assumes); session 3
(``s3/``: every call copied whole KV caches in and out, a cost since removed from the runtime) is shown, not fitted.

``cuts_p``: runs since issue 9 record each plan's cut edges per program (``plans.<name>.cut_edges``); the runs of
2026-11-29 record the cut edges of all programs summed (``cut_edges``). Per program they are split in
proportion to the placement's device switches in program order where the plan's placements were saved (session 4
runs c-e); where they were not, baselines whose programs share one pattern (``af``, ``layer`` on the LLM: the same
placement in prefill and decode) split evenly, and tessera takes the split of a tessera plan of the same model whose
placements were saved (marked ``~`` in the table). ``dit`` has one program: exact. ``cut_bytes_p``: the bytes the
executor copied for cut edges in one call (``runs.<name>.bytes_per_call``, session 4).

Runs that already planned WITH the charge (session 5 calls C, D: ``hop_overhead_s`` in the meta) are fitted against
their UNCHARGED prediction, recomputed from the saved per-launch costs and placements (:func:`uncharged_cycle`);
request-streams plans (programs ``<name>@<r>``) are shown, not fitted. Model variants beyond these three terms, with
held-out checks: ``docs/results/2026-11-30-s6-fit/scripts/refit_hop_model.py``.

Usage: ``python bench/fit_hop_overhead.py [BENCH_JSON_OR_DIR ...]``. Only reads JSON (numpy for the fit).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch_tessera.measure.report.gaps import uncharged_cycle

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [ROOT / "docs/results/2026-11-29-s3", ROOT / "docs/results/2026-11-29-s4"]

#: The H200 pair's NVLink as the planner models it (``target.links.LINK_FIGURES["nvlink4"]``: 450 GB/s x 0.875).
LINK_BW = 450e9 * 0.875


@dataclass
class Record:
    run: str  # results directory, e.g. "2026-11-29-s4/e/l24"
    model: str
    profile: str  # "24sm" / "72sm"
    plan: str
    how: str
    equal: bool | None
    freq: dict  # program -> runs per workload step
    cuts: dict  # program -> cut edges per run (estimated split of the recorded total unless split_exact)
    split_exact: bool
    cut_bytes: dict | None  # program -> bytes copied for cut edges per run (None: not recorded)
    out_per_step: float
    predicted: float  # output units / s, the bench's model WITHOUT the per-hop charge (see ``uncharged_cycle``)
    measured: float  # output units / s, best of serial / pipelined / concurrent
    streams: bool = False  # a request-streams plan (programs ``<name>@<r>``): not fitted (frequencies differ)
    predicted_charged: float | None = None  # the bench's own prediction when it already carried a per-hop charge

    @property
    def fitted(self) -> bool:
        """Whether the record is in the fit (state on its owner, bytes recorded, not a streams plan)."""
        return self.cut_bytes is not None and not self.streams

    @property
    def n_calls(self) -> float:
        return float(sum(self.freq.values()))

    @property
    def c(self) -> float:
        return float(sum(self.freq[p] * self.cuts.get(p, 0.0) for p in self.freq))

    @property
    def x(self) -> float:
        """Seconds of cut-edge copies per step at the link's modelled bandwidth."""
        return float(sum(self.freq[p] * (self.cut_bytes or {}).get(p, 0.0) for p in self.freq)) / LINK_BW

    @property
    def s_pred(self) -> float:
        return self.out_per_step / self.predicted

    @property
    def s_meas(self) -> float:
        return self.out_per_step / self.measured


def _switches(placement) -> int:
    v = [placement[str(i)] for i in range(len(placement))] if isinstance(placement, dict) else list(placement)
    return sum(1 for a, b in zip(v, v[1:]) if a != b)


def _split(r: dict, meta: dict, freq: dict, tessera_split: dict) -> tuple[dict, bool]:
    """Share of the recorded cut edges per program, and whether it is exact (see module docstring)."""
    plans = meta.get("plans", {})
    if "cut_edges" in plans.get(r["plan"], {}):  # runs since issue 9 record them per program
        cuts = {p: float(plans[r["plan"]]["cut_edges"].get(p, 0)) for p in freq}
        total = sum(cuts.values()) or 1.0
        return {p: cuts[p] / total for p in freq}, True
    if r["plan"] in plans:
        sw = {p: _switches(pl) for p, pl in plans[r["plan"]]["placements"].items()}
        tot = sum(sw.values())
        return {p: (sw[p] / tot if tot else 1 / len(sw)) for p in freq}, True
    if len(freq) == 1:
        return {p: 1.0 for p in freq}, True
    if r["plan"] == "tessera" and tessera_split.get(meta["model"]):
        splits = list(tessera_split[meta["model"]].values())
        return {p: float(np.mean([sp[p] for sp in splits])) for p in freq}, False
    same_pattern = r["plan"] in ("af", "layer") and meta["family"] == "llm"  # one pattern in both programs
    return {p: 1 / len(freq) for p in freq}, same_pattern


def load_records(paths: list[Path]) -> list[Record]:
    files = []
    for p in paths:
        files += sorted(p.rglob("bench.json")) if p.is_dir() else [p]
    raw, tessera_split = [], {}
    for f in files:
        data = json.loads(f.read_text())
        meta = data.get("measured", {}).get("meta", {})
        if "programs" not in meta:
            continue  # an early run without the per-program metadata
        raw.append((f, meta, data["measured"]["rows"]))
        if "tessera" in meta.get("plans", {}):
            sw = {p: _switches(pl) for p, pl in meta["plans"]["tessera"]["placements"].items()}
            tot = sum(sw.values()) or 1
            tessera_split.setdefault(meta["model"], {})[str(f)] = {p: v / tot for p, v in sw.items()}
    recs = []
    for f, meta, rows in raw:
        freq = {p: float(v["frequency"]) for p, v in meta["programs"].items()}
        for r in rows:
            if not r["applies"] or not r["how"].startswith("run"):
                continue
            share, exact = _split(r, meta, freq, tessera_split)
            total = int(r["cut_edges"])
            run_info = meta.get("runs", {}).get(r["plan"], {})
            nbytes = ({p: float(b.get("cut", 0)) for p, b in run_info["bytes_per_call"].items()}
                      if "bytes_per_call" in run_info else None)
            predicted, charged = float(r["predicted_output_per_s"]), None
            hop = np.asarray(meta.get("hop_overhead_s") or 0.0)
            base = uncharged_cycle(meta, r["plan"]) if hop.any() else None
            if base:
                predicted, charged = float(meta["output_per_step"]) / base, predicted
            streams = any("@" in p for p in meta.get("plans", {}).get(r["plan"], {}).get("placements", {}))
            recs.append(Record(run="/".join(f.parent.parts[-3:]), model=meta["model"],
                               profile=meta["devices"][1].split("@")[-1], plan=r["plan"], how=r["how"],
                               equal=r["equal"], freq=freq, cuts={p: total * share[p] for p in freq},
                               split_exact=exact or total == 0, cut_bytes=nbytes,
                               out_per_step=float(meta["output_per_step"]),
                               predicted=predicted, measured=float(r["output_per_s"]), streams=streams,
                               predicted_charged=charged))
    return recs


#: The fit's terms: name -> (column as seconds per step, unit label, scale for printing).
TERMS = {"h": (lambda r: r.c, "us per cut edge per run", 1e6), "phi": (lambda r: r.x, "of copy time", 1.0),
         "kappa": (lambda r: r.n_calls, "us per call", 1e6)}


def fit(recs: list[Record], terms: tuple[str, ...]) -> dict[str, float]:
    """Coefficients minimising the squared relative error of ``S_pred + sum_t coef_t x term_t`` against ``S_meas``."""
    y = np.array([(r.s_meas - r.s_pred) / r.s_meas for r in recs])
    a = np.array([[TERMS[t][0](r) / r.s_meas for t in terms] for r in recs])
    sol, *_ = np.linalg.lstsq(a, y, rcond=None)
    return dict(zip(terms, (float(v) for v in sol)))


def predicted_after(r: Record, coef: dict[str, float]) -> float:
    """Output per second under the model with the fitted terms added (missing terms count 0)."""
    return r.out_per_step / (r.s_pred + sum(c * TERMS[t][0](r) for t, c in coef.items()))


def describe(coef: dict[str, float]) -> str:
    return ", ".join(f"{t} = {c * TERMS[t][2]:.3g} {TERMS[t][1]}" for t, c in coef.items())


def errors(recs: list[Record], coef: dict[str, float]) -> str:
    e = np.array([predicted_after(r, coef) / r.measured - 1 for r in recs])
    return f"mean |error| {100 * np.abs(e).mean():.0f} %, worst {100 * e[np.argmax(np.abs(e))]:+.0f} %"


def _fmt(x: float, per_min: bool) -> str:
    return f"{x * 60:,.1f}" if per_min else f"{x:,.0f}"


def table(recs: list[Record], planner: dict[str, float], full: dict[str, float]) -> str:
    lines = ["| run | model | GPU1 | plan | cuts per run (prefill+decode) | predicted before | predicted after "
             "(planner: h, phi) | + kappa | measured | how | before / measured | after / measured | "
             "+ kappa / measured |", "| " + " | ".join(["---"] * 13) + " |"]
    for r in recs:
        per_min = r.model == "dit"
        a1, a2 = predicted_after(r, planner), predicted_after(r, full)
        cuts = "+".join(f"{r.cuts[p]:.0f}" for p in r.freq) + ("" if r.split_exact else " ~")
        plan = r.plan + (" (streams: not fitted, cuts/frequencies of one stream)" if r.streams else "")
        lines.append(f"| {r.run} | {r.model} | {r.profile} | {plan} | {cuts} | {_fmt(r.predicted, per_min)} | "
                     f"{_fmt(a1, per_min)} | {_fmt(a2, per_min)} | {_fmt(r.measured, per_min)}"
                     f"{'' if r.equal is not False else ' DIFF'} | {r.how.replace('run, ', '')} | "
                     f"{r.predicted / r.measured:.2f} | {a1 / r.measured:.2f} | {a2 / r.measured:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", type=Path, default=DEFAULT)
    args = ap.parse_args(argv)
    recs = load_records(args.paths)
    fitted = [r for r in recs if r.fitted]
    print(f"{len(recs)} executed plans, {len(fitted)} fitted (state on its owner, bytes recorded), "
          f"{sum(r.c > 0 for r in fitted)} of them with cut edges\n")
    full = fit(fitted, ("h", "phi", "kappa"))
    planner = {t: full[t] for t in ("h", "phi")}
    groups = (("with cuts", [r for r in fitted if r.c > 0]), ("no cuts", [r for r in fitted if r.c == 0]))
    for terms in (("h",), ("h", "kappa"), ("h", "phi", "kappa")):
        coef = fit(fitted, terms)
        print(f"fit {' + '.join(terms)}: {describe(coef)}")
        for name, sel in groups:
            print(f"    {name:9s}: before {errors(sel, {})}; after {errors(sel, coef)}")
    print(f"\nadopted for the planner (h, phi of the 3-term fit): {describe(planner)}; kappa "
          f"{full['kappa'] * 1e6:.0f} us per call is placement-independent and left out")
    for name, sel in groups:
        print(f"    {name:9s}: planner's model {errors(sel, planner)}")
    print("\nstability (3-term fit leaving one run out / one model only):")
    for key in sorted({r.run for r in fitted}) + sorted({f"model:{r.model}" for r in fitted}):
        sel = [r for r in fitted if (r.model == key[6:] if key.startswith("model:") else r.run != key)]
        print(f"    {'only ' + key[6:] if key.startswith('model:') else 'without ' + key}: "
              f"{describe(fit(sel, ('h', 'phi', 'kappa')))}")
    print()
    print(table(recs, planner, full))
    return 0


if __name__ == "__main__":
    sys.exit(main())
