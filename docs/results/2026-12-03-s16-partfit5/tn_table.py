"""Print MEASURED_TN_GRIDS (torch_tessera/target/library_grid.py) from the lead's layouts run: the main nvjet kernel
of every `tn` row on 132 SMs, its CTAs, its tile oriented to (output columns N, output rows M), and its split count."""
import json, math, re, sys
d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "docs/results/2026-12-03-s16/call4/layouts/cublas_layouts.json"))
seen = {}
for r in d["rows"]:
    if r["layout"] != "tn" or r["sms"] != 132:
        continue
    k = [x for x in r["kernels"] if x["name"].startswith("nvjet")][0]
    a, b = map(int, re.search(r"_tst_(\d+)x(\d+)_", k["name"]).group(1, 2))
    # ..._TNT: a tile of a columns x b rows; ..._TNN: the swapped product, a rows of C^T (= columns of C) x b
    tn_, tm_ = (a, b)
    M, K, N = r["M"], r["K"], r["N"]
    ctas = math.prod(k["grid"])
    pieces = math.ceil(N / tn_) * math.ceil(M / tm_)
    splits = max(1, round(ctas / pieces))
    seen[(M, K, N)] = (ctas, tn_, tm_, splits)
for key, v in sorted(seen.items()):
    print(f"    {key}: {v},")
