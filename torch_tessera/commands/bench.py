"""``tessera bench``: every baseline and tessera on one model, checked against eager and compared.

With no arguments (a machine without a GPU): the tiny Llama runs on two CPU virtual devices under every plan, each
checked against eager PyTorch, and the full-size Llama-3.1-8B's throughput is predicted for every plan on the paper's
A100 + L40S pair (simulated from datasheet figures). Writes ``bench.json`` and ``bench.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

from torch_tessera.outpaths import DEFAULT_OUT_DIR

from torch_tessera import jsonout

HELP = "compare tessera with every baseline on a model: checked on CPU, predicted on a device pair"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama", help="registry model (default: llama)")
    parser.add_argument("--devices", default="sim:a100,sim:l40s",
                        help="device pair to predict for (default: the paper's sim:a100,sim:l40s)")
    parser.add_argument("--check-devices", default=None,
                        help="CPU virtual devices for the eager check (default: cpu:0..cpu:N-1, one per device)")
    parser.add_argument("--output-tokens", type=float, default=129.0, help="mean output tokens per request")
    parser.add_argument("--no-check", action="store_true", help="skip the CPU check")
    parser.add_argument("--no-simulate", action="store_true", help="skip the full-size prediction")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="model size to predict for")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, help="directory for bench.json and bench.png")
    m = parser.add_argument_group("measured mode (--measure): run and time every plan on --devices")
    m.add_argument("--measure", action="store_true",
                   help="compile once, profile every launch on each device, plan from the measured costs, run and "
                        "time every plan on --devices (e.g. cuda:0,cuda:1@24sm; cpu:0,cpu:1 tests the plumbing); "
                        "models: llama, moe, mamba, dit")
    m.add_argument("--layers", type=int, default=None,
                   help="keep N repeated blocks: decoder / Mamba layers (the first N), dit: the first N-1 joint blocks "
                        "and the last (default: 8 at --size full, all at tiny)")
    m.add_argument("--prefill-tokens", type=int, default=None,
                   help="prompt tokens of the prefill program (default: llama/moe 1024, mamba 32; tiny: 16 / 8)")
    m.add_argument("--decode-batch", type=int, default=None, help="sequences per decode step (default: 64; tiny 4)")
    m.add_argument("--repeats", type=int, default=10, help="timed calls per plan and program (median)")
    m.add_argument("--warmup", type=int, default=2, help="untimed calls per plan and program before timing")
    m.add_argument("--profile-repeats", type=int, default=10, help="timed runs per distinct launch")
    m.add_argument("--concurrent-steps", type=int, default=8,
                   help="workload steps timed with prefill and decode running concurrently (0: skip)")
    m.add_argument("--micro-batches", type=int, default=4,
                   help="micro-batches for the pipelined timing of multi-device plans (0: skip)")
    m.add_argument("--priorities", action="store_true",
                   help="run the decode program's streams urgent and the prefill's background when they run at the "
                        "same time (experimental: it did not help reliably; docs/BENCHMARKS.md, stream priorities)")
    m.add_argument("--links", default="catalog", choices=["catalog", "measured"], help="link figures to plan with")
    parser.add_argument("--streams", action="store_true", default=True,
                        help="kept for old command lines: the default now (tessera is planned over a space holding "
                             "every baseline's placement and one request stream per device, each its own KV cache; "
                             "the planner's single placement stays as tessera-single when another plan wins)")
    parser.add_argument("--no-streams", dest="streams", action="store_false",
                        help="leave one request stream per device out of tessera's space (single placements and "
                             "the baselines' placements only; request-dist stays a baseline). Executed on two H200s, "
                             "streams plans ran below their model: docs/BENCHMARKS.md, request streams")


def _fmt(x: float, unit: str = "") -> str:
    if x != x:
        return "-"
    return f"{x:,.1f}{unit}" if abs(x) >= 10 else f"{x:.3g}{unit}"


def missing_gpu_fix(args: argparse.Namespace) -> str:
    """The remedy when --devices names a GPU this machine lacks (only --measure opens the devices)."""
    return (f"--measure runs and times every plan on the devices it names: run it on a machine with them. On this one, "
            f"--devices cpu:0,cpu:1 runs the same measurement on two CPU virtual devices (checked against eager; not "
            f"GPU speeds), and `tessera bench --model {args.model} --devices {args.devices}` without --measure "
            f"predicts the pair (a missing cuda:N modelled as an H200).")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from torch_tessera.benchmark import check_plans, checkable, plan_names, rows_as_dicts, simulate_plans
    from torch_tessera.models import get_model
    from torch_tessera.target.devices import assumed_note, parse_devices

    get_model(args.model)  # unknown names fail here, listing the registry
    if args.measure:
        from torch_tessera.commands.bench_measure import run_measured

        return run_measured(args)
    specs = parse_devices(args.devices, assume_gpu="h200")
    if getattr(args, "prefill_tokens", None) is not None:
        print(f"warning: --prefill-tokens {args.prefill_tokens} applies to --measure only; the predicted bench plans "
              "the registry's 1,024-token prefill (tessera pairs --prefill-tokens N predicts other lengths)",
              file=sys.stderr, flush=True)
    note = assumed_note(specs)
    if note:
        print(note)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"model": args.model, "devices": args.devices}
    status = 0
    if args.check_devices is None:
        args.check_devices = ",".join(f"cpu:{i}" for i in range(len(specs)))
    if not args.no_check:
        with tqdm(total=len(checkable(len(specs))), desc=f"check {args.model} (tiny) on {args.check_devices}", unit="plan") as bar:
            check = check_plans(args.model, args.check_devices.split(","), specs, bar)
        print(f"\nEvery plan on {args.check_devices} (tiny {args.model}) against eager PyTorch:")
        print(f"{'plan':10s} {'launches/device':>16s} {'cut edges':>9s} {'transfers':>9s} {'max |err|':>10s}  result")
        for r in check:
            print(f"{r.plan:10s} {'/'.join(map(str, r.launches_per_device)):>16s} {r.cut_edges:>9d} "
                  f"{r.transfers:>9d} {r.max_abs_error:>10.2e}  {'equal' if r.equal else 'DIFFERENT'}")
        print("(request-dist and pd run homo-L / homo-R placements per program; both are checked above. A plan "
              "with 0 cut edges, e.g. tessera when it keeps the tiny model on one device, crosses no device: the "
              "cross-device checks are the rows with cut edges.)")
        if check and check[0].graphs[1] > 1:
            print(f"(Dynamo compiles tiny {args.model} as {check[0].graphs[1]} graphs; each plan is placed on every "
                  "graph it applies to, the others run on the first device: "
                  + ", ".join(f"{r.plan} on {r.graphs[0]}" for r in check) + ")")
        result["check"] = rows_as_dicts(check)
        status |= 0 if all(r.equal for r in check) else 1
    if not args.no_simulate:
        print(f"planning {args.model} ({args.size}): the first step lowers it without weights; with empty caches it "
              "takes most of the time (one to two minutes for llama on a 2-core CPU), so the bar's early ETA is too "
              "high; with the lowering cache warm it takes seconds", flush=True)
        with tqdm(total=len(plan_names(len(specs))) + 1, desc=f"plan {args.model} ({args.size}) on {args.devices}",
                  unit="step") as bar:
            rows, meta = simulate_plans(args.model, specs, args.output_tokens, bar, size=args.size,
                                        streams=args.streams)
        unit = {"tokens": "tok/s", "images": "img/s", "rows": "rows/s"}[meta["unit"]]
        print(f"\nPREDICTED (simulated from datasheet figures, not measured): {args.model} {args.size} size on "
              f"{args.devices}")
        print(f"zero-communication bound: {_fmt(meta['zero_communication_bound_output_per_s'])} {unit}")
        print(f"{'plan':13s} {unit:>10s} {unit + ' per price':>14s} {'vs bound':>9s} {'vs best baseline':>17s}  "
              f"memory per device ({' | '.join(meta['devices'])})")
        for r in rows:
            if not r.applies:
                print(f"{r.plan:13s} {'n/a':>10s}  {r.reason}")
                continue
            print(f"{r.plan:13s} {_fmt(r.output_per_s):>10s} {_fmt(r.output_per_s_per_price):>14s} "
                  f"{100 * r.vs_bound:>8.1f}% {_fmt(r.speedup_vs_best_baseline, 'x'):>17s}  {memory_cell(r.memory_gb)}")
        print(memory_note(rows, meta["devices"]))
        print("prices: " + "; ".join(f"{k} {v[0]:g}/h ({v[1]})" for k, v in meta["prices"].items()))
        print(meta["tessera_choice"])
        result["simulated"] = {"meta": meta, "rows": rows_as_dicts(rows)}
        _chart(rows, meta, unit, out_dir / "bench.png")
        print(f"bar chart: {out_dir / 'bench.png'}")
    (out_dir / "bench.json").write_text(jsonout.dumps(result, indent=1, default=str))
    print(f"results: {out_dir / 'bench.json'}")
    return status


def memory_cell(memory_gb: Sequence[float]) -> str:
    """The table's memory cell: GB per device in the order of the header's devices, ``" 26.33 GB |   0.00 GB"``."""
    return " | ".join(f"{gb:>6.2f} GB" for gb in memory_gb)


def memory_note(rows, devices: Sequence[str]) -> str:
    """Lines under the table: what tessera's memory on each device is made of (GB of weights, STATE such as KV
    caches, activations), beside request-dist's, and why its STATE can be larger (a request stream's kernels placed
    on the other device hold that stream's STATE there as well).

    Args:
        rows: the bench's :class:`~torch_tessera.benchmark.SimRow` rows.
        devices: device names, in the order of each row's per-device tuples.
    """
    by = {r.plan: r for r in rows if r.applies and r.weights_gb}
    t = by.get("tessera")
    head = "memory per device, GB = weights + STATE (KV caches) + activations"
    if t is None:
        return head
    named = [("tessera", t)] + ([("request-dist", by["request-dist"])] if "request-dist" in by else [])
    width = max(len(n) for n, _ in named)
    lines = [head + ":"]
    for name, r in named:
        parts = (f"{d} {total:.2f} GB = weights {w:.2f} + STATE {st:.2f} + activations {a:.2f}"
                 for d, total, w, st, a in zip(devices, r.memory_gb, r.weights_gb, r.state_gb, r.activation_gb))
        lines.append(f"  {name:{width}s}  " + "; ".join(parts))
    rd = by.get("request-dist")
    if rd is not None and max(t.state_gb) > max(rd.state_gb) + 0.005:
        lines.append("tessera holds more STATE: kernels of one request stream placed on the other device need that "
                     "stream's KV cache there too, so those caches are held on both devices")
    return "\n".join(lines)


def bar_colors(plans: list[str]) -> list[str]:
    """One colour per bar: tessera's red, every other plan (baselines, ``tessera-single``) grey."""
    return ["#d62728" if p == "tessera" else "#888" for p in plans]


def _chart(rows, meta, unit: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.applies]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([r.plan for r in ok], [r.output_per_s for r in ok], color=bar_colors([r.plan for r in ok]))
    bound = meta["zero_communication_bound_output_per_s"]
    if bound == bound and not math.isinf(bound):
        ax.axhline(bound, linestyle="--", color="k", label="zero-communication bound")
        ax.legend()
    ax.set_ylabel(unit + " (predicted)")
    ax.set_title(f"{meta['model']} on {' + '.join(meta['devices'])} (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
