"""``tessera bench --measure``: print, save and chart the measured comparison (:mod:`torch_tessera.measure`)."""

from __future__ import annotations

import argparse
import json
import sys
import math
from pathlib import Path


def _fmt(x: float, unit: str = "") -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.1f}{unit}" if abs(x) >= 10 else f"{x:.3g}{unit}"


def run_measured(args: argparse.Namespace) -> int:
    """Run :func:`~torch_tessera.measure.measure_plans` with the command's arguments; 1 if a plan differs from
    eager, else 0. Writes ``bench.json`` and ``bench.png`` to ``--out``."""
    from tqdm import tqdm

    from torch_tessera.benchmark import rows_as_dicts
    from torch_tessera.measure import MeasureSettings, measure_plans, total_steps

    devices = args.devices if args.devices != "sim:a100,sim:l40s" else "cpu:0,cpu:1"
    if devices != args.devices:
        print("--measure runs on real devices; no --devices given, so on the CPU virtual devices cpu:0,cpu:1")
    simulated = [d for d in devices.split(",") if d.strip().lower().startswith("sim:")]
    if simulated:
        print(f"error: --measure runs every plan on real devices; {', '.join(simulated)} is simulated "
              "(use cuda:N, cuda:N@Ksm, cuda:N@PROFILE or cpu:N; without --measure, sim: devices are predicted)",
              file=sys.stderr)
        return 2
    s = MeasureSettings(model=args.model, devices=devices, size=args.size, layers=args.layers,
                        output_tokens=args.output_tokens, repeats=args.repeats, warmup=args.warmup,
                        profile_repeats=args.profile_repeats, micro_batches=args.micro_batches, links=args.links)
    with tqdm(total=total_steps(len(devices.split(","))), desc=f"measure {args.model} on {devices}",
              unit="step") as bar:
        rows, meta = measure_plans(s, bar)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print_table(rows, meta)
    (out_dir / "bench.json").write_text(json.dumps({"model": args.model, "devices": devices, "measured": {
        "meta": meta, "rows": rows_as_dicts(rows)}}, indent=1, default=str))
    chart(rows, meta, out_dir / "bench.png")
    print(f"results: {out_dir / 'bench.json'}; bar chart: {out_dir / 'bench.png'}")
    return 0 if all(r.equal is not False for r in rows) else 1


def print_table(rows, meta) -> None:
    """The measured table; says which numbers are measured and which derived."""
    warn = "" if meta["timings_meaningful"] else "  [CPU virtual devices: timings test the plumbing only]"
    print(f"\nMEASURED: {meta['model']} ({meta['size']}"
          f"{'' if meta['layers'] is None else ', %d layers' % meta['layers']}) on {', '.join(meta['devices'])}: "
          f"prefill 1x{meta['prefill_tokens']} tokens, decode {meta['decode_batch']} sequences, KV context "
          f"{meta['context']}, {meta['output_tokens']:g} output tokens/request{warn}")
    print(f"zero-communication bound (from measured per-launch costs, free transfers): "
          f"{_fmt(meta['zero_communication_bound_output_per_s'])} tok/s")
    print(f"{'plan':13s} {'tok/s':>9s} {'serial':>9s} {'predicted':>9s} {'TTFT ms':>8s} {'TPOT ms':>8s} "
          f"{'tok/s/$h':>9s} {'vs bound':>8s} {'vs best':>7s} {'cuts':>5s} {'eager':>6s}  how")
    for r in rows:
        if not r.applies:
            print(f"{r.plan:13s} {'n/a':>9s}  {r.how}")
            continue
        eq = "-" if r.equal is None else ("equal" if r.equal else "DIFF")
        print(f"{r.plan:13s} {_fmt(r.output_per_s):>9s} {_fmt(r.output_per_s_serial):>9s} "
              f"{_fmt(r.predicted_output_per_s):>9s} {_fmt(r.ttft_s * 1e3):>8s} {_fmt(r.tpot_s * 1e3):>8s} "
              f"{_fmt(r.output_per_s_per_price):>9s} {100 * r.vs_bound:>7.1f}% {_fmt(r.speedup_vs_best_baseline, 'x'):>7s} "
              f"{r.cut_edges:>5d} {eq:>6s}  {r.how}")
    print("tok/s: measured steps composed per request (run: executed; run, pipelined: micro-batches through "
          "run_pipelined; derived: composed from measured homo-* steps); serial: without micro-batches; predicted: "
          "the plan's model over the measured costs; TTFT/TPOT: unloaded step times (estimates).")
    print("prices: " + "; ".join(f"{k} {v[0]:g}/h ({v[1]})" for k, v in meta["prices"].items()))


def chart(rows, meta, path: Path) -> None:
    """Bar chart of measured tok/s per plan (derived rows hatched) with the zero-communication bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.applies]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar([r.plan for r in ok], [r.output_per_s for r in ok],
                  color=["#d62728" if r.plan == "tessera" else "#888" for r in ok])
    for b, r in zip(bars, ok):
        if r.how.startswith("derived"):
            b.set_hatch("//")
    bound = meta["zero_communication_bound_output_per_s"]
    if bound == bound and not math.isinf(bound):
        ax.axhline(bound, linestyle="--", color="k", label="zero-communication bound (measured costs)")
        ax.legend()
    ax.set_ylabel("output tok/s (measured; hatched: derived)")
    ax.set_title(f"{meta['model']} ({meta['size']}) on {' + '.join(meta['devices'])} (measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
