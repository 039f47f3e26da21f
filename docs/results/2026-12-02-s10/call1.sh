#!/usr/bin/env bash
# Session 10, GPU call 1 (one H200): the warm-cache first compile (issue 24), and where a warm tessera compile spends its time.
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
B=bench/gpu_backend_default.py
# cold (fills Inductor's and tessera's disk caches), then warm, each a fresh process; only layers 8
timeout 330 python3 $B --out $OUT/bd --layers 8 --warm-layers 8 --budget-s 320 2>&1 | grep -v "^DEBUG" | tail -12
# one more warm tessera child under cProfile (disk caches warm from above)
timeout 120 python3 -m cProfile -o $OUT/warm_tessera.prof $B --out $OUT/bd --one-layers 8 --cases tessera \
  --result $OUT/warm_prof.json --repeats 1 2>&1 | grep -v "^DEBUG" | tail -3
python3 - <<'PY'
import pstats, os
import io
for key, n in (("cumulative", 90), ("tottime", 40)):
    buf = io.StringIO()
    pstats.Stats(os.environ["OUT"] + "/warm_tessera.prof", stream=buf).strip_dirs().sort_stats(key).print_stats(n)
    open(os.environ["OUT"] + f"/warm_profile_{key}.txt", "w").write(buf.getvalue())
print(open(os.environ["OUT"] + "/warm_profile_cumulative.txt").read()[:7000])
PY
