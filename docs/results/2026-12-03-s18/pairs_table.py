"""Session 18 (analysis): the README/BENCHMARKS table of `tessera pairs`' pairs.json (SIMULATED).

    python docs/results/2026-12-03-s18/pairs_table.py docs/results/2026-12-03-s18/pairs/pairs.json \
        docs/results/2026-12-03-s18/pairs_mamba/pairs.json
"""
import json, sys

BASE = ("homo-L", "homo-R", "request-dist", "pd", "af", "layer")
d = {"results": [r for path in sys.argv[1:] for r in json.load(open(path))["results"]]}
order = {m: i for i, m in enumerate(("llama", "moe", "qwen2-vl", "mamba", "dit"))}
d["results"].sort(key=lambda r: (["a100", "h100", "b200"].index(r["pair"][0]), order.get(r["model"], 9)))
print("| model | pair | best baseline, ours | tessera, ours (per price unit) | tessera / best baseline: ours, paper (Fig. 6) "
      "| tessera / request-dist: ours, paper | two of the better GPU / two of the cheaper (request-dist; per price unit) |")

print("| --- | --- | --- | --- | --- | --- | --- |")
for r in d["results"]:
    plans = {p["plan"]: p for p in r["plans"]}
    unit = " img/min" if r["unit"].startswith("images") else ""
    fit = [(p["predicted"], n) for n in BASE if (p := plans.get(n)) and p["predicted"]]
    paper_base = [plans[n]["paper"] for n in BASE if plans.get(n) and plans[n]["paper"]]
    t = plans["tessera"]
    best, name = max(fit)
    rd = plans.get("request-dist", {})
    ours_rd = f"{t['predicted'] / rd['predicted']:.2f}x" if rd.get("predicted") else "-"
    paper_rd = f"{t['paper'] / rd['paper']:.2f}x" if t.get("paper") and rd.get("paper") else "-"
    paper_best = f"{t['paper'] / max(paper_base):.2f}x" if t.get("paper") and paper_base else "-"
    twos = [p for n, p in plans.items() if n.startswith("2x ")]
    two = " / ".join(f"{p['predicted']:,.1f} ({p['per_price']:,.1f})" if p["predicted"] else "does not fit"
                     for p in twos)
    model = r["model"] + (f" ({r['prefill_tokens']}-token prefill)" if r.get("prefill_tokens", 1024) != 1024 else "")
    print(f"| {model} | {'+'.join(r['pair'])} | {name} {best:,.1f} | {t['predicted']:,.1f}{unit} ({t['per_price']:,.1f}) | "
          f"{t['predicted'] / best:.2f}x, {paper_best} | {ours_rd}, {paper_rd} | {two} |")
