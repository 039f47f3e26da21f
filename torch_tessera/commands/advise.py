"""``tessera advise``: which pair of GPUs to rent for a model, SIMULATED.

For every homogeneous and mixed pair of the given catalog GPUs, the model's programs (lowered once, from the program
cache) are costed on the pair by the kernel cost model and planned with the same placements (:data:`PLANNED`): every
baseline and tessera (the best predicted plan of a space holding the planner's single placement, one request stream
per device and those baselines, as the bench chooses tessera). Options are ranked by predicted throughput and by
throughput per price; a plot shows throughput against price, one point per option, with the Pareto front (no other
option is both cheaper and faster) marked. A pair too small for the model in every placement is marked "does not fit",
with one sentence saying which GPU needs how many GB against how many it has, and the fix.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from torch_tessera import jsonout
from torch_tessera.outpaths import DEFAULT_OUT_DIR

HELP = "rank GPU pairs for a model by SIMULATED throughput and throughput per price, with the plan of each"


@dataclass(frozen=True)
class Option:
    """One pair of GPUs for the model.

    Attributes:
        gpus: the two catalog keys.
        fits: whether any plan fits the pair's memory.
        plan: the best plan's name (``"request-dist"``, ``"tessera"``, ``"tessera (layer's placement)"``...), or
            ``"does not fit"``.
        output_per_s: predicted throughput, the model's unit per second (NaN when it does not fit).
        price_per_hour: the pair's price (target/prices.py units).
        per_price: throughput per price (NaN when it does not fit).
        reason: when it does not fit, the sentence saying which GPU of which placement needs how many GB against how
            many it has, and the fix; else empty.
    """

    gpus: tuple[str, str]
    fits: bool
    plan: str
    output_per_s: float
    price_per_hour: float
    per_price: float
    reason: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama", help="registry model")
    parser.add_argument("--gpus", default=None, help="catalog GPUs, comma-separated (default: the whole catalog)")
    parser.add_argument("--budget", type=float, default=None, help="highest price per hour of a pair (prices.py units)")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="model size")
    parser.add_argument("--decode-batch", type=int, default=None,
                        help="sequences per decode step of an LLM (default: 64; fewer: a smaller KV cache)")
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
    GPUs is named ``<name>#2`` (:func:`~torch_tessera.target.devices.parse_devices`)."""
    from torch_tessera.target.devices import parse_devices

    return parse_devices(f"sim:{pair[0]}{options},sim:{pair[1]}{options}")


#: What advise plans on every pair, identical or mixed: each baseline, then tessera (the best plan of a space holding
#: the planner's single placement, one request stream per device and these baselines' placements). One list for every
#: pair, so two pairs of GPUs with the same memory are judged on the same placements.
PLANNED = ("request-dist", "homo-L", "homo-R", "pd", "af", "layer", "tessera")

#: How each placement advise tries holds the model, for the "does not fit" sentence.
HOLDS = {"request-dist": "a whole copy on each GPU", "homo-L": "the whole model on the first GPU",
         "homo-R": "the whole model on the second GPU", "pd": "a whole copy on each GPU (prefill on one, decode on "
         "the other)", "af": "attention on one GPU, the rest on the other", "layer": "layers split between the GPUs",
         "tessera": "kernels and weights spread over both GPUs as the planner chooses"}


def evaluate(mw, pair: tuple[str, str], time_limit: float, specs=None, model: str = "the model",
             decode_batch: int | None = None) -> Option:
    """The best plan of ``mw``'s programs on ``pair`` (costed again, not lowered again).

    Every pair is planned with the same placements (:data:`PLANNED`), so whether an option fits depends only on its
    GPUs' memory: a pair fits when any of them fits.

    Args:
        mw: the model's :class:`~torch_tessera.backend.workload.ModelWorkload`.
        pair: the two catalog keys.
        time_limit: MILP seconds for tessera's plan.
        specs: the two device specs (default ``sim:<key>`` each; a ``mem=`` budget makes a GPU smaller).
        model: the model's name, for the "does not fit" sentence.
        decode_batch: sequences per decode step ``mw`` was lowered with (prefill/decode models), for the fix.

    Returns:
        The :class:`Option`; when nothing fits, ``fits`` is false, ``output_per_s`` and ``per_price`` are NaN and
        ``reason`` says which GPU of which placement needs how many GB against how many it has, and the fix.
    """
    from torch_tessera.benchmark import choose_tessera
    from torch_tessera.errors import InfeasiblePlanError
    from torch_tessera.scheduler import NotApplicableError, Plan, plan
    specs = specs or pair_specs(pair)
    price = sum(s.price_per_hour for s in specs)
    local = mw.on_devices(specs)
    plans, short = {}, {}
    for name in PLANNED:
        try:
            plans[name] = plan(local.workload, None, local.topology, policy="throughput" if name == "tessera" else name,
                               time_limit=time_limit)
        except NotApplicableError:
            continue
        except InfeasiblePlanError as e:
            short[name] = e
    if not plans:
        return Option(pair, False, "does not fit", math.nan, price, math.nan, does_not_fit(model, specs, short, decode_batch))
    if "tessera" not in plans:
        best = max(plans, key=lambda n: plans[n].throughput_per_s)
        label = best
    else:
        choice = choose_tessera(plans, local.workload, local.topology, time_limit=time_limit)
        plans, best = choice.plans, "tessera"
        label = "tessera" if choice.chosen == "tessera" else (
            "tessera (one request stream per GPU)" if choice.chosen == "streams" else
            f"tessera ({choice.chosen}'s placement)")
    used = [g for g in range(2) if plans[best].kernels_on(g) or g in plans[best].replicas]
    cost = sum(specs[g].price_per_hour for g in used) if isinstance(plans[best], Plan) else price
    if isinstance(plans[best], Plan) and len(used) == 1:  # the best plan leaves one GPU idle: priced without it
        label += f" ({pair[used[0]]} only; {pair[1 - used[0]]} idle, not priced)"
    out = mw.output_per_step * plans[best].throughput_per_s
    return Option(pair, True, label, out, cost, out / cost if cost else math.nan)


