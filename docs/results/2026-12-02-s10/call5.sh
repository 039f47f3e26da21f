#!/usr/bin/env bash
# Session 10, GPU call 5 (one H200, the session's last device time): issue 24 (warm first compile with the codegen
# record, plans from measured costs, GPU tests) and issue 23 (the captured explicit schedule: quick check, cut cost).
T0=$(date +%s); left() { echo $(( ${BUDGET:-550} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
echo "== backend default (warm compile) $(left) s left"
timeout 205 python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8 --warm-layers 8 --repeats 6 --budget-s 200 2>&1 \
  | grep -v "^DEBUG\|attention mask" | tail -5
echo "== captured schedule $(left) s left"
timeout 60 python3 bench/gpu_captured_check.py --out $OUT/check 2>&1 | grep -v "^DEBUG" | tail -14; echo "check rc=$?"
timeout 100 python3 bench/gpu_cut_diagnose.py --out $OUT/diag --devices cuda:0@104sm,cuda:0@24sm --model llama --layers 8 \
  --plans tessera,af --modes captured,eager --rounds 2 --calls 3 --budget-s 75 2>&1 | grep -v "^DEBUG" | tail -30; echo "bench rc=$?"
cat $OUT/diag/cut_diagnose.md 2>/dev/null | head -30
echo "== backend measured $(left) s left"
timeout $(( $(left) - 30 )) python3 bench/gpu_backend_measured.py --out $OUT/bm --budget-s $(( $(left) - 40 )) 2>&1 \
  | grep -v "^DEBUG\|attention mask" | tail -3
head -30 $OUT/bm/backend_measured.md 2>/dev/null; rm -rf $OUT/bm/cache
echo "== GPU tests $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout $(( $(left) - 3 )) python3 -m pytest tests/backend/test_workload.py \
  tests/lowering/test_codegen_record.py tests/runtime/test_captured_replay.py -q -p no:cacheprovider -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -4
