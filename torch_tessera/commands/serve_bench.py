"""``tessera serve-bench``: sweep Poisson request rates for every policy; report latency, throughput and SLO crossings.

Examples::

    tessera serve-bench --model llama --devices cuda:0,cuda:1@72sm --rates 5,10,15,20,25,30          # simulated
    tessera serve-bench --engine sim --sim-costs measured_costs.json --rates 2,4,8 --out results/serve
    # results: serve_bench.json and latency_vs_rate.png in --out (default tessera_out/, as every command's)
    tessera serve-bench --engine sim --trace splitwise_conv.csv --rates 10,20 --search                  # bisect too

With ``--engine sim`` the step times come from per-policy cost figures (``--sim-costs FILE``, format in
:mod:`torch_tessera.serving.simcosts`; default: an illustrative pair derived from the measured H200 profile). With
``--engine real`` the compiled model runs on the devices (:mod:`torch_tessera.serving.compiled_engine`: compiled
and planned once for every policy, then served on the wall clock)::

    tessera serve-bench --engine real --model llama --size tiny --devices cpu:0,cpu:1 --rates 20 --requests 4 \
        --input-len 8 --output-len 3 --buckets 1,2 --policies homo-R,tessera
"""

from __future__ import annotations

import argparse
import logging
import pathlib

from torch_tessera import jsonout
from torch_tessera.commands.devices import format_table
from torch_tessera.errors import ConfigError
from torch_tessera.outpaths import DEFAULT_OUT_DIR
from torch_tessera.serving.clock import SimClock, WallClock
from torch_tessera.serving.compiled_engine import CompiledEngine, CompiledModel, EngineSettings, plans_of
from torch_tessera.serving.engine import SimulatedEngine
from torch_tessera.serving.loop import DEFAULT_BUCKETS, ServeConfig
from torch_tessera.serving.monitor import MonitorConfig
from torch_tessera.serving.simcosts import DEFAULT_SOURCE, default_policy_costs, load_policy_costs
from torch_tessera.serving.sweep import Policy, SweepPoint, search_max_rate, sustained_rates, sweep
from torch_tessera.serving.workload import load_trace, make_requests

HELP = "sweep request rates per policy: TTFT, TPOT, normalized latency, highest rate under the SLO"
log = logging.getLogger(__name__)

