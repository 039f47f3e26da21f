#!/usr/bin/env bash
# Session 10, GPU call 4 (one H200): issue 24 - warm first compile with the codegen record, plans from measured costs, GPU tests.
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
timeout 230 python3 bench/gpu_backend_default.py --out $OUT/bd --layers 8 --warm-layers 8 --repeats 2 --budget-s 200 2>&1 \
  | grep -v "^DEBUG\|attention mask" | tail -6
timeout 230 python3 bench/gpu_backend_measured.py --out $OUT/bm --budget-s 200 2>&1 | grep -v "^DEBUG\|attention mask" | tail -4
cat $OUT/bm/backend_measured.md 2>/dev/null | head -40
rm -rf $OUT/bm/cache
TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest tests/backend/test_workload.py tests/backend/test_measured_costs.py \
  tests/lowering/test_codegen_record.py -q -p no:cacheprovider -o log_level=WARNING 2>&1 | grep -v "^DEBUG" | tail -6
