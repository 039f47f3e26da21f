"""``tessera advise``: which pair of GPUs to rent for a model, SIMULATED.

For every homogeneous and mixed pair of the given catalog GPUs, the model's programs (lowered once, from the program
cache) are costed on the pair by the kernel cost model and planned: request-dist (one replica per GPU) and tessera
(the best predicted plan of a space holding the planner's single placement, one request stream per device and the
baselines planned here, as the bench chooses tessera). Options are ranked by predicted throughput and by throughput
per price; a plot shows throughput against price, one point per option, with the Pareto front (no other option is
both cheaper and faster) marked. A GPU too small for the model marks its options
"does not fit" instead of failing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from torch_tessera.outpaths import DEFAULT_OUT_DIR

HELP = "rank GPU pairs for a model by SIMULATED throughput and throughput per price, with the plan of each"


@dataclass(frozen=True)
class Option:
    """One pair of GPUs for the model.

    Attributes:
        gpus: the two catalog keys.
        fits: whether any plan fits the pair's memory.
        plan: the best plan's name (``"request-dist"``, ``"tessera"``, ``"homo-L"``...), or why it does not fit.
        output_per_s: predicted throughput, the model's unit per second (NaN when it does not fit).
        price_per_hour: the pair's price (target/prices.py units).
        per_price: throughput per price.
    """

    gpus: tuple[str, str]
    fits: bool
    plan: str
    output_per_s: float
    price_per_hour: float
    per_price: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama", help="registry model")
    parser.add_argument("--gpus", default=None, help="catalog GPUs, comma-separated (default: the whole catalog)")
    parser.add_argument("--budget", type=float, default=None, help="highest price per hour of a pair (prices.py units)")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="model size")
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds of MILP per mixed pair")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, help="directory for advise.json and advise_<model>.png")


def parse_gpus(text: str | None) -> list[str]:
    """Catalog keys from ``a100,l40s``; the whole catalog when ``None``.

    Raises:
        DeviceUnavailableError: an unknown GPU (the message lists the catalog).
    """
    from torch_tessera.target.catalog import CATALOG, lookup

    if text is None:
        return list(CATALOG)
    keys = [lookup(t).key for t in text.split(",") if t.strip()]
    return list(dict.fromkeys(keys))


def pair_specs(pair: tuple[str, str], options: str = ""):
    """``sim:<a>`` and ``sim:<b>`` (``options`` such as ``",mem=1GB"`` appended to each); the second of two identical
    GPUs is named ``<name>#2`` so that the pair's cost tables and links tell them apart."""
    import dataclasses

    from torch_tessera.target.devices import parse_device, parse_devices

    a = parse_devices(f"sim:{pair[0]}{options}")[0]
    b = parse_devices(f"sim:{pair[1]}{options}")[0]
    if a.name == b.name:
        b = dataclasses.replace(b, name=f"{b.name}#2")
    return [a, b]


def evaluate(mw, pair: tuple[str, str], time_limit: float, specs=None) -> Option:
    """The best plan of ``mw``'s programs on ``pair`` (costed again, not lowered again).

    Args:
        mw: the model's :class:`~torch_tessera.backend.workload.ModelWorkload`.
        pair: the two catalog keys.
        time_limit: MILP seconds for tessera's plan.
        specs: the two device specs (default ``sim:<key>`` each; a ``mem=`` budget makes a GPU smaller).
    """
    from torch_tessera.benchmark import choose_tessera
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, Plan, plan
    specs = specs or pair_specs(pair)
    price = sum(s.price_per_hour for s in specs)
    local = mw.on_devices(specs)
    plans, reasons = {}, []
    names = ("request-dist", "homo-L", "homo-R") if pair[0] == pair[1] else ("request-dist", "homo-L", "homo-R",
                                                                            "tessera")
    for name in names:
        try:
            plans[name] = plan(local.workload, None, local.topology, policy="throughput" if name == "tessera" else name,
                               time_limit=time_limit)
        except (NotApplicableError, InfeasiblePlanError) as e:
            reasons.append(f"{name}: {str(e).splitlines()[0]}")
    if not plans:
        return Option(pair, False, "does not fit: " + "; ".join(reasons)[:200], math.nan, price, math.nan)
    if "tessera" not in plans:
        best = max(plans, key=lambda n: plans[n].throughput_per_s)
    else:
        plans = choose_tessera(plans, local.workload, local.topology, time_limit=time_limit).plans
        best = "tessera"
    used = [g for g in range(2) if plans[best].kernels_on(g) or g in plans[best].replicas]
    cost = sum(specs[g].price_per_hour for g in used) if isinstance(plans[best], Plan) else price
    out = mw.output_per_step * plans[best].throughput_per_s
    return Option(pair, True, best, out, cost, out / cost if cost else math.nan)


