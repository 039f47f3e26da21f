"""``tessera bench --measure``: print, save and chart the measured comparison (:mod:`torch_tessera.measure`)."""

from __future__ import annotations

import argparse
import sys
import math
from pathlib import Path

from torch_tessera import jsonout


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
    from torch_tessera.target.devices import split_devices

    simulated = [d for d in split_devices(devices) if d.strip().lower().startswith("sim:")]
    if simulated:
        print(f"error: --measure runs every plan on real devices; {', '.join(simulated)} is simulated "
              "(use cuda:N, cuda:N@Ksm, cuda:N@PROFILE or cpu:N; without --measure, sim: devices are predicted)",
              file=sys.stderr)
        return 2
    s = MeasureSettings(model=args.model, devices=devices, size=args.size, layers=args.layers,
                        prefill_tokens=args.prefill_tokens, decode_batch=args.decode_batch,
                        output_tokens=args.output_tokens, repeats=args.repeats, warmup=args.warmup,
                        profile_repeats=args.profile_repeats, micro_batches=args.micro_batches, links=args.links,
                        concurrent_steps=args.concurrent_steps, streams=args.streams,
                        priorities=getattr(args, "priorities", False))
    from torch_tessera.benchmark import plan_names
    from torch_tessera.measure.estimate import announce
    from torch_tessera.target.devices import parse_run_devices

    specs, on_cuda, _ = parse_run_devices(devices, "--measure")  # a device this machine lacks fails before we start
    if not on_cuda:  # a model the host cannot hold fails before we start, too
        import torch

        from torch_tessera.measure.programs import check_host_memory

        check_host_memory(s, torch.float32)
    n_programs = len(s.composition.frequencies)
    print(announce(s, plan_names(len(specs)), len(specs), not on_cuda), file=sys.stderr, flush=True)
    with tqdm(total=total_steps(len(specs), n_programs), desc=f"measure {args.model} on {devices}",
              unit="step") as bar:
        rows, meta = measure_plans(s, bar, say=lambda line: bar.write(line, file=sys.stderr))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    print_table(rows, meta)
    (out_dir / "bench.json").write_text(jsonout.dumps({"model": args.model, "devices": devices, "measured": {
        "meta": meta, "rows": rows_as_dicts(rows)}}, indent=1, default=str))
    chart(rows, meta, out_dir / "bench.png")
    print(f"results: {out_dir / 'bench.json'}; bar chart: {out_dir / 'bench.png'}")
    return 0 if all(r.equal is not False for r in rows) else 1


def _shapes(meta) -> str:
    if meta["family"] == "diffusion":
        return f"one denoising step of {meta['batch']} image(s), {meta['output_per_step']:g} images per step"
    kv = f", KV context {meta['context']}" if meta["context"] is not None else ", conv/SSM state"
    return (f"prefill 1x{meta['prefill_tokens']} tokens, decode {meta['decode_batch']} sequences{kv}, "
            f"{meta['output_tokens']:g} output tokens/request")


def print_table(rows, meta) -> None:
    """The measured table, in the run's display unit (tok/s, images/min); says which numbers are measured and which
    derived."""
    warn = "" if meta["timings_meaningful"] else "  [CPU virtual devices: timings test the plumbing only]"
    unit, k = meta["display_unit"], meta["display_factor"]
    names = list(meta["programs"])
    print(f"\nMEASURED: {meta['model']} ({meta['size']}"
          f"{'' if meta['layers'] is None else ', %d layers' % meta['layers']}) on {', '.join(meta['devices'])}: "
          f"{_shapes(meta)}{warn}")
    print(f"zero-communication bound (from measured per-launch costs, free transfers): "
          f"{_fmt(k * meta['zero_communication_bound_output_per_s'])} {unit}")
    times = " ".join(f"{n[:8] + ' ms':>11s}" for n in names)
    print(f"{'plan':13s} {unit:>10s} {'serial':>9s} {'predicted':>9s} {times} "
          f"{'per price':>9s} {'vs bound':>8s} {'vs best':>7s} {'cuts':>5s} {'eager':>6s}  how")
    for r in rows:
        if not r.applies:
            print(f"{r.plan:13s} {'n/a':>10s}  {r.how}")
            continue
        eq = "-" if r.equal is None else ("equal" if r.equal else "DIFF")
        ms = " ".join(f"{_fmt(r.seconds.get(n, math.nan) * 1e3):>11s}" for n in names)
        print(f"{r.plan:13s} {_fmt(k * r.output_per_s):>10s} {_fmt(k * r.output_per_s_serial):>9s} "
              f"{_fmt(k * r.predicted_output_per_s):>9s} {ms} "
              f"{_fmt(k * r.output_per_s_per_price):>9s} {100 * r.vs_bound:>7.1f}% "
              f"{_fmt(r.speedup_vs_best_baseline, 'x'):>7s} {r.cut_edges:>5d} {eq:>6s}  {r.how}")
    print(f"{unit}: measured program times composed per workload step (run: executed; run, pipelined: micro-batches "
          "through run_pipelined; run, programs concurrent: prefill and decode calls issued at the same time from two "
          "threads, wall time per workload step; derived: composed from measured homo-* steps); serial: without "
          "micro-batches; "
          "predicted: the plan's model over the measured costs; <program> ms: median call, unloaded (for LLMs and "
          "SSMs prefill = TTFT, decode = TPOT estimates).")
    print("prices: " + "; ".join(f"{d} {v[0]:g}/h ({v[1]})" for d, v in meta["prices"].items()))
    if meta.get("tessera_choice"):
        print(meta["tessera_choice"])


def chart(rows, meta, path: Path) -> None:
    """Bar chart of measured throughput per plan (derived rows hatched) with the zero-communication bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.applies]
    fig, ax = plt.subplots(figsize=(8, 4))
    k = meta["display_factor"]
    bars = ax.bar([r.plan for r in ok], [k * r.output_per_s for r in ok],
                  color=["#d62728" if r.plan == "tessera" else "#888" for r in ok])
    for b, r in zip(bars, ok):
        if r.how.startswith("derived"):
            b.set_hatch("//")
    bound = meta["zero_communication_bound_output_per_s"]
    if bound == bound and not math.isinf(bound):
        ax.axhline(k * bound, linestyle="--", color="k", label="zero-communication bound (measured costs)")
        ax.legend()
    ax.set_ylabel(f"{meta['display_unit']} (measured; hatched: derived)")
    ax.set_title(f"{meta['model']} ({meta['size']}) on {' + '.join(meta['devices'])} (measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