#: Splitwise conversation trace medians (input 1020, output 129 tokens), the paper artifact's copy (paper digest §9).
SPLITWISE_INPUT, SPLITWISE_OUTPUT = 1020, 129


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera serve-bench``."""
    parser.add_argument("--model", default="llama", help="registry model name (real engine; recorded with sim)")
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="devices, comma-separated (real engine)")
    parser.add_argument("--rates", required=True, help="Poisson request rates to sweep, req/s, comma-separated")
    parser.add_argument("--engine", choices=("sim", "real"), default="sim", help="simulated or compiled engine")
    parser.add_argument("--size", choices=("tiny", "full"), default="full", help="model size (real engine)")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers (real engine)")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="real engine on GPUs: issue every launch from Python instead of replaying CUDA graphs")
    parser.add_argument("--policies", default=None,
                        help="policies to run, comma-separated (default: all in the cost file / the real set)")
    parser.add_argument("--sim-costs", default=None, metavar="FILE", help="per-policy cost figures (JSON)")
    parser.add_argument("--requests", type=int, default=300, help="requests per run")
    parser.add_argument("--input-len", type=int, default=SPLITWISE_INPUT, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=SPLITWISE_OUTPUT, help="output tokens per request")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="CSV/JSONL trace whose lengths replace --input-len/--output-len (cycled to --requests)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    parser.add_argument("--slo-ms", type=float, default=50.0, help="SLO on mean normalized latency, ms/token")
    parser.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)), help="batch buckets, ascending")
    parser.add_argument("--max-prefill-tokens", type=int, default=8192, help="prompt tokens per prefill step")
    parser.add_argument("--window-ms", type=float, default=300.0, help="monitor window, ms (paper: 300)")
    parser.add_argument("--threshold", type=float, default=1.5, help="ratio that selects the throughput plan")
    parser.add_argument("--back-threshold", type=float, default=1.25, help="ratio below which latency comes back")
    parser.add_argument("--min-dwell-ms", type=float, default=300.0, help="least time between switches, ms")
    parser.add_argument("--switch-cost-ms", type=float, default=30.0,
                        help="simulated cost of one plan switch, ms (the Tessera paper cites a ~30 ms stall per switch)")
    parser.add_argument("--search", action="store_true",
                        help="also bisect each policy's highest rate under the SLO between the lowest and highest rate")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, help="directory for serve_bench.json and latency_vs_rate.png")


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--{what}={text!r} must be numbers separated by commas") from None
    if not values:
        raise ConfigError(f"--{what} needs at least one value")
    if any(not v > 0 for v in values):
        raise ConfigError(f"--{what}={text!r}: every value must be positive")
    return values


def build_policies(args: argparse.Namespace, config: ServeConfig) -> tuple[list[Policy], str, dict | None]:
    """The policies to sweep, a line saying where their costs come from, and (real engine) each plan's summary."""
    monitor = MonitorConfig(window_s=args.window_ms / 1e3, threshold=args.threshold,
                            back_threshold=args.back_threshold, min_dwell_s=args.min_dwell_ms / 1e3)
    wanted = [p.strip() for p in args.policies.split(",")] if args.policies else None
    if args.engine == "real":
        names = tuple(wanted or ("homo-L", "homo-R", "pd", "af", "tessera"))
        devices = ",".join(d.strip() for d in args.devices.split(",") if d.strip())
        lengths = ([r.input_tokens for r in load_trace(args.trace)], [r.output_tokens for r in load_trace(args.trace)]) \
            if args.trace else ([args.input_len], [args.output_len])
        settings = EngineSettings(model=args.model, devices=devices, buckets=config.buckets, policies=names,
                                  size=args.size, layers=args.layers, prompt_tokens=max(lengths[0]),
                                  context=max(lengths[0]) + max(lengths[1]), output_tokens=float(args.output_len),
                                  cuda_graphs=False if args.no_cuda_graphs else None)
        model = CompiledModel(settings)  # compiled, profiled and planned once for every policy
        return [Policy(n, (lambda n=n: CompiledEngine(model, n)), monitor if len(plans_of(n)) == 2 else "main")
                for n in names], f"measured on {devices}", model.plan_summaries
    costs, source = (load_policy_costs(args.sim_costs) if args.sim_costs else (default_policy_costs(), DEFAULT_SOURCE))
    unknown = sorted(set(wanted or ()) - set(costs))
    if unknown:
        raise ConfigError(f"--policies {unknown} have no cost figures; known: {sorted(costs)}")
    switch_s = args.switch_cost_ms / 1e3
    policies = [Policy(name, (lambda c=c: SimulatedEngine(c.plans, switch_s)),
                       monitor if c.monitored else next(iter(c.plans)))
                for name, c in costs.items() if wanted is None or name in wanted]
    return policies, source, None


def _rows(points: list[SweepPoint]) -> list[list[object]]:
    return [[p.rate, p.policy, p.summary.throughput_tok_s, p.summary.ttft_p50_s * 1e3, p.summary.ttft_p99_s * 1e3,
             p.summary.tpot_p50_s * 1e3, p.summary.tpot_p99_s * 1e3, p.summary.norm_latency_mean_s * 1e3,
             p.summary.switches, "yes" if p.slo_met else "NO"] for p in points]


