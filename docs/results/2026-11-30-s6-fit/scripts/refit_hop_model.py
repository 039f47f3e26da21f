"""Refit the throughput model's per-hop charge on the session-5 runs, with held-out checks (issue 9).

Reads the executed plans of ``tessera bench --measure`` (as ``bench/fit_hop_overhead.py`` loads them: measured step
time, the model's UNCHARGED step time, cut edges and copied bytes per program run) and compares model variants that
add terms to the uncharged cycle ``S0`` (seconds per workload step):

    S ~= S0 + h x C + phi x X + kappa x N + sigma x S2 + beta x B + rho x Q

* ``C``: cut edges per step (``sum_p f_p x cuts_p``); ``X``: seconds of cut-edge copies per step at the modelled
  link bandwidth; ``N``: program calls per step (``sum_p f_p``);
* ``S2``: runs per step of programs that SPAN two devices (a fixed cost per such run, whatever its cuts);
* ``B``: the pipeline fill/drain of such a program with ``M`` calls in flight: ``sum_p f_p x (sum_d L_pd - max_d
  L_pd) / M`` (``L_pd``: program ``p``'s kernel seconds per call on device ``d``; ``M`` = the bench's 4
  micro-batches, timed in rounds of ``M``);
* ``Q``: concurrency overlap, for plans timed with their programs running at once (``how`` = "programs
  concurrent"): ``sum_d min_p f_p x L_pd`` (work of two programs on one device, which the model adds as if it
  interleaved for free).

``L_pd`` is the measured kernel time of one call on each GPU (``runs.<plan>.device_busy``: every executed plan has
it; on the session-5 C/D runs it agrees with the model's per-launch costs within a few %, printed below). Fits are
least squares on RELATIVE step-time errors, unconstrained. Sets: ``s4`` = the 44 plans of 2026-11-29 session 4 (what
52 us / 0.6 were fitted on), ``s5`` = the non-streams plans of 2026-11-30 session 5 (calls A-D). Held out: fit on one
set, predict the other. Streams plans (``--streams``, four threads) are shown, never fitted.

Usage, from the repository root: ``PYTHONPATH=. python docs/results/2026-11-30-s6-fit/scripts/refit_hop_model.py
[--out DIR]``; prints the tables (Markdown) and, with ``--out``, writes
``refit.md`` and ``records.json`` there. Only reads JSON (numpy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.fit_hop_overhead import ROOT, load_records

S4, S5 = ROOT / "docs/results/2026-11-29-s4", ROOT / "docs/results/2026-11-30-s5"
M_IN_FLIGHT = 4  # the measured bench's micro-batches per timed round (settings.micro_batches of every run here)

#: name -> terms added to S0 (``fixed`` ones take the adopted figures, the others are fitted)
VARIANTS = {
    "V0 uncharged model": (),
    "V1 adopted: 52 us x C + 0.6 x X (fixed)": ("fixed",),
    "V2 refit h": ("h",),
    "V3 refit h, phi, kappa (the 3-term fit)": ("h", "phi", "kappa"),
    "V4 h, kappa + sigma per spanning run": ("h", "kappa", "sigma"),
    "V5 h, kappa + beta x fill/drain B": ("h", "kappa", "beta"),
    "V6 h, kappa + rho x concurrency overlap Q": ("h", "kappa", "rho"),
    "V7 h, kappa, beta, rho": ("h", "kappa", "beta", "rho"),
    "V8 kappa, beta, rho (no per-cut term)": ("kappa", "beta", "rho"),
}
UNITS = {"h": (1e6, "us/cut"), "phi": (1.0, ""), "kappa": (1e6, "us/call"), "sigma": (1e6, "us/span-run"),
         "beta": (1.0, "x B"), "rho": (1.0, "x Q")}


def _busy(meta: dict, plan: str) -> dict[str, np.ndarray]:
    """Program -> kernel ms per call on each GPU (``device_busy``), as seconds."""
    db = meta["runs"].get(plan, {}).get("device_busy", {})
    return {p: np.array([db.get(p, {}).get(f"gpu{g}", {}).get("kernel_ms", 0.0) for g in range(2)]) / 1e3
            for p in meta["programs"]}


def records() -> list[dict]:
    """Every executed plan of s4 and s5 as a dict of features (seconds per workload step) and labels."""
    out, metas = [], {}
    for r in load_records([S4, S5]):
        if r.run not in metas:
            metas[r.run] = json.loads((ROOT / "docs/results" / r.run / "bench.json").read_text())["measured"]["meta"]
        meta = metas[r.run]
        L = _busy(meta, r.plan)
        span = {p: bool((L[p] > 1e-4).sum() > 1) for p in r.freq}  # >= 0.1 ms of kernels on both GPUs
        f = r.freq
        concurrent = "concurrent" in r.how
        out.append(dict(
            set="s5" if "2026-11-30" in r.run else "s4", run=r.run, model=r.model, profile=r.profile, plan=r.plan,
            how=r.how.replace("run, ", ""), streams=r.streams, fitted=r.fitted, s_meas=r.s_meas, s0=r.s_pred,
            s_charged=(r.out_per_step / r.predicted_charged) if r.predicted_charged else None,
            C=r.c, X=r.x, N=r.n_calls, S2=sum(f[p] for p in f if span[p]),
            B=sum(f[p] * (L[p].sum() - L[p].max()) / M_IN_FLIGHT for p in f if span[p]),
            Q=float(sum(min(f[p] * L[p][d] for p in f) for d in range(2))) if concurrent and len(f) > 1 else 0.0,
            busy_max=float(max(sum(f[p] * L[p][d] for p in f) for d in range(2)))))
    return out


def column(rec: dict, term: str) -> float:
    return {"h": rec["C"], "phi": rec["X"], "kappa": rec["N"], "sigma": rec["S2"], "beta": rec["B"],
            "rho": rec["Q"], "fixed": 52e-6 * rec["C"] + 0.6 * rec["X"]}[term]


def fit(recs: list[dict], terms: tuple[str, ...]) -> dict[str, float]:
    free = [t for t in terms if t != "fixed"]
    coef = {"fixed": 1.0} if "fixed" in terms else {}
    if not free:
        return coef
    y = np.array([(r["s_meas"] - r["s0"] - sum(c * column(r, t) for t, c in coef.items())) / r["s_meas"]
                  for r in recs])
    a = np.array([[column(r, t) / r["s_meas"] for t in free] for r in recs])
    sol, *_ = np.linalg.lstsq(a, y, rcond=None)
    coef.update(zip(free, map(float, sol)))
    return coef


def predict(rec: dict, coef: dict[str, float]) -> float:
    return rec["s0"] + sum(c * column(rec, t) for t, c in coef.items())


def err(rec: dict, coef: dict[str, float]) -> float:
    """Relative error of the predicted THROUGHPUT: predicted / measured - 1 (= S_meas / S_pred - 1)."""
    return rec["s_meas"] / predict(rec, coef) - 1.0


def describe(coef: dict[str, float]) -> str:
    return ", ".join(f"{t} {c * UNITS[t][0]:.3g}{(' ' + UNITS[t][1]) if UNITS[t][1] else ''}"
                     for t, c in coef.items() if t != "fixed") or "-"


def stats(recs: list[dict], coef: dict[str, float]) -> str:
    if not recs:
        return "-"
    e = np.array([err(r, coef) for r in recs])
    return f"{100 * np.abs(e).mean():.0f} / {100 * e[np.argmax(np.abs(e))]:+.0f}"


def plan_kind(rec: dict) -> str:
    return "tessera" if rec["plan"].startswith("tessera") else rec["plan"]


def report() -> str:
    recs = records()
    fitted = [r for r in recs if r["fitted"]]
    sets = {s: [r for r in fitted if r["set"] == s] for s in ("s4", "s5")}
    kinds = ["homo-L", "homo-R", "af", "layer", "tessera"]
    lines = [f"{len(recs)} executed plans; fitted sets: s4 {len(sets['s4'])}, s5 {len(sets['s5'])} (streams plans "
             f"left out: {sum(r['streams'] for r in recs)})", ""]
    # 1. in-sample and held-out, all plans
    lines += ["| variant | fit on s4: coefficients | s4 in-sample | s5 held out | fit on s5: coefficients | "
              "s5 in-sample | s4 held out | fit on both: coefficients | both |", "| " + " | ".join(["---"] * 9) + " |"]
    fits = {}
    for name, terms in VARIANTS.items():
        c4, c5, cb = fit(sets["s4"], terms), fit(sets["s5"], terms), fit(fitted, terms)
        fits[name] = (c4, c5, cb)
        lines.append(f"| {name} | {describe(c4)} | {stats(sets['s4'], c4)} | {stats(sets['s5'], c4)} | "
                     f"{describe(c5)} | {stats(sets['s5'], c5)} | {stats(sets['s4'], c5)} | {describe(cb)} | "
                     f"{stats(fitted, cb)} |")
    lines += ["", "(cells: mean |error| % / worst error %, error = predicted / measured throughput - 1)", ""]
    # 2. held-out per plan kind
    for direction, (train, test) in (("fit on s4, predict s5", ("s4", "s5")), ("fit on s5, predict s4", ("s5", "s4"))):
        lines += [f"**Held out, {direction}** (mean |error| % / worst %, per plan):", "",
                  "| variant | " + " | ".join(f"{k} (n={sum(plan_kind(r) == k for r in sets[test])})"
                                             for k in kinds) + " |", "| " + " | ".join(["---"] * (len(kinds) + 1)) + " |"]
        for name in VARIANTS:
            coef = fits[name][0 if train == "s4" else 1]
            lines.append(f"| {name} | " + " | ".join(stats([r for r in sets[test] if plan_kind(r) == k], coef)
                                                       for k in kinds) + " |")
        lines.append("")
    # 3. every s5 record (and streams plans) under the main variants
    show = ["V1 adopted: 52 us x C + 0.6 x X (fixed)", "V3 refit h, phi, kappa (the 3-term fit)",
            "V7 h, kappa, beta, rho"]
    lines += ["**Every session-5 executed plan** (ms per workload step; V3, V7 fitted on s4, i.e. held out here):", "",
              "| run | plan | how | cuts/step C | S0 (uncharged model) | bench's charged model | max GPU busy, "
              "measured | measured step | V1 | V3 (s4 fit) | V7 (s4 fit) | B | Q |",
              "| " + " | ".join(["---"] * 13) + " |"]
    for r in recs:
        if r["set"] != "s5":
            continue
        ms = lambda x: f"{1e3 * x:.2f}" if x is not None else "-"  # noqa: E731
        preds = " | ".join(f"{ms(predict(r, fits[n][0]))} ({r['s_meas'] / predict(r, fits[n][0]):.2f})" for n in show)
        lines.append(f"| {r['run'].split('-s5/')[-1]} | {r['plan']}{' (streams, not fitted)' if r['streams'] else ''}"
                     f" | {r['how']} | {r['C']:.1f} | {ms(r['s0'])} | {ms(r['s_charged'])} | {ms(r['busy_max'])} | "
                     f"{ms(r['s_meas'])} | {preds} | {ms(r['B'])} | {ms(r['Q'])} |")
    lines += ["", "(V columns: predicted step ms (measured / predicted step = predicted / measured throughput))"]
    return "\n".join(lines), recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    text, recs = report()
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "refit.md").write_text(text + "\n")
        (args.out / "records.json").write_text(json.dumps(recs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