def pareto(options: list[Option]) -> list[Option]:
    """Options no other option beats on both price (lower) and throughput (higher)."""
    ok = [o for o in options if o.fits]
    return [o for o in ok if not any(p.price_per_hour <= o.price_per_hour and p.output_per_s >= o.output_per_s
                                     and (p.price_per_hour, p.output_per_s) != (o.price_per_hour, o.output_per_s)
                                     for p in ok)]


def plot(options: list[Option], front: list[Option], model: str, unit: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [o for o in options if o.fits]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([o.price_per_hour for o in ok], [o.output_per_s for o in ok], color="#4c72b0", s=18,
               label="GPU pair (best plan)")
    f = sorted(front, key=lambda o: o.price_per_hour)
    ax.plot([o.price_per_hour for o in f], [o.output_per_s for o in f], "o-", color="#d62728", label="Pareto front")
    for o in f:
        ax.annotate("+".join(o.gpus), (o.price_per_hour, o.output_per_s), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel("price of the pair (relative $/GPU-hour, L40S = 1.0)")
    ax.set_ylabel(f"predicted throughput ({unit})")
    ax.set_title(f"{model}: GPU pairs, SIMULATED throughput vs price")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from torch_tessera.backend.workload import model_workload
    from torch_tessera.errors import ConfigError
    from torch_tessera.models import get_model
    t0 = time.perf_counter()
    spec = get_model(args.model)
    gpus = parse_gpus(args.gpus)
    pairs = [(a, a) for a in gpus] + list(itertools.combinations(gpus, 2))
    mw = model_workload(args.model, pair_specs((gpus[0], gpus[0])), size=args.size)
    options = [evaluate(mw, p, args.time_limit) for p in tqdm(pairs, desc=f"advise {args.model}", unit="pair")]
    unit = {"tokens": "tok/s", "images": "images/s", "rows": "rows/s"}[spec.output_unit]
    shown = options
    if args.budget is not None:
        shown = [o for o in options if o.price_per_hour <= args.budget]
        if not any(o.fits for o in shown):
            cheapest = min((o for o in options if o.fits), key=lambda o: o.price_per_hour, default=None)
            hint = (f"; the cheapest option that fits is {'+'.join(cheapest.gpus)} at {cheapest.price_per_hour:.3g}/h"
                    if cheapest else "")
            raise ConfigError(f"no GPU pair for {args.model} fits --budget {args.budget:g}/h{hint}")
    ranked = sorted(shown, key=lambda o: (not o.fits, -(o.output_per_s if o.fits else 0)))
    print(f"SIMULATED: GPU pairs for {args.model} ({args.size}), ranked by predicted {unit}")
    print(f"{'pair':22} {unit:>10} {'price/h':>8} {unit + '/price':>14}  plan")
    for o in ranked:
        if not o.fits:
            print(f"{'+'.join(o.gpus):22} {'-':>10} {o.price_per_hour:8.3g} {'-':>14}  {o.plan}")
            continue
        print(f"{'+'.join(o.gpus):22} {o.output_per_s:10,.1f} {o.price_per_hour:8.3g} {o.per_price:14,.1f}  {o.plan}")
    by_price = sorted((o for o in shown if o.fits), key=lambda o: -o.per_price)[:5]
    print("best throughput per price: " + ", ".join(f"{'+'.join(o.gpus)} ({o.per_price:,.1f})" for o in by_price))
    front = pareto(shown)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"advise_{args.model}.png"
    plot(shown, front, args.model, unit, png)
    (out / f"advise_{args.model}.json").write_text(json.dumps(
        {"label": "SIMULATED", "model": args.model, "options": [asdict(o) for o in options],
         "pareto": [list(o.gpus) for o in front]}, indent=1, default=str))
    print(f"wrote {png} and {out / f'advise_{args.model}.json'} in {time.perf_counter() - t0:.0f} s")
    return 0
