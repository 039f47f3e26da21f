#!/usr/bin/env bash
# Session 9, GPU call 3 (one H200): GPU tests of the new runtime/backend, the simulator's calibration, the cut diagnosis.
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
set -o pipefail
TESSERA_TEST_DEVICE=cuda timeout 230 python3 -m pytest tests/backend tests/runtime tests/target/test_devices_gpu.py -q -rfE \
  -p no:cacheprovider --timeout 200 -o log_level=WARNING 2>&1 | grep -v "^DEBUG" > $OUT/gpu_tests.log; echo "tests rc=$?"
tail -15 $OUT/gpu_tests.log
timeout 80 python3 bench/gpu_pipesched_calibrate.py --out $OUT/cal --devices cuda:0@104sm,cuda:0@24sm 2>&1 | grep -v "^DEBUG" | tail -25
timeout 230 python3 bench/gpu_cut_diagnose.py --out $OUT/diag --model llama --layers 8 --devices cuda:0@104sm,cuda:0@24sm \
  --rounds 3 --calls 5 2>&1 | grep -v "^DEBUG" | tail -30
cat $OUT/diag/cut_diagnose.md 2>/dev/null | head -40
