"""``tessera pairs``: the paper's three GPU pairs (Fig. 6) for the registry's LLM, MoE, SSM, VLM and diffusion models,
SIMULATED: predicted throughput of every baseline and tessera beside the paper's value, and beside each pair two of its
better GPU and two of its cheaper GPU (request-dist over two identical GPUs: twice one GPU's throughput), with price
and throughput per price.

Tessera is planned over a space that contains every baseline's placement, request streams included
(:func:`torch_tessera.benchmark.simulate_plans`, as ``tessera bench``), so no tessera prediction is below a baseline.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from torch_tessera import jsonout
from torch_tessera.outpaths import DEFAULT_OUT_DIR

HELP = "SIMULATED throughput of every baseline and tessera on the paper's three GPU pairs, the paper's Fig. 6 beside"

PAIRS = (("a100", "l40s"), ("h100", "rtxpro6000"), ("b200", "h100"))
#: registry model -> the paper's Fig. 6 row (LM Llama-3.1-8B, GT GPT-oss-20B, QW Qwen2.5-VL-7B, MB Mamba-Codestral,
#: SD SD3.5 in images/min); reference/tessera_paper.md §10.1.
PAPER_ROW = {"llama": "LM", "moe": "GT", "qwen2-vl": "QW", "mamba": "MB", "dit": "SD"}
#: The plans of Fig. 6, in its column order.
PAPER_PLANS = ("homo-L", "homo-R", "request-dist", "pd", "af", "tessera")
#: The rows printed: every baseline (layer has no Fig. 6 column), then tessera.
PLANS = ("homo-L", "homo-R", "request-dist", "pd", "af", "layer", "tessera")
#: Fig. 6 values: pair -> row -> :data:`PAPER_PLANS` -> tok/s (SD: images/min); None where the paper marks the
#: baseline ✗.
FIG6 = {
    ("a100", "l40s"): {"LM": (1288.3, 893.63, 1854.64, 2064.82, 2246.26, 2525.38),
                       "GT": (1243.96, 1016.33, 2052.0, 2050.11, 2204.27, 2641.4),
                       "QW": (719.58, 555.61, 1083.91, 968.57, 1133.23, 1479.54),
                       "MB": (943.08, 628.16, 1064.08, 1120.08, None, 1675.34),
                       "SD": (25.8, 25.2, 43.35, None, None, 54.89)},
    ("h100", "rtxpro6000"): {"LM": (2076.04, 1664.63, 3179.57, 2908.36, 3106.82, 4291.63),
                             "GT": (2005.72, 1874.07, 2937.23, 3091.82, 3156.56, 4389.46),
                             "QW": (1198.81, 1042.33, 1904.97, 1657.17, 1778.17, 2635.37),
                             "MB": (1232.77, 814.08, 1586.43, 1669.93, None, 3881.48),
                             "SD": (44.4, 39.6, 71.4, None, None, 87.9)},
    ("b200", "h100"): {"LM": (5637.41, 2076.04, 6556.43, 6991.36, 7234.33, 9188.98),
                       "GT": (4947.16, 2005.72, 5094.87, 5363.02, 5602.81, 7272.33),
                       "QW": (3496.15, 1315.67, 4090.05, 3696.54, 3850.77, 6502.84),
                       "MB": (2634.09, 1232.77, 2680.41, 2821.48, None, 3950.66),
                       "SD": (70.2, 44.4, 97.41, None, None, 108.6)},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=",".join(PAPER_ROW), help="registry models, comma-separated")
    parser.add_argument("--pairs", default=",".join(f"{a}+{b}" for a, b in PAIRS),
                        help="GPU pairs as A+B, comma-separated (catalog keys)")
    parser.add_argument("--prefill-tokens", type=int, default=1024,
                        help="prompt tokens of every model's prefill (the registry's workload: 1024); an SSM's "
                             "full-size prefill unrolls its scan over each, so --models mamba --prefill-tokens 32 "
                             "plans it in minutes")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR, help="directory for pairs.json")


def _fmt(x) -> str:
    return "-" if x is None or x != x else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}")


def pair_rows(model: str, pair: tuple[str, str], prefill_tokens: int = 1024) -> dict:
    """Predicted rows of one (model, pair): every plan, two of each GPU, prices, the paper's values; its prefill
    over ``prefill_tokens`` prompt tokens."""
    from torch_tessera.benchmark import simulate_plans
    from torch_tessera.models import get_model
    from torch_tessera.target.devices import parse_devices

    specs = parse_devices(f"sim:{pair[0]},sim:{pair[1]}")
    rows, meta = simulate_plans(model, specs, prefill_tokens=prefill_tokens)
    per_min = 60.0 if get_model(model).output_unit == "images" else 1.0  # the paper's SD figures are images/min
    by = {r.plan: r for r in rows}
    paper = dict(zip(PAPER_PLANS, FIG6.get(pair, {}).get(PAPER_ROW.get(model, ""), (None,) * len(PAPER_PLANS))))
    out = {"model": model, "pair": list(pair), "unit": "images/min" if per_min == 60 else "tok/s", "plans": [],
           "note": meta["tessera_choice"], "prefill_tokens": prefill_tokens}
    for name in PLANS:
        ref = paper.get(name)
        r = by.get(name)
        ok = r is not None and r.applies
        out["plans"].append({"plan": name, "predicted": r.output_per_s * per_min if ok else None,
                             "price_per_hour": r.price_per_hour if ok else None,
                             "per_price": r.output_per_s_per_price * per_min if ok else None,
                             "paper": ref, "reason": "" if ok else (r.reason if r else "not planned")})
    for side, name in ((0, "homo-L"), (1, "homo-R")):
        r = by.get(name)
        label = f"2x {pair[side]} (request-dist)"
        if r is not None and r.applies:
            price = 2 * specs[side].price_per_hour
            out["plans"].append({"plan": label, "predicted": 2 * r.output_per_s * per_min,
                                 "price_per_hour": price, "per_price": 2 * r.output_per_s * per_min / price,
                                 "paper": None, "reason": ""})
        else:  # a replica per GPU needs what the whole model on one of them needs: the same reason holds
            out["plans"].append({"plan": label, "predicted": None, "price_per_hour": None, "per_price": None,
                                 "paper": None, "reason": f"as {name}: {r.reason}" if r else "not planned"})
    return out


def format_pair(res: dict) -> str:
    prompt = res.get("prefill_tokens", 1024)
    prompt = f", {prompt}-token prefill (the paper's workload differs: compare ratios)" if prompt != 1024 else ""
    lines = [f"SIMULATED {res['model']} on {res['pair'][0]} + {res['pair'][1]} ({res['unit']}{prompt}; paper: Fig. 6)",
             f"  {'plan':26} {'predicted':>10} {'paper':>9} {'pred/paper':>10} {'price/h':>8} {'per price':>10}"
             "   (price: relative units per GPU-hour, the paper artifact's; L40S = 1)"]
    for p in res["plans"]:
        ratio = p["predicted"] / p["paper"] if p["predicted"] and p["paper"] else None
        lines.append(f"  {p['plan']:26} {_fmt(p['predicted']):>10} {_fmt(p['paper']):>9} {_fmt(ratio):>10} "
                     f"{_fmt(p['price_per_hour']):>8} {_fmt(p['per_price']):>10}" +
                     (f"  n/a: {p['reason']}" if p["reason"] else ""))
    plans = {p["plan"]: p for p in res["plans"]}
    t = plans.get("tessera", {}).get("predicted")
    base = [p["predicted"] for n, p in plans.items() if n in PLANS[:-1] and p["predicted"]]
    if t and base:
        lines.append(f"  tessera / best baseline: {t / max(base):.2f}x SIMULATED")
    if res.get("note"):
        lines.append(f"  {res['note']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from torch_tessera.errors import ConfigError, LoweringError
    from torch_tessera.models import get_model
    from torch_tessera.target.catalog import lookup

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        get_model(m)
    pairs = []
    for text in args.pairs.split(","):
        parts = text.strip().split("+")
        if len(parts) != 2:
            raise ConfigError(f"--pairs: {text!r} is not A+B (e.g. a100+l40s)")
        pairs.append(tuple(lookup(p).key for p in parts))
    results, failed = [], []
    if args.prefill_tokens < 1:
        raise ConfigError(f"--prefill-tokens must be at least 1 (got {args.prefill_tokens})")
    slow = [m for m in models if get_model(m).family == "ssm"]
    # the first pair lowers each model once (cached after); an SSM's long prefill is the slow one
    if slow and args.prefill_tokens > 32:
        others = ",".join(m for m in models if m not in slow) or "llama"
        print(f"note: {', '.join(slow)} (SSM): the full-size prefill unrolls its scan over every prompt token in "
              "every layer; with empty lowering caches that takes far longer than the other models (more than 20 "
              f"minutes on a 2-core CPU). To leave it out: --models {others}; to plan it in minutes: --models "
              f"{','.join(slow)} --prefill-tokens 32", file=sys.stderr, flush=True)
    for pair in pairs:
        for m in models:
            try:
                res = pair_rows(m, pair, args.prefill_tokens)
            except (LoweringError, ConfigError) as e:  # a model that cannot be lowered (or not at this prompt
                # length) does not cost the others their rows
                first = str(e).splitlines()[0]
                failed.append(m)
                results.append({"model": m, "pair": list(pair), "error": str(e)})
                print(f"{m} on {'+'.join(pair)}: not planned: {first}", file=sys.stderr, flush=True)
                continue
            results.append(res)
            print(format_pair(res), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pairs.json").write_text(jsonout.dumps({"label": "SIMULATED", "results": results}, indent=1))
    print(f"wrote {out / 'pairs.json'} (SIMULATED)")
    if failed:
        print(f"tessera pairs: {len(failed)} of {len(results)} rows not planned ({', '.join(sorted(set(failed)))}: "
              "the reason is above and in pairs.json)", file=sys.stderr)
        return 1
    return 0
