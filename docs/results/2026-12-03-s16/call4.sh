#!/usr/bin/env bash
# Session 16, GPU call 4 (one H200): the GPU tests of the final code (the backend after the ux and advise merges,
# the captured replay), then partfit4's cuBLAS layout probe with the time left (issue 21 data).
T0=$(date +%s); left() { echo $(( ${CALL_BUDGET:-460} - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
W=/tmp/call4; mkdir -p $W
git log --oneline 2>/dev/null | head -1
echo "== tests/backend $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 390 python3 -m pytest -q -p no:cacheprovider -o log_level=WARNING -rs tests/backend \
  > $W/gpu_tests_backend.log 2>&1; echo "pytest rc=$?"; grep -v "^DEBUG\|^SKIPPED" $W/gpu_tests_backend.log | tail -4
echo "== captured replay $(left) s left"
TESSERA_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/runtime/test_captured_replay.py \
  > $W/gpu_tests_captured.log 2>&1; echo "pytest rc=$?"; tail -2 $W/gpu_tests_captured.log
echo "== cublas layouts $(left) s left"
timeout $(( $(left) - 15 )) python3 docs/results/2026-12-03-s16-partfit4/cublas_layouts.py --out $W/layouts \
  > $W/cublas_layouts.log 2>&1; echo "layouts rc=$?"; tail -3 $W/cublas_layouts.log
tar czf $OUT/call4.tgz -C $W .
echo "== end $(left) s left"
