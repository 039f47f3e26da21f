"""The split-K rule (kernelmodel.library_splits) against cuBLAS's measured choice (analysis, not a tool): every row of
cublas_grids.json (one H200, 132 SMs, torch 2.11+cu130), whether cuBLAS split (a splitK kernel) and whether the rule
splits (in effect: more CTAs than tiles); the rule's CTAs beside the grid of cuBLAS's main kernel. Usage: python rule_vs_cublas.py [--old]."""
import json, math, os, sys
from types import SimpleNamespace
from torch_tessera.target import kernelmodel as km

rows = json.load(open(os.path.join(os.path.dirname(__file__), "cublas_grids.json")))
sms = rows["sms"]
old = "--old" in sys.argv
miss = 0
print(f"{'M':>5} {'K':>6} {'N':>5} {'tiles':>5} cuBLAS rule  CTAs: cuBLAS main / rule   main us")
for r in rows["rows"]:
    f = SimpleNamespace(blocks=r["tiles"], depth=r["K"], flops=2.0 * r["M"] * r["N"] * r["K"])
    splits = (f.blocks * 4 <= sms) if old else km.library_splits(f, sms)  # session 14's rule: SPLIT_K_SHARE = 4
    meas = any("splitK" in k["name"] for k in r["kernels"])
    main = math.prod(r["kernels"][0]["grid"])
    ctas = f.blocks * max(1, min(sms // f.blocks, f.depth // km.SPLIT_K_DEPTH)) if splits else f.blocks
    rule = ctas > f.blocks  # split in effect: more CTAs than tiles (a K of 256-511 gives one part)
    miss += rule != meas
    print(f"{r['M']:5} {r['K']:6} {r['N']:5} {r['tiles']:5} {'split' if meas else '-':>6} {'split' if rule else '-':>5}"
          f"{'  MISS' if rule != meas else '      '} {main:5} / {ctas:4}   {r['kernels'][0]['us']:7.1f}")
print(f"{miss} of {len(rows['rows'])} rows disagree ({'SPLIT_K_SHARE = 4' if old else 'SPLIT_K_BANDS'})")
