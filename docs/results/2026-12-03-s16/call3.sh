#!/usr/bin/env bash
# Session 16, GPU call 3 (one H200): issue 23's steady-state cost of a cut edge. Llama (8 layers) af (156 cut edges)
# and homo-L on cuda:0@104sm,cuda:0@24sm at 2, 4 and 8 micro-batches: the lost time per step against the slower
# partition alone grows with the micro-batches by the steady-state cost of the cuts; the fill and drain stay.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-540} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
W=/tmp/call3; mkdir -p $W
git log --oneline 2>/dev/null | head -1
for M in 2 4 8; do
  echo "== M=$M $(left) s left"
  timeout $(( $(left) - 20 )) python3 bench/gpu_cut_diagnose.py --out $W/m$M --devices cuda:0@104sm,cuda:0@24sm \
    --model llama --layers 8 --plans af,homo-L --modes captured,no-wait,alone --no-eager --rounds 2 --calls 3 \
    --min-timed-s 0.3 --cost-repeats 3 --micro-batches $M --budget-s 150 > $W/m$M.out 2>&1
  echo "M=$M rc=$?"
  grep "^| \(af\|homo-L\) |" $W/m$M/cut_diagnose.md 2>/dev/null | head -4
done
tar czf $OUT/call3.tgz -C $W .
echo "== end $(left) s left"