def plot(points: list[SweepPoint], slo_ms: float, path: pathlib.Path) -> None:
    """Mean normalized latency and P99 TPOT against rate, one line per policy, with the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(p.policy for p in points):
        mine = [p for p in points if p.policy == name]
        rates = [p.rate for p in mine]
        ax1.plot(rates, [p.summary.norm_latency_mean_s * 1e3 for p in mine], marker="o", label=name)
        ax2.plot(rates, [p.summary.tpot_p99_s * 1e3 for p in mine], marker="o", label=name)
    ax1.axhline(slo_ms, color="grey", linestyle="--", label=f"SLO {slo_ms:g} ms/token")
    ax1.set(xlabel="request rate (req/s)", ylabel="mean normalized latency (ms/token)", yscale="log")
    ax1.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set(xlabel="request rate (req/s)", ylabel="P99 TPOT (ms)")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def missing_gpu_fix(args: argparse.Namespace) -> str:
    """The remedy when --devices names a GPU this machine lacks (only --engine real opens the devices)."""
    return ("--engine real runs the compiled model on the devices it names: run it on a machine with them. On this "
            "one, --devices cpu:0,cpu:1 --size tiny runs it on two CPU virtual devices, and --engine sim (the "
            "default) sweeps the policies' simulated costs without devices.")


def run(args: argparse.Namespace) -> int:
    """Sweep, print the table and the SLO crossings, write JSON and the plot; returns 0."""
    rates = sorted(_floats(args.rates, "rates"))
    config = ServeConfig(buckets=tuple(int(b) for b in _floats(args.buckets, "buckets")),
                         max_prefill_tokens=args.max_prefill_tokens)
    if args.requests < 1:
        raise ConfigError(f"--requests={args.requests} must be >= 1")
    if args.trace:
        trace = load_trace(args.trace)
        requests = make_requests([0.0] * args.requests, [r.input_tokens for r in trace],
                                 [r.output_tokens for r in trace])
    else:
        requests = make_requests([0.0] * args.requests, args.input_len, args.output_len)
    policies, source, plans = build_policies(args, config)
    make_clock = SimClock if args.engine == "sim" else WallClock
    slo_s = args.slo_ms / 1e3
    label = "SIMULATED: " if args.engine == "sim" else ""
    print(f"serve-bench: {label}model {args.model}, engine {args.engine} ({source}), {len(requests)} requests per "
          f"run, SLO {args.slo_ms:g} ms/token")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "serve_bench.partial.jsonl"  # one line per point as it is measured (kept if the run is stopped)
    partial.write_text("")
    from tqdm import tqdm

    bar = tqdm(total=len(rates) * len(policies), desc="serve-bench", unit="run")

    def on_point(p) -> None:
        with partial.open("a") as f:
            f.write(jsonout.dumps({"policy": p.policy, "rate": p.rate, "slo_met": p.slo_met,
                                   **p.summary.to_dict()}) + "\n")
        bar.set_description(f"{p.policy} at {p.rate:g} req/s: {p.summary.norm_latency_mean_s * 1e3:.3g} ms/token")
        bar.update(1)

    points = sweep(policies, requests, rates, seed=args.seed, config=config, slo_s_per_token=slo_s,
                   make_clock=make_clock, on_point=on_point)
    bar.close()
    print(format_table(("req/s", "policy", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
                        "norm ms/tok", "switches", "SLO"), _rows(points)))
    sustained = sustained_rates(points)
    searched = {}
    if args.search and len(rates) > 1:
        for policy in policies:
            try:
                searched[policy.name] = search_max_rate(policy, requests, rates[0], rates[-1], seed=args.seed,
                                                        config=config, slo_s_per_token=slo_s, make_clock=make_clock)
            except ConfigError as exc:  # the crossing is outside the swept range
                searched[policy.name] = None
                log.warning("%s: no bisection: %s", policy.name, exc)
    print("\nHighest swept rate meeting the SLO (req/s)" + (" and bisected crossing" if searched else ""))
    print(format_table(("policy", "swept", *(("bisected",) if searched else ())),
                       [[n, "none" if r is None else r, *((searched.get(n) or "outside range",) if searched else ())]
                        for n, r in sustained.items()]))
    report = {"model": args.model, "engine": args.engine, "cost_source": source, "slo_ms_per_token": args.slo_ms,
              "requests_per_run": len(requests), "seed": args.seed, "buckets": list(config.buckets),
              "points": [{"policy": p.policy, "rate": p.rate, "slo_met": p.slo_met, **p.summary.to_dict()}
                         for p in points],
              "highest_swept_rate": sustained, "bisected_rate": searched,
              "plans": plans}
    (out / "serve_bench.json").write_text(jsonout.dumps(report, indent=1))
    plot(points, args.slo_ms, out / "latency_vs_rate.png")
    partial.unlink(missing_ok=True)  # complete: serve_bench.json holds every point
    print(f"\nwrote {out / 'serve_bench.json'} and {out / 'latency_vs_rate.png'}")
    return 0
