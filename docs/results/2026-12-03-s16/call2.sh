#!/usr/bin/env bash
# Session 16, GPU call 2 (one H200): issue 23's cut diagnosis for Mamba (tessera, homo-L, request-dist) and Llama
# (tessera, af, homo-L, request-dist), 8 layers on cuda:0@104sm,cuda:0@24sm, after a4e4874 (a captured replay over
# one GPU returns at once; executed timed back to back and each call synchronized). Call 1 ran out of per-model
# budget for Llama and lost Mamba's files (at most 8 files come back): everything goes into one tarball here.
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-570} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
W=/tmp/call2; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
run_model() {  # model plans seconds
  echo "== $1 $(left) s left"
  timeout $3 python3 bench/gpu_cut_diagnose.py --out $W/cd_$1 --devices cuda:0@104sm,cuda:0@24sm --model $1 \
    --layers 8 --plans $2 --modes captured,no-wait,alone --no-eager --rounds 2 --calls 3 --min-timed-s 0.3 \
    --cost-repeats 5 --budget-s $(( $3 - 15 )) > $W/cd_$1.out 2>&1
  echo "$1 rc=$?"
  grep "^| \(tessera\|af\|homo-L\|request-dist\) |\|host work outside" $W/cd_$1/cut_diagnose.md 2>/dev/null
}
run_model mamba tessera,homo-L,request-dist 170
run_model llama tessera,af,homo-L,request-dist $(( $(left) - 25 ))
tar czf $OUT/call2.tgz -C $W .
echo "== end $(left) s left"