def does_not_fit(model: str, specs, errors: dict, decode_batch: int | None = None) -> str:
    """One sentence on why no placement of ``model`` fits the pair ``specs``: the placement that comes closest (least
    memory short in all), each of its GPUs that is short with the GB it needs and has, the other placements tried,
    and the fix.

    Args:
        model: the model's name.
        specs: the pair's two device specs.
        errors: placement name -> the :class:`~torch_tessera.errors.InfeasiblePlanError` it raised.
        decode_batch: sequences per decode step the model was planned with (prefill/decode models), for the fix.
    """
    from torch_tessera.benchmark import gpu_names, shortfall_lines
    from torch_tessera.target.devices import format_bytes

    gpu = gpu_names(specs)
    mem = " and ".join(f"{gpu[s.name]} {format_bytes(s.memory_bytes)}" for s in specs)
    fix = (f", or fewer sequences per decode step (--decode-batch below {decode_batch}: the KV cache shrinks with "
           "it)" if decode_batch and decode_batch > 1 else "")

    def short(n: str) -> float:  # bytes short in all
        return sum(need - have for _, need, have in errors[n].shortfalls if need - have > 1e-3 * have)

    def full(n: str) -> list:  # the GPUs of a placement that are filled to their memory but not short
        return [gpu.get(d, d) for d, need, have in errors[n].shortfalls if 0 <= need - have <= 1e-3 * have]

    head = f"{model} does not fit in this pair's memory ({mem})"
    if not errors:
        return f"{head}: no placement applies. Fix: choose GPUs with more memory{fix}."
    closest = min(errors, key=lambda n: (short(n) or math.inf, n != "tessera"))
    least = errors[closest].lower_bound
    lines = ", and ".join(shortfall_lines(errors[closest], specs))
    if lines and full(closest):
        lines += f", with {' and '.join(full(closest))} filled to its memory"
    others = [n for n in errors if n != closest]
    return (f"{head}: the placement that comes closest, {closest} ({HOLDS.get(closest, closest)}), "
            + (f"cannot hold even one step's activations: {lines}" if least and lines else
               f"still falls short: {lines}" if lines else "does not meet its constraints")
            + (f"; the other placements tried ({', '.join(others)}) fall further short" if others else "")
            + f". Fix: choose GPUs with more memory{fix}.")


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

    from torch_tessera.backend.workload import DECODE_BATCH, model_workload
    from torch_tessera.errors import ConfigError
    from torch_tessera.models import get_model
    t0 = time.perf_counter()
    spec = get_model(args.model)
    gpus = parse_gpus(args.gpus)
    pairs = [(a, a) for a in gpus] + list(itertools.combinations(gpus, 2))
    if args.decode_batch is not None and (args.decode_batch < 1 or not spec.prefill_decode):
        raise ConfigError(f"--decode-batch {args.decode_batch}: " + (
            "give at least 1 sequence per decode step" if spec.prefill_decode else
            f"{args.model} has no decode step; leave --decode-batch out"))
    decode_batch = (args.decode_batch or DECODE_BATCH) if spec.prefill_decode else None
    mw = model_workload(args.model, pair_specs((gpus[0], gpus[0])), size=args.size,
                        **({"decode_batch": decode_batch} if decode_batch else {}))
    options = [evaluate(mw, p, args.time_limit, model=f"{args.model} ({args.size})", decode_batch=decode_batch)
               for p in tqdm(pairs, desc=f"advise {args.model}", unit="pair")]
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
    for o in ranked:
        if not o.fits:
            print(f"{'+'.join(o.gpus)}: {o.reason}")
    by_price = sorted((o for o in shown if o.fits), key=lambda o: -o.per_price)[:5]
    print("best throughput per price: " + (", ".join(f"{'+'.join(o.gpus)} ({o.per_price:,.1f})" for o in by_price)
                                            or "none (no option fits)"))
    front = pareto(shown)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"advise_{args.model}.png"
    plot(shown, front, args.model, unit, png)
    (out / f"advise_{args.model}.json").write_text(jsonout.dumps(
        {"label": "SIMULATED", "model": args.model, "options": [asdict(o) for o in options],
         "pareto": [list(o.gpus) for o in front]}, indent=1, default=str))
    print(f"wrote {png} and {out / f'advise_{args.model}.json'} in {time.perf_counter() - t0:.0f} s")
    return 0
